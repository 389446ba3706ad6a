#!/bin/bash
# Runs one `memfs server` (BIN, default ./memfs) in a 640 MiB memory cgroup
# (the v1 controller at /sys/fs/cgroup/memory; root) with --memory-limit
# 600MiB, and 8 `memfs put` loops of 1 MiB random files until each gets
# ENOSPC or an error; then prints whether the server lives, the cgroup's
# OOM kills and its peak usage. For builds older than the cgroup test
# (docs/benchmarks.md, "Memory per stored byte"). Ports 43901-43902.

BIN=${BIN:-./memfs}
CG=/sys/fs/cgroup/memory/memfs-mem-base-$$
mkdir $CG; echo $((640<<20)) > $CG/memory.limit_in_bytes
D=$(mktemp -d /tmp/memfs-cgb-XXXX)
sh -c "echo \$\$ > $CG/cgroup.procs; exec $BIN server --id a --data $D/a --bootstrap --insecure --raft-addr 127.0.0.1:43901 --api-addr 127.0.0.1:43902 --memory-limit 600MiB" > $D/log 2>&1 &
SP=$!
sleep 3
head -c $((1<<20)) /dev/urandom > /dev/null
w() { for i in $(seq $1 8 2000); do head -c 1048576 /dev/urandom > $D/src$1; if ! $BIN --cluster 127.0.0.1:43902 put $D/src$1 /f$i > $D/out$1 2>&1; then grep -q "no space" $D/out$1 && echo "w$1 ENOSPC at $i" && return; echo "w$1 error at $i: $(cat $D/out$1)"; return; fi; done; }
for k in 1 2 3 4 5 6 7 8; do w $k & done; wait
echo "server alive: $(kill -0 $SP 2>/dev/null && echo yes || echo no)"
grep oom_kill $CG/memory.oom_control; echo "max usage $(( $(cat $CG/memory.max_usage_in_bytes) >> 20 )) MiB"
$BIN --cluster 127.0.0.1:43902 status 2>&1 | grep -i "physical\|inodes" | head -3
kill $SP 2>/dev/null; wait $SP 2>/dev/null
sleep 1; rmdir $CG; rm -rf $D
