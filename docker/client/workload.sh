#!/bin/sh
# workload.sh — writes files on the FUSE mount and records each write the
# filesystem acknowledged. Per file i: random bytes are written to a
# temporary name with fsync (dd conv=fsync), renamed into place, read back
# and compared. Only when write, fsync, close and rename all succeeded is the
# line "i sha256" appended to /state/acked: that file must survive anything
# a minority of nodes goes through. Failed attempts go to /state/failed, a
# read-back that failed to /state/readfail, and a read-back that returned
# other bytes than were acknowledged to /state/errors.
#
# Env: MEMFS_MOUNT (/mnt/memfs), WORKLOAD_NAME (directory under /workload),
# WORKLOAD_FILES (how many; 0 = until /state/stop exists), WORKLOAD_SIZE
# (mean bytes per file), WORKLOAD_PAUSE (seconds between files),
# WORKLOAD_OP_TIMEOUT (seconds one operation may take).
set -u
mnt=${MEMFS_MOUNT:-/mnt/memfs}
name=${WORKLOAD_NAME:-$(hostname)}
files=${WORKLOAD_FILES:-200}
size=${WORKLOAD_SIZE:-65536}
pause=${WORKLOAD_PAUSE:-0.2}
optimeout=${WORKLOAD_OP_TIMEOUT:-30}
state=/state
dir=$mnt/workload/$name
tmp=$state/tmp.$$
mkdir -p "$state"
touch "$state/acked" "$state/failed" "$state/readfail" "$state/errors"

# Resume after a restart: continue after the highest number tried so far.
last=$(cat "$state/acked" "$state/failed" | awk '$1 > m { m = $1 } END { print m + 0 }')
i=$((last + 1))

until timeout "$optimeout" mkdir -p "$dir"; do
	[ -e "$state/stop" ] && exit 0
	echo "workload: mkdir $dir failed; retrying" >&2
	sleep 1
done

n=0
while [ "$files" -eq 0 ] || [ "$n" -lt "$files" ]; do
	[ -e "$state/stop" ] && break
	# Sizes vary around the mean so chunks end in odd places.
	len=$((size / 2 + (i * 7919) % (size + 1)))
	head -c "$len" /dev/urandom >"$tmp"
	sum=$(sha256sum <"$tmp" | cut -d' ' -f1)
	f=$dir/f$i
	if timeout "$optimeout" dd if="$tmp" of="$f.tmp" bs=65536 conv=fsync 2>/dev/null &&
		timeout "$optimeout" mv "$f.tmp" "$f"; then
		echo "$i $sum" >>"$state/acked"
		# A read that fails (EIO after --op-timeout while the cluster has
		# no quorum) is an outage, logged to readfail; a read that succeeds
		# with other bytes is a correctness error.
		if got=$(timeout "$optimeout" sha256sum <"$f"); then
			got=${got%% *}
			if [ "$got" != "$sum" ]; then
				echo "$i read-back $got want $sum" >>"$state/errors"
				echo "workload: f$i read back wrong" >&2
			fi
		else
			echo "$i" >>"$state/readfail"
		fi
	else
		echo "$i" >>"$state/failed"
	fi
	i=$((i + 1))
	n=$((n + 1))
	sleep "$pause"
done
rm -f "$tmp"
echo "workload: done at file $((i - 1)); $(wc -l <"$state/acked") acknowledged in all, $(wc -l <"$state/failed") failed"
