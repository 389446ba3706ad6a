#!/usr/bin/env bash
# pjdfstest (the FreeBSD/Linux POSIX file-system test suite) through a
# MemoryFS mount: copies the suite's source into a fresh temporary directory
# (never inside the repository), builds it there (autoreconf -ifs,
# ./configure, make pjdfstest), starts a fresh local 3-node cluster
# (`memfs up`), mounts it (`memfs mount --daemon --allow-other`) and runs
# `prove -r` of the suite's tests from a directory inside the mount. Ends
# with prove's summary and one line
#
#   pjdfstest: binding=<b> files=<n> tests=<n> failed=<n> (failing files)
#
# and exits non-zero when any test failed or the mount's log reports a
# buffered operation lost at commit (the suite sees only the mount's
# answers, not what the cluster then kept). Results: docs/fuse.md,
# "Conformance (pjdfstest)".
#
#   fuse/conformance/pjdfstest.sh SUITE_SRC_DIR [path/to/memfs]
#
# SUITE_SRC_DIR is a checkout of https://github.com/pjd/pjdfstest (this
# script fetches nothing); memfs defaults to `command -v memfs`. Run it as
# root (the suite changes owners and switches users); needs autoconf,
# automake, gcc, make, perl (prove), timeout and fusermount3.
#
# Environment: BINDING (default gofuse; or bazil) for the mount; MOUNT_FLAGS
# (e.g. "--caps=false") goes to the mount; TESTS (e.g. "tests/chmod
# tests/rename", relative to SUITE_SRC_DIR; default "tests") limits the run;
# FILE_TIMEOUT (default 120) seconds per test file, after which it is killed
# and counted as failing; PROVE_FLAGS (e.g. "-v": every check with what it
# tried, expected and got) goes to prove; BASE_PORT (default random) for
# the cluster; KEEP=1 leaves the temporary directory (cluster data, mnt.log, prove.log).
set -euo pipefail

usage() { echo "usage: $0 SUITE_SRC_DIR [path/to/memfs]" >&2; exit 2; }
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
SRC=$1
if [ ! -f "$SRC/pjdfstest.c" ] || [ ! -f "$SRC/tests/misc.sh" ]; then
  echo "$0: $SRC does not look like the pjdfstest source (no pjdfstest.c, tests/misc.sh)" >&2
  exit 2
fi
BIN=${2:-$(command -v memfs || true)}
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then echo "$0: no memfs binary (give its path)" >&2; usage; fi
BIN=$(realpath "$BIN")
SRC=$(realpath "$SRC")

if [ "$(id -u)" -ne 0 ]; then
  echo "$0: must run as root: pjdfstest changes owners, switches users and mounts FUSE with allow_other" >&2
  exit 2
fi

missing=
need() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }
need autoreconf autoconf
need aclocal automake
need gcc gcc
need make make
need prove perl
need timeout coreutils
need fusermount3 fuse3
if [ -n "$missing" ]; then
  echo "$0: missing tools; install the Debian packages:$missing" >&2
  exit 2
fi

# shellcheck source=cluster.sh
. "$(dirname "$0")/cluster.sh"
FILE_TIMEOUT=${FILE_TIMEOUT:-120}
TESTS=${TESTS:-tests}
conf_init pjdfstest

# Build the suite in a copy: it leaves its objects, configure output and the
# pjdfstest binary next to the tests, where tests/misc.sh looks for it (the
# first directory above the test file holding an executable pjdfstest).
cp -a "$SRC/." "$work/src"
echo "building pjdfstest in $work/src" >&2
if ! (cd "$work/src" && autoreconf -ifs && ./configure && make pjdfstest) >"$work/build.log" 2>&1; then
  tail -30 "$work/build.log" >&2
  echo "$0: building pjdfstest failed" >&2
  exit 1
fi

conf_up
conf_mount "$mnt" --allow-other

# prove has no timeout: it runs every test file through this wrapper.
cat >"$work/run-one.sh" <<'EOF'
#!/bin/sh
timeout -k 10 "$PJD_FILE_TIMEOUT" sh "$1"
rc=$?
[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "$1" >>"$PJD_TIMEOUTS"
exit $rc
EOF
chmod +x "$work/run-one.sh"
export PJD_FILE_TIMEOUT=$FILE_TIMEOUT PJD_TIMEOUTS=$work/timeouts
: >"$work/timeouts"
unset dir # tests/misc.sh takes the suite's directory from it when set

targets=()
for t in $TESTS; do targets+=("$work/src/$t"); done
mkdir "$mnt/pjdfstest"
cd "$mnt/pjdfstest"
echo "binding $BINDING, memfs $BIN, cluster $MEMFS_CLUSTER, mount $mnt" >&2
rc=0
# shellcheck disable=SC2086 # PROVE_FLAGS is a list of flags
prove -r ${PROVE_FLAGS:-} --exec "$work/run-one.sh" "${targets[@]}" 2>&1 | tee "$work/prove.log" || rc=$?
cd /
conf_unmount

files=$(sed -n 's/^Files=\([0-9]*\), Tests=\([0-9]*\),.*/\1/p' "$work/prove.log" | tail -1)
tests=$(sed -n 's/^Files=\([0-9]*\), Tests=\([0-9]*\),.*/\2/p' "$work/prove.log" | tail -1)
# Test Summary Report: one line per file ("path (Wstat: .. Tests: ..
# Failed: n)"), then indented details; a file listed only for "TODO passed"
# did not fail.
failed=$(sed -n '/^Test Summary Report/,$ s/.*(Wstat: .* Failed: \([0-9]*\)).*/\1/p' "$work/prove.log" |
  awk '{s += $1} END {print s + 0}')
failing=$(sed -n '/^Test Summary Report/,$p' "$work/prove.log" | awk '
  /\(Wstat: / { f = $1; if ($0 !~ /Failed: 0\)/) bad[f] = 1; order[++n] = f; next }
  /Non-zero exit status|Parse errors|Failed tests?:/ { if (f != "") bad[f] = 1 }
  END { for (i = 1; i <= n; i++) if (bad[order[i]]) print order[i] }' |
  sed "s|^$work/src/||" | tr '\n' ' ' | sed 's/ $//')
if [ -s "$work/timeouts" ]; then
  echo "timed out after ${FILE_TIMEOUT}s: $(sed "s|^$work/src/||" "$work/timeouts" | tr '\n' ' ')"
fi
conf_mount_verdict
echo "pjdfstest: binding=$BINDING files=${files:-0} tests=${tests:-0} failed=$failed ($failing)"
if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ -n "$failing" ] || [ -z "$files" ] || [ "$lost" -gt 0 ]; then
  exit 1
fi
