#!/usr/bin/env bash
# chaos.sh — the docker chaos test (`make -C docker docker-test`).
#
# Starts its own copy of docker-compose.yml (project memfschaos, subnet
# 172.30.8.0/24, host ports 28001-28003 and 28101-28103 on 127.0.0.1) while
# the client container writes, fsyncs, renames and reads back files on its
# FUSE mount and logs every acknowledged write. Then, one at a time:
#
#   1. leader cut off    docker network disconnect of the leader; the other
#                        two elect a leader and keep acknowledging writes;
#                        a write sent inside the cut-off node's network
#                        namespace is never acknowledged; reconnect.
#   2. minority split    nftables in the leader's netns drop everything to
#                        and from the other nodes (the client still reaches
#                        it); same checks as 1; the refused writes must not
#                        appear after the heal.
#   3. packet loss       nftables `numgen random` drops 25% of the leader's
#                        packets both ways; writes go on.
#   4. kill -9 leader    docker kill -s KILL, a new leader, start it again.
#   5. rolling restart   docker restart of every node in turn.
#   6. cluster restart   docker-compose down (volumes kept) and up again:
#                        the client remounts and resumes.
#
# Finally every acknowledged write is read back through the mount and with
# `memfs cat`; the workload's own read-backs must all have matched. Writes
# are counted acknowledged only when write+fsync+close+rename succeeded.
#
# It stops by itself (every wait is bounded, a watchdog ends the run after
# MEMFS_CHAOS_LIMIT seconds, 540 by default) and removes its containers,
# network and volumes (MEMFS_CHAOS_KEEP=1 keeps them for a look). It touches
# only its own compose project and its containers' network namespaces.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
project=${MEMFS_CHAOS_PROJECT:-memfschaos}
limit=${MEMFS_CHAOS_LIMIT:-540}
export MEMFS_SUBNET_PREFIX=${MEMFS_CHAOS_SUBNET_PREFIX:-172.30.8}
export MEMFS_PORT_PREFIX=${MEMFS_CHAOS_PORT_PREFIX:-28}
export WORKLOAD_FILES=0 WORKLOAD_SIZE=${WORKLOAD_SIZE:-49152} WORKLOAD_PAUSE=${WORKLOAD_PAUSE:-0.1}
export WORKLOAD_OP_TIMEOUT=${WORKLOAD_OP_TIMEOUT:-30}
memfs=$here/build/memfs # the static binary build-image.sh packaged
logdir=$here/build/chaos
nodes=(node1 node2 node3)
net=${project}_memfs
start=$SECONDS
passed=0
failed=0

if command -v docker-compose >/dev/null; then dc_cmd=(docker-compose); else dc_cmd=(docker compose); fi
# MEMFS_CHAOS_OVERRIDE: an extra compose file layered on top (other server
# flags, say --log-store=wal).
files=(-f "$here/docker-compose.yml")
[ -n "${MEMFS_CHAOS_OVERRIDE:-}" ] && files+=(-f "$MEMFS_CHAOS_OVERRIDE")
dc() { "${dc_cmd[@]}" -p "$project" "${files[@]}" "$@"; }
# bounded SECONDS CMD... — every docker call has a limit: on a starved host
# (seen here: memory pressure from other work) dockerd can stall for minutes.
bounded() {
	local t=$1
	shift
	if [ "$1" = dc ]; then
		shift
		set -- "${dc_cmd[@]}" -p "$project" "${files[@]}" "$@"
	fi
	timeout -k 5 "$t" "$@"
}

say() { printf '[%3ds] %s\n' $((SECONDS - start)) "$*"; }
pass() { passed=$((passed + 1)); say "PASS $*"; }
fail() { failed=$((failed + 1)); say "FAIL $*"; }

ip_of() { echo "$MEMFS_SUBNET_PREFIX.1${1#node}"; }
api_of() { echo "$(ip_of "$1"):7000"; }
# cid SERVICE — the container's id, by compose's labels (the docker CLI
# answers in milliseconds where `docker-compose ps` takes seconds on a busy
# host).
cid() {
	bounded 30 docker ps -aq --filter "label=com.docker.compose.project=$project" \
		--filter "label=com.docker.compose.service=$1" 2>/dev/null | head -n 1
}
pid_of() { bounded 30 docker inspect -f '{{.State.Pid}}' "$(cid "$1")"; }
running() { [ "$(bounded 30 docker inspect -f '{{.State.Running}}' "$(cid "$1")" 2>/dev/null)" = true ]; }

