#!/bin/sh
# verify.sh [--cli[=N]] — checks every write in /state/acked: the file must
# exist on the mount with the acknowledged content. With --cli every file
# (with --cli=N every Nth, and the last) is also read through `memfs cat`
# (the gRPC path, no kernel cache in between).
# Prints the first 20 mismatches and "verify: N ok, M bad"; exits 1 if any
# is bad.
set -u
mnt=${MEMFS_MOUNT:-/mnt/memfs}
name=${WORKLOAD_NAME:-$(hostname)}
cli=0
case "${1:-}" in
--cli) cli=1 ;;
--cli=*) cli=${1#--cli=} ;;
esac
last=$(tail -n 1 /state/acked | cut -d' ' -f1)
n=0
ok=0
bad=0
report() {
	bad=$((bad + 1))
	[ "$bad" -le 20 ] && echo "verify: $*" >&2
}
while read -r i sum; do
	[ -n "$i" ] || continue
	got=$( (timeout 30 sha256sum <"$mnt/workload/$name/f$i") 2>/dev/null | cut -d' ' -f1)
	if [ "$got" != "$sum" ]; then
		report "f$i via the mount: got '$got' want $sum"
		continue
	fi
	n=$((n + 1))
	if [ "$cli" -gt 0 ] && { [ $((n % cli)) -eq 0 ] || [ "$i" = "$last" ]; }; then
		got=$(timeout 30 memfs cat "/workload/$name/f$i" 2>/dev/null | sha256sum | cut -d' ' -f1)
		if [ "$got" != "$sum" ]; then
			report "f$i via memfs cat: got $got want $sum"
			continue
		fi
	fi
	ok=$((ok + 1))
done </state/acked
echo "verify: $ok ok, $bad bad"
[ "$bad" -eq 0 ]
