#!/usr/bin/env bash
# FUSE figures for docs/benchmarks.md in one run: the same fio jobs and tar
# extract on
#
#   tmpfs           a tmpfs directory itself (the limit),
#   passthrough_ll  libfuse3's passthrough_ll example over tmpfs (C, libfuse3),
#   bindfs          bindfs over tmpfs (libfuse2),
#   gofuse          go-fuse's loopback over tmpfs (fuse/bench/gofuse),
#   gofuse_pt       the same with FUSE passthrough (the kernel does the I/O),
#   memfs           a MemoryFS mount of a fresh local 3-node cluster,
#   memfs_nocache   a second mount of it with --data-cache 0: every read
#                   the kernel does not answer itself goes to the cluster,
#   memfs_gofuse    a mount of it served by the go-fuse binding
#                   (--binding gofuse) instead of bazil.org/fuse,
#
# and `memfs bench` (the client library) against the same cluster, then the
# delay until a change made through the client is seen through the mount
# (fuse/bench/invaldelay). Ends with a markdown table.
#
#   fuse/bench/fio.sh [memfs-binary]
#
# Run it as root from the repository root (it mounts a tmpfs and FUSE file
# systems); needs fio, fusermount3, bindfs, gcc, pkg-config and libfuse3-dev
# (for passthrough_ll), go and jq.
#
# Environment: SIZE (default 256M) of the file the sequential and random
# jobs share; RUNTIME (default 15) caps each random job in seconds; FILES
# (default 2000) for the create jobs; JOBS (default 8) for the parallel
# create job; TARFILES (default 10000) files in the tar; CHANGES (default
# 300) for the invalidation delay; LOG_STORE (default bolt); BASE_PORT
# (default random) for the cluster; WORK (default a new /tmp/memfs-fio-*)
# holds the mounts; ONLY (e.g. "tmpfs memfs") limits the targets; PHASES
# (default "fio tar") the jobs run on each; MOUNT_FLAGS (e.g.
# "--huge-pages=false") goes to every memfs mount; KEEP=1 leaves the work dir.
set -euo pipefail
BIN=${1:-$(command -v memfs || true)}
[ -x "$BIN" ] || { echo "usage: $0 path/to/memfs" >&2; exit 2; }
BIN=$(realpath "$BIN")
SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-15}
FILES=${FILES:-2000}
JOBS=${JOBS:-8}
TARFILES=${TARFILES:-10000}
CHANGES=${CHANGES:-300}
LOG_STORE=${LOG_STORE:-bolt}
ONLY=${ONLY:-tmpfs passthrough_ll bindfs gofuse gofuse_pt memfs memfs_gofuse memfs_nocache client}
PHASES=${PHASES:-fio tar}
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "${WORK:-}" ]; then mkdir -p "$WORK"; work=$(mktemp -d "$WORK/run-XXXXXX"); else work=$(mktemp -d /tmp/memfs-fio-XXXXXX); fi
base=${BASE_PORT:-$((20000 + RANDOM % 20000))}
cluster="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"
tmpfs=$work/tmpfs
mkdir -p "$tmpfs" "$work/bin"
want() { [[ " $ONLY " == *" $1 "* ]]; }

