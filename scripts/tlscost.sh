#!/usr/bin/env bash
# What TLS with authentication costs: `memfs bench` against a fresh
# `memfs up --ephemeral` cluster with TLS (the default) and with --insecure,
# alternating in one session, with the CPU time of the three node processes
# (docs/benchmarks.md, "TLS and authentication"). Wall-clock figures on a
# shared machine move between runs; alternating rounds is what makes the
# difference mean anything.
#
#   scripts/tlscost.sh [rounds] [memfs bench flags...]
#
# Defaults: 3 rounds of `bench --total 256MiB --creates 5000`. BIN (default:
# built into a temporary directory) is the memfs binary; BASE_PORT (default
# 37000) the cluster's ports.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
[ $# -gt 0 ] || set -- --total 256MiB --creates 5000
tmp=$(mktemp -d /tmp/memfs-tls-XXXXXX)
up=
cleanup() {
  [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
BIN=${BIN:-$tmp/memfs}
[ -x "$BIN" ] || CGO_ENABLED=0 go build -trimpath -o "$BIN" ./cmd/memfs
base=${BASE_PORT:-37000}
cluster="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"

# cpu PIDS: user + system time of the processes, in clock ticks.
cpu() { local s=0 p; for p in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$s"; }

for ((r = 1; r <= rounds; r++)); do
  for mode in tls insecure; do
    rm -rf "$tmp/data"
    flags=()
    [ "$mode" = insecure ] && flags=(--insecure)
    "$BIN" up --nodes 3 --ephemeral --dir "$tmp/data" --base-port "$base" "${flags[@]}" >"$tmp/up.log" 2>&1 &
    up=$!
    for _ in $(seq 300); do grep -q "is up" "$tmp/up.log" && break; sleep 0.1; done
    grep -q "is up" "$tmp/up.log" || { cat "$tmp/up.log"; exit 1; }
    unset MEMFS_CA MEMFS_CERT MEMFS_KEY
    eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$tmp/up.log" | head -1)"
    pids=$(pgrep -P "$up" | tr '\n' ' ')
    t0=$(cpu $pids)
    b0=$(awk '{print $14 + $15}' /proc/self/stat)
    "$BIN" --cluster "$cluster" bench "$@" >"$tmp/bench.log"
    t1=$(cpu $pids)
    awk -v r="$r" -v m="$mode" '/^(write|read|create) / {print "round " r " " m " " $0}' "$tmp/bench.log"
    echo "round $r $mode node CPU $(( (t1 - t0) * 1000 / $(getconf CLK_TCK) )) ms, load $(cut -d' ' -f1 /proc/loadavg)"
    kill "$up"; wait "$up" 2>/dev/null || true
    up=
  done
done
