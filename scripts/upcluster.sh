# shellcheck shell=bash
# Sourced by the benchmark scripts that compare rounds on fresh local
# clusters (benchrounds.sh, tlscost.sh): a temporary directory torn down on
# exit, the memfs binary, and one `memfs up` at a time with the node
# processes' CPU time and page faults.
#
# The caller calls up_init (sets tmp, BIN, base, cluster), then up_start
# [memfs up flags...] and up_stop once per round. BIN (default: built into
# the temporary directory) is the memfs binary; BASE_PORT (default: the
# caller's $1) the cluster's ports.

up_init() { # default-base-port
  tmp=$(mktemp -d /tmp/memfs-rounds-XXXXXX)
  up=
  trap up_cleanup EXIT
  BIN=${BIN:-$tmp/memfs}
  [ -x "$BIN" ] || CGO_ENABLED=0 go build -trimpath -o "$BIN" ./cmd/memfs
  base=${BASE_PORT:-$1}
  cluster="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"
}

up_cleanup() {
  [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null
  rm -rf "$tmp"
}

# up_start starts a fresh 3-node cluster and sets pids to its nodes. The
# cluster speaks TLS with the certificates `up` made (its printed export
# line) unless --insecure is given; every command needs them.
up_start() {
  rm -rf "$tmp/data"
  "$BIN" up --nodes 3 --dir "$tmp/data" --base-port "$base" "$@" >"$tmp/up.log" 2>&1 &
  up=$!
  for _ in $(seq 300); do grep -q "is up" "$tmp/up.log" && break; sleep 0.1; done
  grep -q "is up" "$tmp/up.log" || { cat "$tmp/up.log"; exit 1; }
  unset MEMFS_CA MEMFS_CERT MEMFS_KEY
  eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$tmp/up.log" | head -1)"
  pids=$(pgrep -P "$up" | tr '\n' ' ')
}

up_stop() {
  kill "$up"; wait "$up" 2>/dev/null || true
  up=
}

# nodecpu PIDS: user + system time of the processes, in clock ticks.
nodecpu() { local s=0 p; for p in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$s"; }
# nodefaults PIDS: minor page faults of the processes (docs/benchmarks.md,
# "Page faults and huge pages": on some machines they are most of the cost).
nodefaults() { local s=0 p; for p in "$@"; do s=$((s + $(awk '{print $10}' "/proc/$p/stat"))); done; echo "$s"; }
# ms TICKS: clock ticks in milliseconds.
ms() { echo $(( $1 * 1000 / $(getconf CLK_TCK) )); }
