#!/bin/bash
# Peak RSS of a node catching up from a snapshot: scripts/catchupmem.sh BIN [BASE_PORT [TOTAL]]. TOTAL (default
# 1GiB) into a 3-node `memfs up` with frequent snapshots, the cluster stopped, node 3 wiped, the cluster started
# again (docs/benchmarks.md).
BIN=$1; base=${2:-43300}; total=${3:-1GiB}
D=$(mktemp -d /tmp/memfs-cu-XXXX)
cl="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"
start() { $BIN up --nodes 3 --dir $D/c --base-port $base -- --snapshot-threshold 256 --trailing-logs 64 --snapshot-interval 2s > $D/up.log 2>&1 & UP=$!; for i in $(seq 600); do grep -q "is up" $D/up.log && break; sleep 0.2; done; eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' $D/up.log | head -1)"; }
start
$BIN --cluster $cl bench --phases write --keep --total "$total" | grep ^write
sleep 8
kill $UP; wait $UP
rm -rf $D/c/node3
> $D/up.log
$BIN up --nodes 3 --dir $D/c --base-port $base -- --snapshot-threshold 256 --trailing-logs 64 --snapshot-interval 2s > $D/up.log 2>&1 & UP=$!
peak=0; p3=
for i in $(seq 1200); do
  [ -z "$p3" ] && p3=$(pgrep -P $UP -f "id n3")
  if [ -n "$p3" ]; then r=$(awk '/^VmRSS/{print $2}' /proc/$p3/status 2>/dev/null); [ -n "$r" ] && [ $r -gt $peak ] && peak=$r; fi
  grep -q "is up" $D/up.log && break
  sleep 0.1
done
eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' $D/up.log | head -1)"
# Until node 3 holds what node 1 holds (at most 10 minutes), then 10 s more.
phys() { $BIN --cluster $cl status --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(*[x.get('physical_bytes', 0) for x in d['nodes'] if x['id'] in ('n1', 'n3')])" 2>/dev/null; }
t0=$(date +%s)
for i in $(seq 1200); do
  r=$(awk '/^VmRSS/{print $2}' /proc/$p3/status 2>/dev/null); [ -n "$r" ] && [ $r -gt $peak ] && peak=$r
  if [ $((i % 4)) = 0 ]; then read -r a b < <(phys); [ -n "$b" ] && [ "$a" = "$b" ] && break; fi
  sleep 0.5
done
echo "node3 caught up $(( $(date +%s) - t0 )) s after the cluster was up"
for i in $(seq 20); do r=$(awk '/^VmRSS/{print $2}' /proc/$p3/status 2>/dev/null); [ -n "$r" ] && [ $r -gt $peak ] && peak=$r; sleep 0.5; done
echo "node3 catch-up peak RSS $((peak/1024)) MiB; now $(awk '/^VmRSS/{print int($2/1024)}' /proc/$p3/status) MiB (anon $(awk '/^RssAnon/{print int($2/1024)}' /proc/$p3/status), file $(awk '/^RssFile/{print int($2/1024)}' /proc/$p3/status))"
$BIN --cluster $cl status 2>&1 | head -6
grep -h "restore\|fetching" $D/c/node3.log | head -3
kill $UP; wait $UP; rm -rf $D
