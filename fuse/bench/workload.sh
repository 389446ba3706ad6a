#!/usr/bin/env bash
# Real programs through the mount: one workload of ordinary tools on a
# source tree, timed step by step, side by side on
#
#   tmpfs           a tmpfs directory itself (the limit),
#   passthrough_ll  libfuse3's passthrough_ll example over tmpfs (C, libfuse3),
#   memfs           a MemoryFS mount (--binding bazil: bazil.org/fuse) of a
#                   fresh local 3-node cluster,
#   memfs_gofuse    a mount of the same cluster served by go-fuse,
#   memfs_X         (any X, only when named in ONLY or EXTRA_TARGETS) a mount
#                   with $MOUNT_FLAGS_X added, e.g. memfs_nocaps with
#                   MOUNT_FLAGS_NOCAPS (memfs_gofuse is MOUNT_FLAGS_GOFUSE,
#                   default "--binding gofuse").
#
# The steps, each in a new directory W of the target, every program's output
# to a file in the work dir (not /dev/null: GNU grep stops at the first match
# when its output is /dev/null):
#
#   tar -xf          the tarball of TREE into W/src
#   ls -lR W/src
#   grep -r          'func ' in W/src, twice (first and again)
#   cp -a            W/src to W/copy
#   git              init + add -A + commit in W/src (git's defaults)
#   git status       in W/src
#   small files      SMALLFILES files of 1 KiB made by a loop in this bash
#                    process (printf builtin > file: open O_CREAT|O_TRUNC,
#                    one write, close), in W/small
#   stat             of those files, one stat(1) process naming all of them
#   rm -rf W
#
# and checks each cheaply against a reference extraction on tmpfs: ls's
# and grep's line counts, files and bytes of the copy, the commit's tree
# hash (every byte and mode of the extracted tree), an empty status, the
# extracted tree's files and bytes (after git status, so that no check's
# stats warm the kernel's caches for a timed step), the small files' sizes
# from stat's own output, the target left as it was after rm. A failed
# step or check stops the run with its error.
# With ROUNDS > 1 the targets alternate round by round (tmpfs,
# passthrough_ll, memfs, memfs_gofuse, tmpfs, ...). Each memfs target is
# mounted (memfs mount --daemon) for its turn and unmounted after it, so
# an idle mount never receives the other's change events. Ends with a
# markdown table: seconds per step and target; the rounds' figures
# separated by commas up to 3 rounds, from 4 rounds "median (min-max)".
#
#   fuse/bench/workload.sh path/to/memfs
#   flock /tmp/memfs-bench.lock fuse/bench/workload.sh ./memfs   # as documented
#
# Run it as root (it mounts a tmpfs and FUSE file systems); needs
# fusermount3, git, gcc, pkg-config and libfuse3-dev (for passthrough_ll).
#
# Environment: SRC (default /usr/local/go/src) and TREE (default "net go
# encoding os image archive text html fmt io strings bufio": 1,780 files
# (14.0 MB) in 146 directories with Go 1.26), directories under SRC packed once
# into the tarball; ROUNDS (default 1); SMALLFILES (default 1000); ONLY
# (default "tmpfs passthrough_ll memfs memfs_gofuse") the targets, in this
# order, and EXTRA_TARGETS added after them; MOUNT_FLAGS to every memfs
# mount, MOUNT_FLAGS_X to target memfs_X; LOG_STORE (default bolt);
# BASE_PORT (default random); TMPFS_SIZE (default 4G) of the tmpfs that
# holds the tarball and the two baselines; WORK (default a new /tmp/memfs-workload-*);
# KEEP=1 leaves the work dir (logs, per-round figures in raw.tsv).
set -euo pipefail
export LC_ALL=C
usage="usage: $0 path/to/memfs   (as root; env ROUNDS TREE SRC SMALLFILES ONLY EXTRA_TARGETS MOUNT_FLAGS MOUNT_FLAGS_<X> LOG_STORE BASE_PORT TMPFS_SIZE WORK KEEP)"
[ $# -eq 1 ] && [ -x "$1" ] || { echo "$usage" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$0: run it as root (it mounts a tmpfs)" >&2; exit 2; }

# The command as given, with the settings that came from the environment.
cmdline=
for v in $(compgen -e | grep -E '^(ROUNDS|TREE|SRC|SMALLFILES|ONLY|EXTRA_TARGETS|MOUNT_FLAGS.*|LOG_STORE|BASE_PORT|TMPFS_SIZE|WORK|KEEP)$' | sort); do
  if [[ ${!v} =~ ^[A-Za-z0-9_./:,=+-]*$ ]]; then cmdline+="$v=${!v} "; else cmdline+="$v='${!v//\'/\'\\\'\'}' "; fi
done
cmdline+="$0 $1"

BIN=$(realpath "$1")
SRC=${SRC:-/usr/local/go/src}
TREE=${TREE:-net go encoding os image archive text html fmt io strings bufio}
ROUNDS=${ROUNDS:-1}
SMALLFILES=${SMALLFILES:-1000}
ONLY=${ONLY:-tmpfs passthrough_ll memfs memfs_gofuse}
LOG_STORE=${LOG_STORE:-bolt}
MOUNT_FLAGS_GOFUSE=${MOUNT_FLAGS_GOFUSE---binding gofuse}
targets=()
for t in $ONLY ${EXTRA_TARGETS:-}; do
  case $t in
  tmpfs | passthrough_ll) ;;
  memfs | memfs_[a-z0-9]*) [[ $t =~ ^memfs(_[a-z0-9_]+)?$ ]] || { echo "$0: bad target $t" >&2; exit 2; } ;;
  *) echo "$0: unknown target $t (tmpfs, passthrough_ll, memfs, memfs_X)" >&2; exit 2 ;;
  esac
  [[ " ${targets[*]:-} " == *" $t "* ]] || targets+=("$t")