mounts=() pids=()
cleanup() {
  set +e
  for m in "${mounts[@]}"; do
    fusermount3 -u "$m" 2>/dev/null || fusermount -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
  done
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  mountpoint -q "$tmpfs" && umount "$tmpfs"
  [ "${KEEP:-}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

# One tmpfs under every baseline, each in its own directory.
mount -t tmpfs -o size=8G,mode=0755 memfs-fio "$tmpfs"

waitmount() { # dir
  for _ in $(seq 300); do mountpoint -q "$1" && return 0; sleep 0.1; done
  echo "no mount on $1" >&2; return 1
}

# The tar: TARFILES files of 1-8 KiB in directories of 100, built once on
# tmpfs.
mktar() {
  local src=$tmpfs/tarsrc d
  mkdir -p "$src"
  for ((d = 0; d < TARFILES / 100; d++)); do
    mkdir "$src/d$d"
    head -c $((100 * 4608)) /dev/urandom | (cd "$src/d$d" && split -a 2 -d -b 4608 - f)
  done
  tar -C "$src" -cf "$tmpfs/tree.tar" .
  rm -rf "$src"
}

# fio's terse v3 output: field 7 is read KiB/s, 8 read IOPS, 48 write KiB/s,
# 49 write IOPS. The filecreate engine counts each create as a read.
declare -A R
fiojob() { # key dir fio-args...
  local key=$1 dir=$2; shift 2
  fio --name=bench --directory="$dir" --output-format=terse --terse-version=3 --group_reporting "$@" >"$work/fio.out"
  R[$key]=$(awk -F';' '{printf "%s %s %s %s", $7, $8, $48, $49}' "$work/fio.out")
}
field() { echo "${R[$1]:-}" | awk -v f="$2" '{print $f + 0}'; }

run_all() { # label dir
  local label=$1 dir=$2 t0 t1
  echo "# $label: $(uptime | sed 's/.*load/load/')" >&2
  if [[ " $PHASES " == *" fio "* ]]; then
  # All four jobs use one file, so the cluster holds SIZE, not 4 x SIZE.
  # fio drops the file's cached pages before each job (invalidate=1).
  fiojob "$label.sw" "$dir" --filename=bench.dat --rw=write --bs=1M --size="$SIZE" --end_fsync=1 --ioengine=psync
  fiojob "$label.sr" "$dir" --filename=bench.dat --rw=read --bs=1M --size="$SIZE" --ioengine=psync
  # Each 4 KiB block at most once (fio's random map), capped at RUNTIME.
  fiojob "$label.rr" "$dir" --filename=bench.dat --rw=randread --bs=4k --size="$SIZE" --runtime="$RUNTIME" --ioengine=psync
  fiojob "$label.rw" "$dir" --filename=bench.dat --rw=randwrite --bs=4k --size="$SIZE" --runtime="$RUNTIME" --ioengine=psync --end_fsync=1
  rm -f "$dir/bench.dat"
  mkdir "$dir/c1" "$dir/cn"
  fiojob "$label.c1" "$dir/c1" --ioengine=filecreate --nrfiles="$FILES" --filesize=4k --bs=4k --openfiles=1 --create_on_open=1
  fiojob "$label.cn" "$dir/cn" --ioengine=filecreate --nrfiles=$((FILES / JOBS)) --numjobs="$JOBS" --filesize=4k --bs=4k --openfiles=1 --create_on_open=1
  rm -rf "$dir/c1" "$dir/cn"
  fi
  R[$label.tar]=-
  if [[ " $PHASES " == *" tar "* ]]; then
  mkdir "$dir/tar"
  t0=$(date +%s.%N)
  tar -C "$dir/tar" -xf "$tmpfs/tree.tar"
  t1=$(date +%s.%N)
  R[$label.tar]=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')
  rm -rf "$dir/tar"
  fi
  row "$label" >&2 # progress, in case a later target fails
}

row() { # label
  local l=$1
  if [ -z "${R[$l.sw]:-}" ]; then
    printf '| %s | - | - | - | - | - | - | %s |\n' "$l" "${R[$l.tar]}"
    return
  fi
  printf '| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %s |\n' "$l" \
    "$(awk -v k="$(field "$l.sw" 3)" 'BEGIN{print k/1024}')" \
    "$(awk -v k="$(field "$l.sr" 1)" 'BEGIN{print k/1024}')" \
    "$(field "$l.rr" 2)" "$(field "$l.rw" 4)" "$(field "$l.c1" 2)" "$(field "$l.cn" 2)" "${R[$l.tar]}"
}

echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) cores, SIZE=$SIZE RUNTIME=${RUNTIME}s FILES=$FILES JOBS=$JOBS TARFILES=$TARFILES log-store=$LOG_STORE phases=$PHASES" >&2
mktar
labels=()

if want tmpfs; then
  mkdir "$tmpfs/raw"
  run_all tmpfs "$tmpfs/raw"; labels+=(tmpfs)
fi

if want passthrough_ll; then
  ex=${LIBFUSE_EXAMPLES:-/usr/share/doc/libfuse3-dev/examples}
  gcc -O2 -Wall -o "$work/bin/passthrough_ll" "$ex/passthrough_ll.c" $(pkg-config fuse3 --cflags --libs)
  mkdir "$tmpfs/pt" "$work/pt"
  # The example's defaults: cache=auto (1 s timeouts), no writeback cache.
  "$work/bin/passthrough_ll" -f -o source="$tmpfs/pt" "$work/pt" 2>"$work/pt.log" &
  pids+=($!); mounts+=("$work/pt"); waitmount "$work/pt"
  run_all passthrough_ll "$work/pt"; labels+=(passthrough_ll)
fi

if want bindfs; then
  mkdir "$tmpfs/bind" "$work/bind"
  bindfs "$tmpfs/bind" "$work/bind"
  mounts+=("$work/bind"); waitmount "$work/bind"
  run_all bindfs "$work/bind"; labels+=(bindfs)
fi

if want gofuse || want gofuse_pt; then
  (cd "$repo/fuse/bench/gofuse" && go build -o "$work/bin/gofuse-loopback" .)
fi
# gofuse: every read and write goes through the Go process (the binding's
# cost); gofuse_pt: go-fuse hands the kernel the backing file (FUSE
# passthrough, Linux 6.9+ and root), so data never reaches the process.
for g in gofuse gofuse_pt; do
  want $g || continue
  mkdir "$tmpfs/$g" "$work/$g"
  "$work/bin/gofuse-loopback" $([ $g = gofuse_pt ] && echo -passthrough) "$tmpfs/$g" "$work/$g" 2>"$work/$g.log" &
  pids+=($!); mounts+=("$work/$g"); waitmount "$work/$g"
  run_all $g "$work/$g"; labels+=($g)
done

if want memfs || want memfs_gofuse || want memfs_nocache || want client; then
  "$BIN" up --nodes 3 --dir "$work/data" --base-port "$base" --log-store "$LOG_STORE" >"$work/up.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do grep -q "is up" "$work/up.log" && break; sleep 0.1; done
  grep -q "is up" "$work/up.log" || { cat "$work/up.log" "$work"/data/node*.log 2>/dev/null | tail -50; exit 1; }
  # The cluster speaks TLS with the certificates `up` made (its printed
  # export line); every command and mount needs them.
  eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$work/up.log" | head -1)"
fi

if want memfs; then
  mkdir "$work/mnt"
  "$BIN" --cluster "$cluster" mount --daemon ${MOUNT_FLAGS:-} --binding bazil --log "$work/mount.log" "$work/mnt" >/dev/null
  mounts+=("$work/mnt")
  run_all memfs "$work/mnt"; labels+=(memfs)
fi

if want memfs_gofuse; then
  mkdir "$work/mntgf"
  "$BIN" --cluster "$cluster" mount --daemon ${MOUNT_FLAGS:-} --binding gofuse --log "$work/mountgf.log" "$work/mntgf" >/dev/null
  mounts+=("$work/mntgf")
  run_all memfs_gofuse "$work/mntgf"; labels+=(memfs_gofuse)
fi

if want memfs_nocache; then
  mkdir "$work/mntnc"
  "$BIN" --cluster "$cluster" mount --daemon ${MOUNT_FLAGS:-} --data-cache 0 --log "$work/mountnc.log" "$work/mntnc" >/dev/null
  mounts+=("$work/mntnc")
  run_all memfs_nocache "$work/mntnc"; labels+=(memfs_nocache)
fi

if want client; then
  echo "# client: $(uptime | sed 's/.*load/load/')" >&2
  # One operation in flight, like fio's psync jobs; MB is 10^6 bytes.
  "$BIN" --cluster "$cluster" bench --json --total "${SIZE}iB" --concurrency 1 --phases write,read --clients 1 >"$work/b1.json"
  "$BIN" --cluster "$cluster" bench --json --total 16MiB --size 4KiB --concurrency 1 --phases write,read --clients 1 >"$work/b4.json"
  "$BIN" --cluster "$cluster" bench --json --phases create --creates "$FILES" --clients 1 >"$work/c1.json"
  "$BIN" --cluster "$cluster" bench --json --phases create --creates "$FILES" --clients "$JOBS" >"$work/cn.json"
  ph() { jq -r --arg p "$2" '.phases[] | select(.phase == $p) | .'"$3" "$work/$1.json"; }
  printf '| client library | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | - |\n' \
    "$(awk -v m="$(ph b1 write mb_per_s)" 'BEGIN{print m*1e6/1048576}')" \
    "$(awk -v m="$(ph b1 read mb_per_s)" 'BEGIN{print m*1e6/1048576}')" \
    "$(ph b4 read ops_per_s)" "$(ph b4 write ops_per_s)" "$(ph c1 create ops_per_s)" "$(ph cn create ops_per_s)" >"$work/client.row"
fi

if want memfs && [ "$CHANGES" -gt 0 ]; then
  echo "# invalidation delay: $(uptime | sed 's/.*load/load/')" >&2
  (cd "$repo" && go build -o "$work/bin/invaldelay" ./fuse/bench/invaldelay)
  "$work/bin/invaldelay" --cluster "$cluster" --mount "$work/mnt" --changes "$CHANGES" >"$work/inval.txt"
  # A second mount, on the third node, makes the changes.
  mkdir "$work/mnt2"
  "$BIN" --cluster "127.0.0.1:$((base+3))" mount --daemon ${MOUNT_FLAGS:-} --log "$work/mount2.log" "$work/mnt2" >/dev/null
  mounts+=("$work/mnt2")
  echo >>"$work/inval.txt"
  "$work/bin/invaldelay" --cluster "$cluster" --mount "$work/mnt" --via "$work/mnt2" --changes "$CHANGES" >>"$work/inval.txt"
fi

echo
echo "| target | seq write 1 MiB (MiB/s) | seq read 1 MiB (MiB/s) | 4 KiB rand read (IOPS) | 4 KiB rand write (IOPS) | creates/s, 1 job | creates/s, $JOBS jobs | tar -x $TARFILES files (s) |"
echo "|---|---|---|---|---|---|---|---|"
for l in "${labels[@]}"; do row "$l"; done
[ -f "$work/client.row" ] && cat "$work/client.row"
[ -f "$work/inval.txt" ] && { echo; cat "$work/inval.txt"; }
true
