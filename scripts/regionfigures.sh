#!/usr/bin/env bash
# Every figure of the "Managed regions" section of docs/benchmarks.md in one
# run, on one fresh `memfs up` (3 node processes, fsynced, loopback): a 1 GiB
# file of random data, then
#   - PAIRS interleaved rounds of `region pull`, `region pull --plain` and
#     `cat` through a fresh `memfs mount --daemon` (first byte with
#     `head -c 1`, then the whole file to /dev/null; each round mounts anew
#     so no round reads the kernel's page cache of the one before);
#   - the cluster's commit latency (`bench --phases write`, one 64 KiB write
#     at a time) before, between and after the two handoff runs;
#   - `region handoff --rounds ROUNDS` with a write every 5 ms and every 1 ms.
# Every step prints the UTC time and the load average before it.
#
#   scripts/regionfigures.sh            # as root (FUSE), from anywhere
#
# PAIRS (default 3), ROUNDS (default 20), BIN (default: built into a
# temporary directory) and BASE_PORT (default 33300) change it. About 8
# minutes on the 2-core machine when loaded (load 10-20); the two handoff
# runs are most of it (each round leeches the whole 1 GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${PAIRS:-3}
rounds=${ROUNDS:-20}
# shellcheck source=upcluster.sh
. scripts/upcluster.sh
up_init 33300
mnt=
cleanup() {
  if [ -n "$mnt" ]; then fusermount3 -u "$mnt" 2>/dev/null || true; fi
  up_cleanup
}
trap cleanup EXIT

stamp() { echo "== $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg): $*"; }
now() { date +%s%N; }
msince() { echo "$(( ($(now) - $1) / 1000000 ))"; }
m() { "$BIN" --cluster "$cluster" "$@"; }
baseline() {
  stamp "commit latency ($1)"
  m bench --phases write --total 32MiB --size 64KiB --concurrency 1 | grep -E '^write |p50|p99' || true
}

echo "regionfigures: build $(git rev-parse --short HEAD), $(nproc) cores, pairs $pairs, rounds $rounds"
up_start --insecure
head -c 1G /dev/urandom >"$tmp/g1"
m put "$tmp/g1" /g
rm -f "$tmp/g1"

for ((r = 1; r <= pairs; r++)); do
  stamp "pair $r: region pull"
  m region pull /g
  stamp "pair $r: plain client reads"
  m region pull --plain /g
  stamp "pair $r: cat through the mount"
  mnt="$tmp/mnt"
  mkdir -p "$mnt"
  m mount --daemon "$mnt" >/dev/null
  t=$(now); head -c 1 "$mnt/g" >/dev/null; first=$(msince "$t")
  t=$(now); cat "$mnt/g" >/dev/null; all=$(msince "$t")
  echo "first byte ${first} ms, all ${all} ms: $((1024 * 1000 / (all > 0 ? all : 1))) MiB/s"
  fusermount3 -u "$mnt"
  mnt=
done

baseline before
stamp "handoff, a write every 5 ms"
m region handoff --path /g --size 1GiB --hot 16MiB --interval 5ms --rounds "$rounds" --settle 200ms
baseline between
stamp "handoff, a write every 1 ms"
m region handoff --path /g --size 1GiB --hot 16MiB --interval 1ms --rounds "$rounds" --settle 200ms
baseline after
stamp done
up_stop