done
[ ${#targets[@]} -gt 0 ] || { echo "$0: no targets" >&2; exit 2; }
# memfs_X's own mount flags: $MOUNT_FLAGS_X (X upper-cased).
mflags() { # target
  local v
  [ "$1" = memfs ] && { echo "--binding bazil"; return 0; }
  v=MOUNT_FLAGS_$(tr a-z A-Z <<<"${1#memfs_}")
  echo "${!v:-}"
}
heading() { # target
  case $1 in
  memfs) echo "memfs (bazil)" ;;
  memfs_gofuse) echo "memfs (go-fuse)" ;;
  *) echo "$1" ;;
  esac
}
for t in "${targets[@]}"; do
  if [[ $t == memfs_* ]] && [ -z "$(mflags "$t")" ]; then
    echo "# note: $t has no flags of its own (MOUNT_FLAGS_$(tr a-z A-Z <<<"${t#memfs_}") is empty): the same mount as memfs" >&2
  fi
done

repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "${WORK:-}" ]; then mkdir -p "$WORK"; work=$(mktemp -d "$WORK/run-XXXXXX"); else work=$(mktemp -d /tmp/memfs-workload-XXXXXX); fi
base=${BASE_PORT:-$((20000 + RANDOM % 20000))}
cluster="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"
tmpfs=$work/tmpfs
mkdir -p "$tmpfs" "$work/bin"

pids=() mounts=()
cleanup() {
  local rc=$? busy=
  set +e
  for m in "${mounts[@]}"; do
    mountpoint -q "$m" || continue
    fusermount3 -u "$m" 2>/dev/null || { sleep 1; fusermount3 -u "$m" 2>/dev/null; } || fusermount3 -uz "$m"
  done
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  mountpoint -q "$tmpfs" && umount "$tmpfs"
  for m in "${mounts[@]}" "$tmpfs"; do mountpoint -q "$m" && busy+=" $m"; done
  if [ -n "$busy" ]; then
    echo "$0: still mounted:$busy; leaving $work" >&2
  elif [ "${KEEP:-}" = 1 ]; then
    echo "# kept $work" >&2
  else
    rm -rf --one-file-system "$work"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "$0: FAILED: $*" >&2; exit 1; }
