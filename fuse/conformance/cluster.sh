# shellcheck shell=bash
# Sourced by the conformance scripts (pjdfstest.sh, fsx.sh): a fresh local
# 3-node cluster (`memfs up`) in a temporary directory and a mount of it,
# torn down on exit, and the mount log's verdict. Never sourced by the
# tests: these scripts run third-party suites built outside the repository.
#
# The caller sets BIN (the memfs binary) and calls conf_init NAME, then
# conf_up, then conf_mount DIR [flags...] once per mount (each logs to
# DIR.log). Environment: BINDING (default
# gofuse), MOUNT_FLAGS, UP_FLAGS (e.g. "--ephemeral": Raft state in memory,
# no fsync, for runs that test the mount's semantics and not durability),
# BASE_PORT (default random), KEEP=1 (leave the temporary directory:
# cluster data, the mounts' logs).

conf_init() { # name: makes $work and $mnt, sets MEMFS_CLUSTER, traps exit
  BINDING=${BINDING:-gofuse}
  base=${BASE_PORT:-$((20000 + RANDOM % 20000))}
  work=$(mktemp -d "/tmp/memfs-$1-XXXXXX")
  mnt=$work/mnt
  export MEMFS_CLUSTER="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"
  up=
  mounts=() mountpids=() mountlogs=()
  trap conf_cleanup EXIT
  trap 'exit 130' INT TERM
}

# conf_unmount unmounts every mount and waits for their processes to
# end: a buffering mount commits what it still holds on its way out, so
# the cluster must outlive it, and its log is complete only then.
conf_unmount() {
  local m p
  for m in "${mounts[@]}"; do
    fusermount3 -u "$m" 2>/dev/null || { sleep 1; fusermount3 -u "$m" 2>/dev/null; } || fusermount3 -uz "$m" 2>/dev/null
  done
  mounts=()
  for p in "${mountpids[@]}"; do
    for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  mountpids=()
}

conf_cleanup() {
  set +e
  cd /
  conf_unmount
  if [ -n "$up" ]; then kill "$up" 2>/dev/null; wait "$up" 2>/dev/null; fi
  if [ "${KEEP:-}" = 1 ]; then
    echo "kept $work" >&2
  else
    rm -rf "$work"
  fi
}

conf_up() { # starts the cluster and waits until it serves
  # shellcheck disable=SC2086 # UP_FLAGS is a list of flags
  "$BIN" up --nodes 3 --dir "$work/cluster" --base-port "$base" ${UP_FLAGS:-} >"$work/up.log" 2>&1 &
  up=$!
  for _ in $(seq 600); do grep -q "is up" "$work/up.log" && break; sleep 0.1; done
  grep -q "is up" "$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
  # The cluster speaks TLS with the certificates `up` made (its printed
  # export line); every command and mount needs them.
  eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$work/up.log" | head -1)"
}

conf_mount() { # dir [flags...]: mounts the cluster on dir with BINDING and MOUNT_FLAGS
  local dir=$1 out
  shift
  mkdir -p "$dir"
  # shellcheck disable=SC2086 # MOUNT_FLAGS is a list of flags
  out=$("$BIN" mount --daemon --binding "$BINDING" ${MOUNT_FLAGS:-} "$@" --log "$dir.log" "$dir")
  mounts+=("$dir")
  mountlogs+=("$dir.log")
  mountpids+=("$(sed -n 's/.*(pid \([0-9]*\)).*/\1/p' <<<"$out")")
}

# conf_mount_verdict prints the mount log's panics and the buffered
# operations lost at commit, and sets lost to their count: a buffering
# mount answers before the cluster commits, and a suite sees only its
# answers, so an operation the cluster then refused shows up only here.
conf_mount_verdict() {
  local logs=("${mountlogs[@]}")
  if grep -qi 'panic' "${logs[@]}" 2>/dev/null; then
    echo "a mount log has panics:"
    grep -i -A5 'panic' "${logs[@]}" | head -40
  fi
  lost=$(cat "${logs[@]}" 2>/dev/null | grep -c 'lost at commit' || true)
  lost=${lost:-0}
  if [ "$lost" -gt 0 ]; then
    echo "the mount logs have $lost buffered operations lost at commit:"
    grep 'lost at commit' "${logs[@]}" | head -20
  fi
}
