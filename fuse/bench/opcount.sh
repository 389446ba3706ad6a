#!/usr/bin/env bash
# Where a MemoryFS mount's time goes, counted rather than timed (a loaded
# machine makes timings noisy; counts are not): for each workload, the
# FUSE requests the kernel sent (the mount's --debug trace) and the
# commands and queries the cluster served (the nodes' Prometheus metrics).
#
#   fuse/bench/opcount.sh path/to/memfs
#
# Run it as root from the repository root. Workloads: a tar -x of TARFILES
# (default 100) files of 4.5 KiB, a sequential read of a SIZE (default
# 64M) file in 1 MiB blocks after dropping the page cache, and FILES
# (default 100) fio creates. Environment: BASE_PORT (default random, below
# 32768), KEEP=1 leaves the work dir. Needs fio, curl and fusermount3.
set -euo pipefail
BIN=${1:-}
[ -x "$BIN" ] || { echo "usage: $0 path/to/memfs" >&2; exit 2; }
BIN=$(realpath "$BIN")
TARFILES=${TARFILES:-100}
SIZE=${SIZE:-64M}
FILES=${FILES:-100}
base=${BASE_PORT:-$((20000 + RANDOM % 12000))}
work=$(mktemp -d /tmp/memfs-opcount-XXXXXX)
pids=()
cleanup() {
  set +e
  fusermount3 -u "$work/mnt" 2>/dev/null || fusermount3 -uz "$work/mnt" 2>/dev/null
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ "${KEEP:-}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

# Three nodes, each with its metrics on base+200+i.
for i in 1 2 3; do
  args=(server --id "n$i" --data "$work/d$i" --raft-addr "127.0.0.1:$((base + 100 + i))"
    --api-addr "127.0.0.1:$((base + i))" --metrics-addr "127.0.0.1:$((base + 200 + i))")
  if [ "$i" = 1 ]; then args+=(--bootstrap); else args+=(--join "127.0.0.1:$((base + 1))"); fi
  "$BIN" "${args[@]}" >"$work/n$i.log" 2>&1 &
  pids+=($!)
done
cluster="127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2)),127.0.0.1:$((base + 3))"
for _ in $(seq 100); do "$BIN" --cluster "$cluster" --timeout 1s status >/dev/null 2>&1 && break; sleep 0.2; done
mkdir "$work/mnt"
"$BIN" --cluster "$cluster" mount --daemon --debug --log "$work/mount.log" "$work/mnt" >/dev/null

# The cluster's counters summed over the nodes, without the node label.
metrics() {
  for i in 1 2 3; do curl -s "127.0.0.1:$((base + 200 + i))/metrics"; done |
    grep -E '^memfs_server_(commands_total|query_duration_seconds_count|forwarded_total)' |
    sed -E 's/,?node="[^"]*",?//; s/\{\}//' |
    awk '{s[$1] += $2} END {for (k in s) print k, s[k]}' | sort
}

phase() { # name n command...: counts per unit of n
  local name=$1 n=$2 lines t0 t1
  shift 2
  metrics >"$work/m0"
  lines=$(wc -l <"$work/mount.log")
  t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N)
  sleep 1 # the last releases and change events
  metrics >"$work/m1"
  echo "## $name: $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f s", b - a}') (counts per unit: / $n)"
  echo "FUSE requests:"
  tail -n +$((lines + 1)) "$work/mount.log" | grep -o 'msg="<- [A-Za-z]*' | sed 's/msg="<- //' |
    sort | uniq -c | sort -rn | awk -v n="$n" '{printf "  %-12s %6d  %6.2f\n", $2, $1, $1 / n}' || true
  echo "cluster:"
  join -a2 "$work/m0" "$work/m1" |
    awk -v n="$n" '{d = (NF == 3) ? $3 - $2 : $2; if (d > 0) printf "  %-70s %6d  %6.2f\n", $1, d, d / n}'
}

# The tar: files of 4.5 KiB, like fio.sh's.
mkdir -p "$work/src/d"
head -c $((TARFILES * 4608)) /dev/urandom | (cd "$work/src/d" && split -a 4 -d -b 4608 - f)
tar -C "$work/src" -cf "$work/tree.tar" .
phase "tar -x of $TARFILES files" "$TARFILES" tar -C "$work/mnt" -xf "$work/tree.tar"

head -c "$SIZE" /dev/urandom >"$work/big"
cp "$work/big" "$work/mnt/big"
sync
echo 3 >/proc/sys/vm/drop_caches
mib=$(($(stat -c %s "$work/big") >> 20))
phase "sequential read of $SIZE in 1 MiB blocks" "$mib" dd if="$work/mnt/big" of=/dev/null bs=1M status=none

mkdir "$work/mnt/c"
phase "$FILES creates (fio filecreate, 1 job)" "$FILES" fio --name=c --directory="$work/mnt/c" --ioengine=filecreate \
  --nrfiles="$FILES" --filesize=4k --bs=4k --openfiles=1 --create_on_open=1 --output=/dev/null
