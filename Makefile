# xlb — see README.md. Every target installs what it needs (scripts/install-deps.sh).
GO      ?= go
BIN     := bin
PKGS    := ./...
TESTFLAGS ?= -count=1 -timeout 30m

.PHONY: all deps build test vet fmt check-fmt demo bench bench-kube kube-binaries clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(GO) build -o $(BIN)/xlb ./cmd/xlb
	$(GO) build -o $(BIN)/xlb-echo ./test/cmd/xlb-echo

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

check-fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# etcd and kube-apiserver for test/kube, built from the Go module proxy into
# ~/.cache/xlb/kube/<version>/ (a cold build takes ~8-10 minutes, a warm run
# well under a second).
kube-binaries:
	@scripts/kube-binaries.sh etcd kube-apiserver >/dev/null

# The whole suite. Privileged tests (namespaces, nftables) run as root; with
# XLB_PRIVILEGED_TESTS=1 (as in CI) they fail instead of skipping.
test: build vet check-fmt kube-binaries
	$(GO) test $(TESTFLAGS) $(PKGS)

demo: build
	scripts/demo.sh

bench: build
	bench/run.sh

# Kubernetes service proxy: endpoint change -> live at 1k/10k Services.
bench-kube: build
	bench/kube.sh

clean:
	rm -rf $(BIN)