waitmount() { # dir
  for _ in $(seq 300); do mountpoint -q "$1" && return 0; sleep 0.1; done
  die "no mount on $1"
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

date0=$(date -u '+%F %T')
load0=$(loadavg)
echo "# $date0 UTC, load average $load0; work dir $work" >&2

mount -t tmpfs -o size=${TMPFS_SIZE:-4G},mode=0755 memfs-workload "$tmpfs"

# ---- the tree, and what every target must show for it ----
for d in $TREE; do [ -d "$SRC/$d" ] || die "no directory $SRC/$d (SRC, TREE)"; done
(cd "$SRC" && tar -cf "$tmpfs/tree.tar" $TREE)
treesum() { # dir [find-expression-before-printf]: regular files, their bytes, directories, symlinks under dir
  find "$1" -mindepth 1 "${@:2}" -printf '%y %s\n' | awk '{n[$1]++; if ($1 == "f") b += $2}
    END {printf "%d files, %d bytes, %d dirs, %d symlinks", n["f"], b, n["d"], n["l"]}'
}
GREP_RE='func '
export GIT_AUTHOR_NAME=workload GIT_AUTHOR_EMAIL=workload@example.invalid
export GIT_COMMITTER_NAME=workload GIT_COMMITTER_EMAIL=workload@example.invalid
export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
gitc() { git -c init.defaultBranch=main "$@"; }
ref=$tmpfs/ref
mkdir "$ref"
tar -C "$ref" -xf "$tmpfs/tree.tar"
ref_sum=$(treesum "$ref")
ref_ls=$(ls -lR "$ref" | wc -l)
ref_grep=$(grep -r "$GREP_RE" "$ref" | wc -l)
gitc -C "$ref" init -q && gitc -C "$ref" add -A && gitc -C "$ref" commit -q -m workload
ref_tree=$(git -C "$ref" rev-parse 'HEAD^{tree}')
rm -rf "$ref"
tree_desc="$ref_sum, from $SRC: $TREE; tarball $(stat -c %s "$tmpfs/tree.tar") bytes"
echo "# tree: $tree_desc" >&2

KIB=$(head -c 768 /dev/urandom | base64 -w0)
[ ${#KIB} = 1024 ] || die "1 KiB string is ${#KIB} bytes"

# ---- targets ----
need_cluster=
for t in "${targets[@]}"; do [[ $t == memfs* ]] && need_cluster=1; done

if [[ " ${targets[*]} " == *" passthrough_ll "* ]]; then
  ex=${LIBFUSE_EXAMPLES:-/usr/share/doc/libfuse3-dev/examples}
  gcc -O2 -Wall -o "$work/bin/passthrough_ll" "$ex/passthrough_ll.c" $(pkg-config fuse3 --cflags --libs)
  mkdir "$tmpfs/pt" "$work/pt"
  # The example's defaults: cache=auto (1 s timeouts), no writeback cache.
  "$work/bin/passthrough_ll" -f -o source="$tmpfs/pt" "$work/pt" 2>"$work/pt.log" &
  pids+=($!); mounts+=("$work/pt"); waitmount "$work/pt"
fi
if [[ " ${targets[*]} " == *" tmpfs "* ]]; then mkdir "$tmpfs/raw"; fi

if [ -n "$need_cluster" ]; then
  "$BIN" up --nodes 3 --dir "$work/data" --base-port "$base" --log-store "$LOG_STORE" >"$work/up.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do grep -q "is up" "$work/up.log" && break; sleep 0.1; done
  grep -q "is up" "$work/up.log" || { cat "$work/up.log" "$work"/data/node*.log 2>/dev/null | tail -50; die "cluster did not come up"; }
  # The cluster speaks TLS with the certificates `up` made (its printed
  # export line); every command and mount needs them.
  eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$work/up.log" | head -1)"
fi

# Where target t's turn works (its mount made now for a memfs target).
begin_target() { # target -> sets T
  case $1 in
  tmpfs) T=$tmpfs/raw ;;
  passthrough_ll) T=$work/pt ;;
  memfs*)
    T=$work/mnt-$1
    mkdir -p "$T"
    # shellcheck disable=SC2046
    "$BIN" --cluster "$cluster" mount --daemon ${MOUNT_FLAGS:-} $(mflags "$1") --log "$work/mount-$1.log" "$T" >/dev/null ||
      die "$1: memfs mount ${MOUNT_FLAGS:-} $(mflags "$1") failed (log: $work/mount-$1.log)"
    mounts+=("$T"); waitmount "$T"
    ;;
  esac
}
end_target() { # target
  case $1 in
  memfs*)
    fusermount3 -u "$T" || { sleep 1; fusermount3 -u "$T"; } || die "$1: cannot unmount $T"
    for _ in $(seq 100); do mountpoint -q "$T" || return 0; sleep 0.1; done
    die "$1: $T still mounted after fusermount3 -u"
    ;;
  esac
}

