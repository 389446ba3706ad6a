#!/usr/bin/env bash
# Creates and tar extraction through the two FUSE bindings, alternating, on
# one fresh local cluster: a bazil.org/fuse mount and a go-fuse mount of it
# side by side, each round running fio's filecreate and `tar -x` on one
# mount, then on the other. Alternating matters: the second extraction of a
# round ran 40% slower than the first whichever binding ran it (see
# docs/benchmarks.md, "Two bindings").
#
#   fuse/bench/bindings.sh [memfs-binary]
#
# Run it as root from the repository root; needs fio and fusermount3.
# Environment: ROUNDS (default 3), FILES (default 1000) per create job and
# in the tar (4.5 KiB each, directories of 100), ORDER (default
# "bazil gofuse") within a round, BASE_PORT (default random).
set -euo pipefail
BIN=$(realpath "${1:-$(command -v memfs)}")
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-1000}
ORDER=${ORDER:-bazil gofuse}
base=${BASE_PORT:-$((20000 + RANDOM % 20000))}
work=$(mktemp -d /tmp/memfs-bindings-XXXXXX)
export MEMFS_CLUSTER="127.0.0.1:$((base+1)),127.0.0.1:$((base+2)),127.0.0.1:$((base+3))"

up=
cleanup() {
  set +e
  for b in $ORDER; do fusermount3 -u "$work/$b" 2>/dev/null || fusermount3 -uz "$work/$b" 2>/dev/null; done
  [ -n "$up" ] && kill "$up" && wait "$up" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# The tar: FILES files of 4.5 KiB in directories of 100.
mkdir -p "$work/src"
for ((d = 0; d < (FILES + 99) / 100; d++)); do
  mkdir "$work/src/d$d"
  head -c $((100 * 4608)) /dev/urandom | (cd "$work/src/d$d" && split -a 2 -d -b 4608 - f)
done
tar -C "$work/src" -cf "$work/tree.tar" .

"$BIN" up --nodes 3 --dir "$work/data" --base-port "$base" >"$work/up.log" 2>&1 &
up=$!
for _ in $(seq 600); do grep -q "is up" "$work/up.log" && break; sleep 0.1; done
grep -q "is up" "$work/up.log" || { cat "$work/up.log"; exit 1; }
# The cluster speaks TLS with the certificates `up` made (its printed
# export line); every command and mount needs them.
eval "$(sed -n 's/^ *\(export MEMFS_CA=.*\)$/\1/p' "$work/up.log" | head -1)"
for b in $ORDER; do
  mkdir "$work/$b"
  "$BIN" mount --daemon --binding "$b" --log "$work/$b.log" "$work/$b" >/dev/null
done

echo "| round | binding | creates/s, 1 job | tar -x $FILES files (s) | load |"
echo "|---|---|---|---|---|"
for ((r = 1; r <= ROUNDS; r++)); do
  for b in $ORDER; do
    # Both mounts show one tree: each binding works in its own names.
    m=$work/$b
    mkdir "$m/$b-c$r" "$m/$b-t$r"
    c=$(fio --name=c --directory="$m/$b-c$r" --ioengine=filecreate --nrfiles="$FILES" --filesize=4k --bs=4k \
      --openfiles=1 --create_on_open=1 --output-format=terse --terse-version=3 | awk -F';' '{print $8}')
    t0=$(date +%s.%N)
    tar -C "$m/$b-t$r" -xf "$work/tree.tar"
    t1=$(date +%s.%N)
    printf '| %d | %s | %s | %s | %s |\n' "$r" "$b" "$c" \
      "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')" "$(cut -d' ' -f1 /proc/loadavg)"
  done
done
