#!/usr/bin/env bash
# FUSE figures for docs/benchmarks.md: the same fio jobs on tmpfs and on a
# MemoryFS mount of a fresh local 3-node cluster, and `memfs bench` (the
# client library) against the same cluster, in one run.
#
#   fuse/bench/fio.sh [memfs-binary]      (root; needs fio and fusermount3)
#
# Environment: SIZE (default 512M) per sequential job, RUNTIME (default 15)
# seconds per random job, FILES (default 2000) for the create job,
# LOG_STORE (default bolt) for the cluster, KEEP=1 to leave the work dir.
set -euo pipefail
BIN=${1:-$(command -v memfs || true)}
[ -x "$BIN" ] || { echo "usage: $0 path/to/memfs" >&2; exit 2; }
SIZE=${SIZE:-512M}
RUNTIME=${RUNTIME:-15}
FILES=${FILES:-2000}
LOG_STORE=${LOG_STORE:-bolt}
work=$(mktemp -d /tmp/memfs-fio-XXXXXX)
tmpfs=$(mktemp -d /dev/shm/memfs-fio-XXXXXX)
base=$((20000 + RANDOM % 20000))
cluster="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"
mnt=$work/mnt
mkdir -p "$mnt"

cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" 2>/dev/null || true
  [ -n "${up:-}" ] && kill -INT "$up" 2>/dev/null && wait "$up" 2>/dev/null || true
  rm -rf "$tmpfs"
  [ "${KEEP:-}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

"$BIN" up --nodes 3 --dir "$work/data" --base-port "$base" --log-store "$LOG_STORE" >"$work/up.log" 2>&1 &
up=$!
for _ in $(seq 600); do grep -q "is up" "$work/up.log" && break; sleep 0.1; done
grep -q "is up" "$work/up.log" || { cat "$work/up.log"; exit 1; }
"$BIN" --cluster "$cluster" mount --daemon --log "$work/mount.log" "$mnt" >/dev/null

# fio prints one terse line per job; field 7 is read KiB/s, 48 write KiB/s,
# 8 read IOPS, 49 write IOPS.
job() { # name dir fio-args...
  local name=$1 dir=$2; shift 2
  fio --name="$name" --directory="$dir" --output-format=terse --terse-version=3 \
      --group_reporting "$@" | awk -F';' -v n="$name" '{printf "%s read %.1f MiB/s %.0f IOPS, write %.1f MiB/s %.0f IOPS\n", n, $7/1024, $8, $48/1024, $49}'
}

run_all() { # label dir
  local label=$1 dir=$2
  job "$label seq-write-1M" "$dir" --rw=write --bs=1M --size="$SIZE" --end_fsync=1 --ioengine=psync
  job "$label seq-read-1M" "$dir" --rw=read --bs=1M --size="$SIZE" --ioengine=psync
  job "$label rand-read-4k" "$dir" --rw=randread --bs=4k --size="$SIZE" --time_based --runtime="$RUNTIME" --ioengine=psync
  job "$label rand-write-4k" "$dir" --rw=randwrite --bs=4k --size="$SIZE" --time_based --runtime="$RUNTIME" --ioengine=psync --end_fsync=1
  rm -f "$dir"/*.0.0
  local start end
  start=$(date +%s.%N)
  fio --name=create --directory="$dir" --ioengine=filecreate --nrfiles="$FILES" --filesize=4k \
      --openfiles=1 --create_on_open=1 --output-format=terse >/dev/null
  end=$(date +%s.%N)
  awk -v l="$label" -v n="$FILES" -v s="$start" -v e="$end" 'BEGIN{printf "%s create-4k %.0f files/s\n", l, n/(e-s)}'
}

echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) cores, SIZE=$SIZE RUNTIME=${RUNTIME}s FILES=$FILES log-store=$LOG_STORE"
run_all tmpfs "$tmpfs"
run_all mount "$mnt"
echo "# client library (memfs bench, 1 MiB operations, 4 in flight and 1 in flight)"
"$BIN" --cluster "$cluster" bench --total "$SIZE"iB --concurrency 4 --phases write,read | tail -2
"$BIN" --cluster "$cluster" bench --total "$SIZE"iB --concurrency 1 --phases write,read --creates "$FILES" --clients 1 | tail -3
