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
go test -race -count=1 -timeout 20m $(go list ./fsm/... ./server/... ./client/... ./fuse/... ./cmd/... 2>/dev/null)

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
