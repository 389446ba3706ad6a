#!/usr/bin/env bash
# fsx (the file-system exerciser: random reads, writes, truncates and
# mapped reads and writes of one file, every result checked against a copy
# in memory) through MemoryFS mounts: compiles the given fsx source in a
# fresh temporary directory (never inside the repository), starts a fresh
# local 3-node cluster (`memfs up`), mounts it and runs fsx on a file in
# the mount. With MOUNTS=2 a second mount of the same cluster, through
# another node, is made and fsx is given the file's path in both, so that
# each operation goes through one of the two mounts at random: every read
# checks what the other mount wrote before it. Ends with one line
#
#   fsx: binding=<b> mounts=<n> ops=<n> seed=<n> result=<A-OK|FAILED> (<ops/s>)
#
# and exits non-zero when fsx failed or a mount's log reports a panic or a
# buffered operation lost at commit. Results: docs/testing.md, "fsx".
#
#   fuse/conformance/fsx.sh FSX_SOURCE [path/to/memfs]
#
# FSX_SOURCE is a classic single-file fsx, e.g. the Linux Test Project's
# testcases/kernel/fs/fsx-linux/fsx-linux.c before its 2023 rewrite for the
# LTP library (commit 9001512e0 of https://github.com/linux-test-project/ltp);
# this script fetches nothing. memfs defaults to `command -v memfs`. Run it
# as root (it mounts FUSE); needs gcc and fusermount3.
#
# Environment: OPS (default 100000) operations; SEED (default 1); MOUNTS (1
# or 2); FSX_FLAGS (default "-q -l 1048576 -o 131072", see fsx's usage)
# goes to fsx; BINDING (default gofuse; or bazil) and MOUNT_FLAGS (e.g.
# "--sync") go to every mount; BASE_PORT (default random) for the cluster;
# KEEP=1 leaves the temporary directory (cluster data, the mounts' logs,
# fsx's .fsxlog and .fsxgood on failure).
set -euo pipefail

usage() { echo "usage: $0 FSX_SOURCE [path/to/memfs]" >&2; exit 2; }
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
SRC=$1
if [ ! -f "$SRC" ] || ! grep -q 'A-OK' "$SRC"; then
  echo "$0: $SRC does not look like an fsx source (no \"A-OK\" in it)" >&2
  exit 2
fi
BIN=${2:-$(command -v memfs || true)}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then echo "$0: no memfs binary (give its path)" >&2; usage; fi
BIN=$(realpath "$BIN")
SRC=$(realpath "$SRC")
if [ "$(id -u)" -ne 0 ]; then echo "$0: must run as root (it mounts FUSE)" >&2; exit 2; fi
for t in gcc fusermount3; do
  command -v $t >/dev/null || { echo "$0: missing $t (Debian packages gcc, fuse3)" >&2; exit 2; }
done

OPS=${OPS:-100000}
SEED=${SEED:-1}
MOUNTS=${MOUNTS:-1}
FSX_FLAGS=${FSX_FLAGS:--q -l 1048576 -o 131072}
case $MOUNTS in 1 | 2) ;; *) echo "$0: MOUNTS must be 1 or 2" >&2; exit 2 ;; esac

# shellcheck source=cluster.sh
. "$(dirname "$0")/cluster.sh"
conf_init fsx

# -w: the historical source trips warnings of newer compilers; it calls
# basename(3) without its header, which -include supplies (an int-returning
# implicit declaration truncates the pointer).
if ! gcc -O2 -w -include libgen.h -o "$work/fsx" "$SRC" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  echo "$0: building fsx failed" >&2
  exit 1
fi

conf_up
conf_mount "$mnt"
paths=("$mnt/fsx/file")
mkdir "$mnt/fsx"
if [ "$MOUNTS" = 2 ]; then
  # Through the third node, as a second host would.
  MEMFS_CLUSTER="127.0.0.1:$((base+3))" conf_mount "$work/mnt2"
  paths+=("$work/mnt2/fsx/file")
fi

echo "binding $BINDING, memfs $BIN, cluster $MEMFS_CLUSTER, ${paths[*]}" >&2
start=$(date +%s.%N)
rc=0
# shellcheck disable=SC2086 # FSX_FLAGS is a list of flags
"$work/fsx" $FSX_FLAGS -N "$OPS" -S "$SEED" -P "$work" "${paths[@]}" >"$work/fsx.out" 2>&1 || rc=$?
end=$(date +%s.%N)
tail -20 "$work/fsx.out"
cd /
conf_unmount
conf_mount_verdict
result=FAILED
if [ "$rc" -eq 0 ] && grep -q 'All operations completed A-OK' "$work/fsx.out"; then result=A-OK; fi
rate=$(awk -v n="$OPS" -v a="$start" -v b="$end" 'BEGIN{printf "%.0f ops/s", n/(b-a)}')
echo "fsx: binding=$BINDING mounts=$MOUNTS ops=$OPS seed=$SEED result=$result ($rate)"
if [ "$result" != A-OK ] || [ "$lost" -gt 0 ]; then
  [ "$result" = A-OK ] || KEEP=1
  exit 1
fi
