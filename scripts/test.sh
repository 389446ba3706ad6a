#!/usr/bin/env bash
# The project's test command (README, .ci/run): formatting and vet, the
# race-checked unit and integration tests, the fault-injection suite's CI
# set, and the docker chaos test when a Docker daemon answers.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "gofmt and go vet"
make -s check

step "race-checked packages"
go test -race -count=1 -timeout 20m $(go list ./fsm/... ./server/... ./client/... ./fuse/... ./internal/... ./cmd/... | grep -v '/fuse$')

# The real-mount tests run real programs (git, tar, cp -a) on a mount with
# per-syscall watchdogs; under the race detector's 5-10x slowdown on two
# cores those watchdogs fire, so this package runs without -race (its
# concurrency lives in fuse/fsops and client, which run with it above).
step "FUSE mount tests (bazil.org/fuse binding)"
MEMFS_FUSE_BINDING=bazil go test -count=1 -timeout 20m ./fuse/
step "FUSE mount tests (go-fuse binding)"
MEMFS_FUSE_BINDING=gofuse go test -count=1 -timeout 20m ./fuse/
# The same with every change committed before it is answered (--sync),
# the mode the runs above buffer instead.
step "FUSE mount tests, --sync (bazil.org/fuse binding)"
MEMFS_FUSE_BINDING=bazil MEMFS_FUSE_SYNC=on go test -count=1 -timeout 20m ./fuse/
step "FUSE mount tests, --sync (go-fuse binding)"
MEMFS_FUSE_BINDING=gofuse MEMFS_FUSE_SYNC=on go test -count=1 -timeout 20m ./fuse/

if [ -d test ]; then
  step "fault-injection suite (CI set)"
  go test -count=1 -timeout 15m ./test/...
fi

if [ -f docker/chaos.sh ] && docker info >/dev/null 2>&1; then
  step "docker chaos test"
  make -s -C docker docker-test
else
  step "docker chaos test skipped: no docker daemon answered"
fi
step "all tests passed"
