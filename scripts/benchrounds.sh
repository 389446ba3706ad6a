#!/usr/bin/env bash
# The throughput figures of docs/benchmarks.md in rounds: each round runs the raw Raft ceiling
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
# shellcheck source=upcluster.sh
. scripts/upcluster.sh
up_init 36000
go test -c -o "$tmp/server.test" ./server/

for ((r = 1; r <= rounds; r++)); do
  (cd server && "$tmp/server.test" -test.run '^$' -test.bench 'RaftCeiling(Keep)?/bolt' -test.benchtime 3s) |
    awk -v r="$r" '/^Benchmark/ {print "round " r " ceiling " $1 ": " $5 " MB/s, " $7 " cpu-ms/MB, " $9 " entries/s"}'
  up_start
  t0=$(nodecpu $pids) f0=$(nodefaults $pids)
  "$BIN" --cluster "$cluster" bench "$@" | awk -v r="$r" '/^(write|read|create) / {print "round " r " memfs " $0}'
  t1=$(nodecpu $pids) f1=$(nodefaults $pids)
  echo "round $r node CPU $(ms $((t1 - t0))) ms, minor faults $((f1 - f0)), load $(cut -d' ' -f1 /proc/loadavg)"
  up_stop
done
