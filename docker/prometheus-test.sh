#!/usr/bin/env bash
# prometheus-test.sh — the compose profile "prometheus" works: starts the
# three nodes and Prometheus (project memfsprom, subnet 172.30.9.0/24, host
# ports 29xxx on 127.0.0.1), waits until Prometheus scrapes every node, and
# checks that queries return the nodes' data: each node's applied index
# and inode count, and exactly one leader. Removes its containers, network and volumes.
# Needs the images memfs-server and memfs-prometheus (MEMFS_PROMETHEUS=1
# build-image.sh); every wait is bounded.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
project=${MEMFS_PROM_PROJECT:-memfsprom}
export MEMFS_SUBNET_PREFIX=${MEMFS_PROM_SUBNET_PREFIX:-172.30.9}
export MEMFS_PORT_PREFIX=${MEMFS_PROM_PORT_PREFIX:-29}
if command -v docker-compose >/dev/null; then dc_cmd=(docker-compose); else dc_cmd=(docker compose); fi
dc() { timeout -k 5 120 "${dc_cmd[@]}" -p "$project" -f "$here/docker-compose.yml" --profile prometheus "$@"; }
api="http://127.0.0.1:${MEMFS_PORT_PREFIX}090/api/v1/query"
start=$SECONDS
say() { printf '[%3ds] %s\n' $((SECONDS - start)) "$*"; }

cleanup() { dc down -v --remove-orphans >/dev/null 2>&1; }
trap cleanup EXIT
cleanup

# query PROMQL — prints the number of series and their values, one line:
# "N v1 v2 ...".
query() {
	python3 - "$api" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]})
try:
    r = json.load(urllib.request.urlopen(url, timeout=10))
except Exception:
    print("0"); sys.exit()
res = r.get("data", {}).get("result", [])
print(len(res), *[x["value"][1] for x in res])
PY
}

# wait_for SECONDS PROMQL WANT_COUNT — until the query returns that many
# series.
wait_for() {
	local t0=$SECONDS out
	while :; do
		out=$(query "$2")
		[ "${out%% *}" = "$3" ] && { echo "$out"; return 0; }
		[ $((SECONDS - t0)) -lt "$1" ] || { echo "$out"; return 1; }
		sleep 2
	done
}

say "starting project $project with profile prometheus"
dc up -d node1 node2 node3 prometheus >/dev/null 2>&1 || { say "FAIL compose up"; exit 1; }
out=$(wait_for 120 'up{job="memfs"} == 1' 3) || { say "FAIL Prometheus does not scrape all three nodes: $out"; exit 1; }
say "PASS Prometheus scrapes node1, node2 and node3"
out=$(wait_for 60 'memfs_server_fsm_applied_index > 0' 3) || { say "FAIL applied index of each node: $out"; exit 1; }
say "PASS each node's applied index: ${out#* }"
out=$(wait_for 60 'memfs_server_fsm_inodes >= 1' 3) || { say "FAIL inodes of each node (the root at least): $out"; exit 1; }
say "PASS each node's inode count: ${out#* }"
out=$(wait_for 60 'sum(memfs_server_raft_state{state="Leader"})' 1) || { say "FAIL no leader sum: $out"; exit 1; }
[ "${out#* }" = 1 ] || { say "FAIL leaders: ${out#* } (want 1)"; exit 1; }
say "PASS one leader among the nodes"
echo "prometheus-test: passed"