cleanup() {
	trap - EXIT INT TERM
	[ -n "${watchdog:-}" ] && kill "$watchdog" 2>/dev/null
	mkdir -p "$logdir"
	bounded 60 dc logs --no-color >"$logdir/compose.log" 2>&1
	if [ "${MEMFS_CHAOS_KEEP:-0}" = 1 ]; then
		say "kept project $project (docker-compose -p $project -f $here/docker-compose.yml down -v)"
	else
		bounded 120 dc down -v -t 5 --remove-orphans >/dev/null 2>&1
	fi
}
trap cleanup EXIT
trap 'say "interrupted"; exit 2' INT TERM

# --- cluster queries -------------------------------------------------------

# status ADDR... — memfs status --json asked through the client container.
status() {
	local list
	list=$(IFS=,; echo "$*")
	bounded 15 docker exec "$(cid client)" timeout 8 memfs status --json --cluster "$list" 2>/dev/null
}

# leader_via NODE... — the leader's node name as the given nodes report it.
leader_via() {
	local addrs=() n
	for n in "$@"; do addrs+=("$(api_of "$n")"); done
	status "${addrs[@]}" | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(1)
lead = str(d.get("leader") or "")
if not lead:
    sys.exit(1)
for n in d.get("nodes") or []:
    if lead in (n.get("id"), n.get("api_addr"), n.get("raft_addr")):
        print(n.get("id")); sys.exit(0)
print(lead)'
}

# wait_leader TIMEOUT EXCLUDED NODE... — polls the given nodes until they
# report a leader other than EXCLUDED; prints it.
wait_leader() {
	local until=$((SECONDS + $1)) excl=$2 l
	shift 2
	while [ $SECONDS -lt $until ]; do
		l=$(leader_via "$@") && [ -n "$l" ] && [ "$l" != "$excl" ] && { echo "$l"; return 0; }
		sleep 1
	done
	return 1
}

# wait_whole TIMEOUT — every node answers status by itself, all name the
# same leader, and the leader sees all three with applied indexes within 64.
wait_whole() {
	local until=$((SECONDS + $1)) n l first
	while [ $SECONDS -lt $until ]; do
		first=""
		for n in "${nodes[@]}"; do
			l=$(leader_via "$n") || break
			[ -z "$first" ] && first=$l
			[ "$l" = "$first" ] || break
			if [ "$n" = "${nodes[-1]}" ] && status "$(api_of "$first")" | python3 -c '
import json, sys
d = json.load(sys.stdin)
idx = [int(n.get("applied_index") or 0) for n in d["nodes"] if not n.get("error")]
sys.exit(0 if len(idx) == 3 and max(idx) - min(idx) <= 64 else 1)' 2>/dev/null; then
				return 0
			fi
		done
		sleep 1
	done
	return 1
}

acked() { bounded 15 docker exec "$(cid client)" sh -c 'wc -l < /state/acked' 2>/dev/null || echo 0; }

# wait_progress TIMEOUT N — N more acknowledged writes within TIMEOUT.
wait_progress() {
	local until=$((SECONDS + $1)) from now
	from=$(acked)
	while [ $SECONDS -lt $until ]; do
		now=$(acked)
		[ "$now" -ge $((from + $2)) ] && return 0
		sleep 1
	done
	say "  acked stayed at $(acked) (from $from)"
	return 1
}

# put_from NODE PATH — writes PATH with `memfs put` run on the host inside
# NODE's network namespace, against that node's API on 127.0.0.1, with a
# 6 s limit: the writer reaches exactly what the node reaches.
put_from() {
	echo "written from $1 to $2" | timeout -k 2 6 nsenter -t "$(pid_of "$1")" -n \
		"$memfs" put "${tls[@]}" --timeout 5s --cluster 127.0.0.1:7000 - "$2" >/dev/null 2>&1
}

# minority_write NODE TAG — three writes from the minority side; every one
# must fail: the minority acknowledges nothing. The same kind of write made
# from the node before the fault (control_write) must have succeeded.
minority_write() {
	local j acked=0
	for j in 1 2 3; do
		put_from "$1" "/chaos/$2-$j" && acked=$((acked + 1))
	done
	[ $acked = 0 ]
}
control_write() {
	put_from "$1" "/chaos/control-$2" || abort "control write from $1 failed before the fault"
}

# absent TAG — none of the refused minority writes became visible later.
absent() {
	local out
	out=$(bounded 20 docker exec "$(cid client)" timeout 10 sh -c "ls /mnt/memfs/chaos 2>/dev/null" | grep -c "^$1-") || true
	[ "${out:-0}" = 0 ]
}

nft_in() { bounded 20 nsenter -t "$(pid_of "$1")" -n nft "${@:2}"; }

# --- the run ----------------------------------------------------------------

