#!/usr/bin/env bash
# What TLS with authentication costs: `memfs bench` against a fresh
# `memfs up --ephemeral` cluster with TLS (the default) and with --insecure,
# alternating in one session, with the CPU time of the three node processes
# and of the bench client (docs/benchmarks.md, "TLS and authentication").
# Wall-clock figures on a shared machine move between runs; alternating
# rounds (TLS first in odd rounds, plaintext first in even ones) is what
# makes the difference mean anything.
#
#   scripts/tlscost.sh [rounds] [memfs bench flags...]
#
# Defaults: 3 rounds of `bench --total 256MiB --creates 5000`. BIN (default:
# built into a temporary directory) is the memfs binary; BASE_PORT (default
# 37000) the cluster's ports.
set -euo pipefail
TIMEFORMAT='%U %S'
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
[ $# -gt 0 ] || set -- --total 256MiB --creates 5000
# shellcheck source=upcluster.sh
. scripts/upcluster.sh
up_init 37000

for ((r = 1; r <= rounds; r++)); do
  # A B B A: neither mode always runs first (a fresh cluster's first
  # touch of memory costs more on some machines).
  order="tls insecure"
  ((r % 2 == 0)) && order="insecure tls"
  for mode in $order; do
    flags=(--ephemeral)
    [ "$mode" = insecure ] && flags+=(--insecure)
    up_start "${flags[@]}"
    t0=$(nodecpu $pids)
    # bash's time: the client's user and system seconds.
    { time "$BIN" --cluster "$cluster" bench "$@" >"$tmp/bench.log" 2>"$tmp/bench.err"; } 2>"$tmp/time" \
      || { cat "$tmp/bench.err" >&2; exit 1; }
    cat "$tmp/bench.err" >&2
    t1=$(nodecpu $pids)
    awk -v r="$r" -v m="$mode" '/^(write|read|create) / {print "round " r " " m " " $0}' "$tmp/bench.log"
    echo "round $r $mode node CPU $(ms $((t1 - t0))) ms, client CPU $(awk '{printf "%d", ($1 + $2) * 1000}' "$tmp/time") ms, load $(cut -d' ' -f1 /proc/loadavg)"
    up_stop
  done
done