# ---- the steps ----
steps=(tar ls grep1 grep2 cp git status small stat rm)
declare -A NAME=(
  [tar]="\`tar -x\` of the tree"
  [ls]="\`ls -lR\`"
  [grep1]="\`grep -r\` (first)"
  [grep2]="\`grep -r\` (again)"
  [cp]="\`cp -a\` of the tree"
  [git]="\`git init\` + \`add -A\` + \`commit\`"
  [status]="\`git status\`"
  [small]="$SMALLFILES files of 1 KiB: create+write+close (bash loop)"
  [stat]="\`stat\` of those $SMALLFILES"
  [rm]="\`rm -rf\` of all"
)
declare -A S # S[target,round,step] = seconds

cur= curstep= W=
fail() { # message
  echo "$0: FAILED: $cur, round $r, step ${NAME[$curstep]:-$curstep}: $*" >&2
  [ -s "$work/err" ] && { echo "  stderr (last 20 lines):" >&2; tail -20 "$work/err" | sed 's/^/  | /' >&2; }
  [ -f "$work/mount-$cur.log" ] && { echo "  mount log (last 20 lines):" >&2; tail -20 "$work/mount-$cur.log" | sed 's/^/  | /' >&2; }
  exit 1
}
step() { # key command...: runs it, output to $work/out, errors to $work/err
  local key=$1 t0 t1 rc=0
  shift
  curstep=$key
  t0=$EPOCHREALTIME
  "$@" >"$work/out" 2>"$work/err" || rc=$?
  t1=$EPOCHREALTIME
  [ $rc = 0 ] || fail "exit status $rc: $*"
  S[$cur,$r,$key]=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
}
check() { # what got want
  [ "$2" = "$3" ] || fail "check failed: $1: got \"$2\", want \"$3\""
}

do_git() { gitc -C "$W/src" init -q && gitc -C "$W/src" add -A && gitc -C "$W/src" commit -q -m workload; }
small_files() {
  local i
  for ((i = 1; i <= SMALLFILES; i++)); do printf '%s' "$KIB" >"$W/small/f$i" || return 1; done
}