# The watchdog's sleep gets no stdout, so a caller reading our output
# through a pipe is not kept waiting by it, and it dies with the watchdog.
watchdog() {
	sleep "$limit" >/dev/null 2>&1 &
	local s=$!
	trap 'kill $s 2>/dev/null; exit 0' TERM
	wait $s && { say "time limit ${limit}s reached"; kill -TERM $$; }
}
watchdog &
watchdog=$!

[ -x "$memfs" ] || { say "no $memfs: run build-image.sh first"; exit 1; }
for c in nft nsenter python3 timeout; do
	command -v $c >/dev/null || { say "$c not installed (Debian: nftables, util-linux, python3, coreutils)"; exit 1; }
done
mkdir -p "$logdir"
# Every command, with its time, goes to trace.log for the post-mortem.
exec {trace}>"$logdir/trace.log"
BASH_XTRACEFD=$trace
PS4='+ [$((SECONDS - start))s] '
set -x
bounded 120 dc down -v -t 2 --remove-orphans >/dev/null 2>&1
say "starting project $project on $MEMFS_SUBNET_PREFIX.0/24"
bounded 180 dc up -d >"$logdir/up.log" 2>&1 || { cat "$logdir/up.log"; fail "compose up"; exit 1; }

phase() { say "== $*"; }
abort() { fail "$*"; finish; }

finish() {
	say "== final check of every acknowledged write"
	local c
	c=$(cid client)
	if [ -n "$c" ] && running client; then
		bounded 15 docker exec "$c" touch /state/stop
		bounded 90 docker exec "$c" sh -c 'i=0; while ps -o args | grep -q "[w]orkload.sh" && [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done'
		local a f r e
		a=$(acked)
		f=$(bounded 15 docker exec "$c" sh -c 'wc -l < /state/failed')
		r=$(bounded 15 docker exec "$c" sh -c 'wc -l < /state/readfail')
		e=$(bounded 15 docker exec "$c" sh -c 'cat /state/errors')
		say "  $a writes acknowledged; during faults $f writes and $r read-backs failed (outages, not errors)"
		if [ -z "$e" ]; then pass "workload read-backs all matched"; else fail "workload read-backs: $e"; fi
		if bounded 240 docker exec "$c" verify.sh --cli=10; then
			pass "all $a acknowledged writes present (mount; every 10th also by memfs cat)"
		else
			fail "acknowledged writes lost or wrong"
		fi
		[ "$a" -ge 20 ] && pass "workload made progress ($a writes)" || fail "only $a writes acknowledged"
	else
		fail "client container not running for the final check"
	fi
	say "chaos: wall time $((SECONDS - start))s"
	echo "chaos: $passed passed, $failed failed"
	[ $failed = 0 ]
	exit
}

phase "0. cluster forms and the client writes"
wait_whole 90 || abort "cluster did not form within 90s"
leader=$(leader_via "${nodes[@]}")
pass "cluster formed, leader $leader"
for n in 1 2 3; do
	m=$(python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=10).read().decode())' \
		"http://127.0.0.1:${MEMFS_PORT_PREFIX}10$n/metrics" 2>/dev/null)
	grep -q '^memfs_' <<<"$m" ||
		abort "no memfs_ metrics on 127.0.0.1:${MEMFS_PORT_PREFIX}10$n"
done
pass "metrics served on every node"
# The compose healthcheck asks each node's /readyz (memfs health).
health_of() { bounded 30 docker inspect -f '{{.State.Health.Status}}' "$(cid "$1")" 2>/dev/null; }
for n in "${nodes[@]}"; do
	t0=$SECONDS
	until [ "$(health_of "$n")" = healthy ]; do
		[ $((SECONDS - t0)) -lt 60 ] || abort "$n not healthy after 60s: $(health_of "$n")"
		sleep 1
	done
done
pass "every node healthy (its /readyz)"
# The cluster runs TLS with the certificates its init service made: the
# host's commands use the admin certificate, copied out of the client.
rm -rf "$logdir/certs"
bounded 30 docker cp "$(cid client)":/certs "$logdir/certs" || abort "copy the certificates out of the client"
tls=(--ca "$logdir/certs/ca.crt" --cert "$logdir/certs/admin.crt" --key "$logdir/certs/admin.key")
api1=127.0.0.1:${MEMFS_PORT_PREFIX}001
if bounded 15 "$memfs" status --timeout 5s --cluster "$api1" >/dev/null 2>&1; then
	abort "a client without the cluster's CA was served"
fi
bounded 15 "$memfs" status "${tls[@]}" --timeout 5s --cluster "$api1" >/dev/null ||
	abort "memfs status with the admin certificate failed"
