# bex — see README.md. Every target installs what it needs first (hack/tools.sh is
# idempotent and takes seconds once the daemons are built).

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GO_LDFLAGS := -X main.version=$(VERSION)
# A whole `make test` runs envtest, containerd and buildkitd; cold it fits well inside CI's 90 minutes.
TEST_TIMEOUT ?= 45m

.PHONY: all run test bench build image generate tools lint

all: build

## tools: install Debian packages and build the daemons into bin/, those of tests
## and clusters included (idempotent; `hack/tools.sh run` is what bex up needs alone)
tools:
	@bash hack/tools.sh

## build: build bin/bex
build:
	@mkdir -p bin
	go build -ldflags "$(GO_LDFLAGS)" -o bin/bex ./cmd/bex

## image: build the bex container image (hack/image/Dockerfile) with the project's
## BuildKit into bin/bex-image.tar (OCI archive; IMAGE_OUTPUT=FILE elsewhere);
## BUILDKIT_HOST=... uses a running buildkitd
IMAGE_OUTPUT ?= bin/bex-image.tar
image: tools
	go run ./hack/image --version $(VERSION) --output $(IMAGE_OUTPUT)

## generate: regenerate the CRDs and deepcopy functions from deployer/api
generate:
	cd deployer && go tool controller-gen object paths=./api/... crd output:crd:dir=./api/crds

## run: install what bex up needs (and only that), build, start bex on this machine
run:
	@bash hack/tools.sh run
	@$(MAKE) --no-print-directory build
	@bash hack/run.sh

# go test runs packages in the order it is given them, two at a time on two
# cores: the slowest go first, so that none of them starts last and runs alone
# while the other core idles (in ./...'s order infra/cluster starts near the
# end, and its 11 minutes ran past the rest). Keep it in the order testtimes prints.
SLOWEST_TESTS := ./infra/capd ./cmd/bex/e2e ./infra/cluster ./deployer/runtime/local ./builder/plan \
	./infra ./builder ./cmd/bex ./gitserver ./cmd/bex/up ./internal/machine/baseimage

## test: install what is missing, then run every test (real daemons included); it
## ends with each package's wall time, slowest first (hack/testtimes), and keeps
## go test's JSON events in bin/test.json for a closer look at the run
test: tools lint
	@go build -o bin/testtimes ./hack/testtimes
	set -o pipefail; go test -count=1 -json -timeout $(TEST_TIMEOUT) $(SLOWEST_TESTS) ./... 2>&1 | tee bin/test.json | bin/testtimes

## bench: benchmarks, each reported beside a baseline measured in the same run
bench: tools
	go test -run '^$$' -bench . -benchtime 3x -timeout 30m ./...

## lint: gofmt and go vet
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
