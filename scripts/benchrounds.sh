#!/usr/bin/env bash
# The issue-3 figures in rounds: each round runs the raw Raft ceiling
# (BenchmarkRaftCeiling/bolt: 3 hashicorp/raft nodes with the node's stores
# and settings, a state machine that keeps nothing; and the same with state
# machines that keep a copy of every entry, BenchmarkRaftCeilingKeep/bolt),
# then `memfs bench`
# against a fresh `memfs up` cluster, and prints one line per figure with
# the node processes' CPU time. Alternating the two in one session is what
# makes "% of the ceiling" mean anything on a machine whose disk and cores
# change speed within minutes (docs/benchmarks.md).
#
#   scripts/benchrounds.sh [rounds] [memfs bench flags...]
#
# Defaults: 4 rounds of `bench --total 512MiB --creates 10000 --clients 32`.
# BIN (default: built into a temporary directory) is the memfs binary;
# BASE_PORT (default 36000) the cluster's ports.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-4}
shift || true
[ $# -gt 0 ] || set -- --total 512MiB --creates 10000 --clients 32
tmp=$(mktemp -d /tmp/memfs-rounds-XXXXXX)
up=
cleanup() {
  [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
BIN=${BIN:-$tmp/memfs}
[ -x "$BIN" ] || CGO_ENABLED=0 go build -trimpath -o "$BIN" ./cmd/memfs
go test -c -o "$tmp/server.test" ./server/
base=${BASE_PORT:-36000}
cluster="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"

# nodecpu PIDS: user + system time of the processes, in clock ticks.
nodecpu() { local s=0 p; for p in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$s"; }
# nodefaults PIDS: minor page faults of the processes (docs/benchmarks.md,
# "Page faults and huge pages": on some machines they are most of the cost).
nodefaults() { local s=0 p; for p in "$@"; do s=$((s + $(awk '{print $10}' "/proc/$p/stat"))); done; echo "$s"; }

for ((r = 1; r <= rounds; r++)); do
  (cd server && "$tmp/server.test" -test.run '^$' -test.bench 'RaftCeiling(Keep)?/bolt' -test.benchtime 3s) |
    awk -v r="$r" '/^Benchmark/ {print "round " r " ceiling " $1 ": " $5 " MB/s, " $7 " cpu-ms/MB, " $9 " entries/s"}'
  rm -rf "$tmp/data"
  "$BIN" up --nodes 3 --dir "$tmp/data" --base-port "$base" >"$tmp/up.log" 2>&1 &
  up=$!
  for _ in $(seq 300); do grep -q "is up" "$tmp/up.log" && break; sleep 0.1; done
  grep -q "is up" "$tmp/up.log" || { cat "$tmp/up.log"; exit 1; }
  # The cluster speaks TLS with the certificates `up` made (its printed
  # export line); every command and mount needs them.
  eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$tmp/up.log" | head -1)"
  pids=$(pgrep -P "$up" | tr '\n' ' ')
  t0=$(nodecpu $pids) f0=$(nodefaults $pids)
  "$BIN" --cluster "$cluster" bench "$@" | awk -v r="$r" '/^(write|read|create) / {print "round " r " memfs " $0}'
  t1=$(nodecpu $pids) f1=$(nodefaults $pids)
  echo "round $r node CPU $(( (t1 - t0) * 1000 / $(getconf CLK_TCK) )) ms, minor faults $((f1 - f0)), load $(cut -d' ' -f1 /proc/loadavg)"
  kill "$up"; wait "$up" 2>/dev/null || true
  up=
done
