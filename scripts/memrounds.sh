#!/usr/bin/env bash
# Memory per stored byte: starts a fresh 3-node `memfs up`, writes TOTAL of
# unique random data with `memfs bench --phases write --keep` (WRITER=bench,
# the default, with BENCH_FLAGS such as `--concurrency 32`) or with one
# `memfs put - /put.bin` from /dev/urandom (WRITER=put), samples every
# node's RSS (anonymous and file-backed, /proc/PID/status) twice a second
# during the write, and prints each node's peak RSS, its steady RSS 20 s
# after the write, its physical bytes, and the Go runtime's view of the
# heap at that moment (docs/benchmarks.md, "Memory per stored byte").
#
#   scripts/memrounds.sh [TOTAL] [memfs server flags...]
#
# BIN (default: built into a temporary directory) is the memfs binary;
# BASE_PORT (default 43000) the cluster's ports; KEEP=1 leaves the
# cluster's heap profiles in $OUT (default: the temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
total=${1:-4GiB}
shift || true
tmp=$(mktemp -d /tmp/memfs-mem-XXXXXX)
out=${OUT:-$tmp}
up=
sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null
  rm -rf "$tmp/data"
}
trap cleanup EXIT
BIN=${BIN:-$tmp/memfs}
[ -x "$BIN" ] || CGO_ENABLED=0 go build -trimpath -o "$BIN" ./cmd/memfs
base=${BASE_PORT:-43000}
cluster="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"
"$BIN" up --nodes 3 --dir "$tmp/data" --base-port "$base" -- "$@" >"$tmp/up.log" 2>&1 &
up=$!
for _ in $(seq 600); do grep -q "is up" "$tmp/up.log" && break; sleep 0.1; done
grep -q "is up" "$tmp/up.log" || { cat "$tmp/up.log"; exit 1; }
eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$tmp/up.log" | head -1)"
mapfile -t pids < <(pgrep -P "$up")

# rss PID: "total anon file" resident KiB.
rss() { awk '/^VmRSS/ {t=$2} /^RssAnon/ {a=$2} /^RssFile/ {f=$2} END {print t, a, f}' "/proc/$1/status"; }
(
  while :; do
    for i in "${!pids[@]}"; do echo "$i $(rss "${pids[$i]}")"; done
    sleep 0.5
  done
) >"$tmp/samples" &
sampler=$!
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
case ${WRITER:-bench} in
bench)
  # shellcheck disable=SC2086 # BENCH_FLAGS are words
  "$BIN" --cluster "$cluster" bench --phases write --keep --total "$total" ${BENCH_FLAGS:-} | grep '^write'
  ;;
put)
  bytes=$(numfmt --from=iec-i "${total%B}")
  t0=$(date +%s%N)
  head -c "$bytes" /dev/urandom | "$BIN" --cluster "$cluster" -q put - /put.bin
  echo "put $total in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  ;;
*) echo "WRITER is bench or put" >&2; exit 2 ;;
esac
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
sleep 20
kill "$sampler"; sampler=
"$BIN" --cluster "$cluster" status --json >"$tmp/status.json"
for i in "${!pids[@]}"; do
  n=$((i + 1))
  phys=$(python3 -c "import json,sys; d=json.load(open('$tmp/status.json')); print([x for x in d['nodes'] if x['id']=='n$n'][0]['physical_bytes'])" 2>/dev/null || echo 0)
  read -r t a f < <(rss "${pids[$i]}")
  peak=$(awk -v i="$i" '$1==i && $2>m {m=$2} END {print m+0}' "$tmp/samples")
  m=$(curl -s "http://127.0.0.1:$((base + 200 + n))/metrics")
  g() { echo "$m" | awk -v k="$1" '$1==k {printf "%d", $2/1048576}'; }
  curl -s -o "$out/heap$n.pb.gz" "http://127.0.0.1:$((base + 200 + n))/debug/pprof/heap"
  awk -v n="$n" -v p="$phys" -v t="$t" -v a="$a" -v f="$f" -v k="$peak" -v hi="$(g go_memstats_heap_inuse_bytes)" \
    -v hs="$(g go_memstats_heap_sys_bytes)" -v hr="$(g go_memstats_heap_released_bytes)" -v si="$(g go_memstats_stack_inuse_bytes)" \
    -v os="$(g go_memstats_other_sys_bytes)" -v ss="$(g go_memstats_sys_bytes)" 'BEGIN {
    P = p / 1048576; T = t / 1024; K = k / 1024
    printf "node%d physical %.0f MiB; steady RSS %.0f MiB (anon %.0f, file %.0f) = %.2fx phys; peak RSS %.0f MiB = %.2fx; target steady %.0f peak %.0f\n", n, P, T, a/1024, f/1024, T/(P>0?P:1), K, K/(P>0?P:1), 1.10*P+128, 1.25*P+256
    printf "  go: heap inuse %d, heap sys %d, released %d, stacks %d, other %d, sys %d MiB\n", hi, hs, hr, si, os, ss }'
done
echo "heap profiles: $out/heap{1,2,3}.pb.gz"