pass "TLS: served with the cluster's certificate, refused without"
bounded 30 docker exec "$(cid client)" timeout 20 memfs mkdir -p /chaos || abort "memfs mkdir /chaos"
wait_progress 60 10 || abort "client made no progress"
pass "client writing on its FUSE mount ($(acked) acknowledged)"

phase "1. cut the leader ($leader) off with docker network disconnect"
old=$leader
control_write "$old" cut
bounded 60 docker network disconnect "$net" "$(cid "$old")" || abort "docker network disconnect $old"
others=()
for n in "${nodes[@]}"; do [ "$n" != "$old" ] && others+=("$n"); done
leader=$(wait_leader 30 "$old" "${others[@]}") || abort "no new leader among ${others[*]}"
pass "majority elected $leader"
minority_write "$old" cut && pass "isolated $old acknowledged no write" || fail "isolated $old acknowledged a write"
wait_progress 45 5 && pass "writes go on without $old" || fail "writes stalled without $old"
bounded 60 docker network connect --ip "$(ip_of "$old")" "$net" "$(cid "$old")" || abort "docker network connect $old"
wait_whole 60 && pass "$old rejoined and caught up" || abort "$old did not rejoin"

phase "2. split the leader from the majority with nftables"
leader=$(leader_via "${nodes[@]}")
old=$leader
others=()
for n in "${nodes[@]}"; do [ "$n" != "$old" ] && others+=("$n"); done
peers="$(ip_of "${others[0]}"), $(ip_of "${others[1]}")"
control_write "$old" split
nft_in "$old" -f - <<EOF
table inet memfs_chaos {
	chain in { type filter hook input priority 0; policy accept; ip saddr { $peers } drop; }
	chain out { type filter hook output priority 0; policy accept; ip daddr { $peers } drop; }
}
EOF
minority_write "$old" split && pass "minority $old acknowledged no write" || fail "minority $old acknowledged a write"
leader=$(wait_leader 30 "$old" "${others[@]}") || abort "no new leader among ${others[*]}"
pass "majority elected $leader"
wait_progress 45 5 && pass "writes go on beside the split" || fail "writes stalled beside the split"
nft_in "$old" delete table inet memfs_chaos
wait_whole 60 && pass "split healed" || abort "split did not heal"
absent split && pass "refused minority writes never appeared" || fail "a refused minority write appeared"

phase "3. 25% packet loss on the leader ($leader) with nftables numgen"
lossy=$leader
nft_in "$lossy" -f - <<'EOF'
table inet memfs_chaos {
	chain in { type filter hook input priority 0; policy accept; numgen random mod 100 < 25 drop; }
	chain out { type filter hook output priority 0; policy accept; numgen random mod 100 < 25 drop; }
}
EOF
wait_progress 60 5 && pass "writes go on through 25% loss" || fail "writes stalled under loss"
nft_in "$lossy" delete table inet memfs_chaos
wait_whole 60 && pass "recovered from loss" || abort "no recovery from loss"

phase "4. kill -9 the leader"
leader=$(leader_via "${nodes[@]}")
old=$leader
bounded 60 docker kill -s KILL "$(cid "$old")" >/dev/null || abort "docker kill $old"
others=()
for n in "${nodes[@]}"; do [ "$n" != "$old" ] && others+=("$n"); done
leader=$(wait_leader 30 "$old" "${others[@]}") || abort "no new leader after killing $old"
pass "killed $old, $leader leads"
running "$old" || bounded 120 docker start "$(cid "$old")" >/dev/null || abort "docker start $old"
wait_whole 120 && pass "$old restarted and caught up" || abort "$old did not come back"
wait_progress 45 5 && pass "writes go on after kill -9" || fail "writes stalled after kill -9"

phase "5. restart every node in turn"
for n in "${nodes[@]}"; do
	bounded 120 docker restart -t 20 "$(cid "$n")" >/dev/null || abort "docker restart $n"
	wait_whole 120 || abort "cluster not whole after restarting $n"
done
pass "rolling restart"
wait_progress 45 5 && pass "writes go on after the rolling restart" || fail "writes stalled after rolling restart"

phase "6. whole cluster down (volumes kept) and up"
before=$(acked)
bounded 120 dc down -t 20 >>"$logdir/up.log" 2>&1 || abort "compose down"
bounded 180 dc up -d >>"$logdir/up.log" 2>&1 || abort "compose up after down"
wait_whole 150 && pass "cluster back after down/up" || abort "cluster did not come back after down/up"
wait_progress 60 5 && pass "client remounted and writes again" || fail "no writes after down/up"
say "  $before writes acknowledged before the restart"

finish
