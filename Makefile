# MemoryFS build and test entry points. `make test` is what CI runs.
GO      ?= go
BIN     ?= bin/memfs
PKGS_RACE = ./fsm/... ./server/... ./client/... ./fuse/...

.PHONY: build up test check vet race unit fuzz-seeds proto clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/memfs

# A local three-node cluster on loopback; Ctrl-C stops it.
up: build
	./$(BIN) up --nodes 3

test:
	./scripts/test.sh

check: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

proto:
	cd proto && PATH=$$PATH:$$($(GO) env GOPATH)/bin $(GO) generate ./

clean:
	rm -rf bin