run_target() { # target round
  cur=$1
  begin_target "$1"
  W=$T/workload-r$r
  local before
  before=$(ls -A "$T")
  mkdir "$W" "$W/src" "$W/small"
  step tar tar -C "$W/src" -xf "$tmpfs/tree.tar"
  step ls ls -lR "$W/src"
  check "ls -lR lines" "$(wc -l <"$work/out")" "$ref_ls"
  step grep1 grep -r "$GREP_RE" "$W/src"
  check "grep -r lines" "$(wc -l <"$work/out")" "$ref_grep"
  step grep2 grep -r "$GREP_RE" "$W/src"
  check "grep -r lines" "$(wc -l <"$work/out")" "$ref_grep"
  step cp cp -a "$W/src" "$W/copy"
  check "the copy" "$(treesum "$W/copy")" "$ref_sum"
  step git do_git
  check "the commit's tree" "$(git -C "$W/src" rev-parse 'HEAD^{tree}' 2>&1)" "$ref_tree"
  step status git -C "$W/src" status --porcelain
  check "git status --porcelain" "$(cat "$work/out")" ""
  # Checked here, not after tar: find's stats would answer ls -lR's from the
  # kernel's caches. The commit's tree above already covered every byte.
  check "the extracted tree" "$(treesum "$W/src" -path "$W/src/.git" -prune -o)" "$ref_sum"
  step small small_files
  # Checked from stat's own output: a check in between would stat them first.
  local files=() i
  for ((i = 1; i <= SMALLFILES; i++)); do files+=("$W/small/f$i"); done
  step stat stat -- "${files[@]}"
  check "stat: files of 1024 bytes" "$(grep -c '^ *Size: 1024 .*regular file$' "$work/out")" "$SMALLFILES"
  step rm rm -rf "$W"
  [ ! -e "$W" ] || fail "$W still exists after rm -rf"
  check "the target after rm -rf" "$(ls -A "$T")" "$before"
  end_target "$1"
  local tot=0 line="# round $r $cur:"
  for s in "${steps[@]}"; do
    line+=" $s ${S[$cur,$r,$s]}"
    tot=$(awk -v a="$tot" -v b="${S[$cur,$r,$s]}" 'BEGIN {printf "%.3f", a + b}')
  done
  S[$cur,$r,total]=$tot
  echo "$line total $tot (load $(loadavg))" >&2
  for s in "${steps[@]}" total; do printf '%s\t%s\t%s\t%s\n' "$r" "$cur" "$s" "${S[$cur,$r,$s]}"; done >>"$work/raw.tsv"
}

for ((r = 1; r <= ROUNDS; r++)); do
  for t in "${targets[@]}"; do run_target "$t"; done
done
date1=$(date -u '+%F %T')
load1=$(loadavg)

# ---- the table ----
cell() { # target step
  local vals=() k
  for ((k = 1; k <= ROUNDS; k++)); do vals+=("${S[$1,$k,$2]}"); done
  if [ "$ROUNDS" -le 3 ]; then
    local IFS=,
    echo "${vals[*]}" | sed 's/,/, /g'
  else
    printf '%s\n' "${vals[@]}" | sort -n | awk '{v[NR] = $1}
      END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
           printf "%.3f (%.3f–%.3f)\n", m, v[1], v[NR]}'
  fi
}
model=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: *//')
rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo
echo "Workload (fuse/bench/workload.sh), $date0 – $date1 UTC"
echo
echo "- machine: $model, nproc $(nproc), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r)"
echo "- load average (1, 5, 15 min): $load0 at the start, $load1 at the end"
echo "- command: \`$cmdline\`"
echo "- memfs binary: $BIN (sha256 $(sha256sum "$BIN" | cut -c1-12)), checkout at $rev when run; cluster: 3 nodes (\`memfs up\`), log store $LOG_STORE"
for t in "${targets[@]}"; do
  [[ $t == memfs* ]] && echo "- $t: \`memfs mount --daemon ${MOUNT_FLAGS:+$MOUNT_FLAGS }$(mflags "$t")\`" | sed 's/ `$/`/'
done
echo "- tree: $tree_desc"
if [ "$ROUNDS" -le 3 ]; then
  echo "- seconds per step; $ROUNDS round(s), targets alternating within each round, rounds in order"
else
  echo "- seconds per step: median (min–max) of $ROUNDS rounds, targets alternating within each round"
fi
echo
hdr="| step |" sep="|---|"
for t in "${targets[@]}"; do hdr+=" $(heading "$t") |"; sep+="---|"; done
echo "$hdr"
echo "$sep"
for s in "${steps[@]}" total; do
  if [ "$s" = total ]; then line="| **total** |"; else line="| ${NAME[$s]} |"; fi
  for t in "${targets[@]}"; do line+=" $(cell "$t" "$s") |"; done
  echo "$line"
done
