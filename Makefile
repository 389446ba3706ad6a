# MemoryFS build and test entry points. `make test` is what CI runs.
GO      ?= go
BIN     ?= bin/memfs

.PHONY: build test check vet proto clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/memfs

test:
	./scripts/test.sh

check: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

proto:
	cd memfspb && PATH=$$PATH:$$($(GO) env GOPATH)/bin $(GO) generate ./

clean:
	rm -rf bin

# The fault-injection soak (test/, docs/testing.md): random scenarios over
# many seeds, in-process and with real processes. Sizes: MEMFS_SOAK_HISTORIES
# (1000), MEMFS_SOAK_PROC_HISTORIES (100), MEMFS_SOAK_PHASES, MEMFS_SOAK_SECONDS;
# violations are saved under $$MEMFS_TEST_OUT (default $$TMPDIR/memfs-test-out).
CHAOS_LOG ?= $(or $(TMPDIR),/tmp)/memfs-chaos.log
.PHONY: chaos
chaos:
	@echo "soak running; full log in $(CHAOS_LOG)"
	@$(GO) test -tags chaos -count=1 -timeout 0 -run TestSoak -v ./test/chaos/ ./test/procs/ >$(CHAOS_LOG) 2>&1; \
	status=$$?; grep -E -A20 'soak summary:|process soak:' $(CHAOS_LOG); \
	grep -E '^(--- FAIL|FAIL|ok)|NOT linearizable|LOST|TORN' $(CHAOS_LOG); exit $$status
