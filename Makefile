# xlb — see README.md. Every target installs what it needs (scripts/install-deps.sh).
GO      ?= go
BIN     := bin
PKGS    := ./...
TESTFLAGS ?= -count=1 -timeout 30m

.PHONY: all deps build test vet fmt check-fmt generate check-generate demo bench bench-ebpf clean

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

# The eBPF objects (bpf/*.c -> internal/dataplane/ebpf/xlb_bpfel.{go,o}) with
# bpf2go; the generated files are committed.
generate: deps
	$(GO) generate ./internal/dataplane/ebpf

# Fails when the committed generated files differ from what the sources give.
check-generate: generate
	@git diff --exit-code --stat -- 'internal/dataplane/ebpf/*_bpfel.*' || { echo "generated eBPF files are stale: run make generate and commit"; exit 1; }
	@out=$$(git status --porcelain --untracked-files=all -- 'internal/dataplane/ebpf/*_bpfel.*'); if [ -n "$$out" ]; then echo "untracked generated files:"; echo "$$out"; exit 1; fi

# The whole suite. Privileged tests (namespaces, nftables) run as root; with
# XLB_PRIVILEGED_TESTS=1 (as in CI) they fail instead of skipping. check-generate
# fails when the committed bpf2go output differs from what bpf/*.c gives.
test: build vet check-fmt check-generate
	$(GO) test $(TESTFLAGS) $(PKGS)

demo: build
	scripts/demo.sh

bench: build
	bench/run.sh

# ns/packet of the eBPF program (BPF_PROG_TEST_RUN) at 1k..4M connections;
# writes bench/results/ebpf-conntrack.md. Root.
bench-ebpf: deps
	bench/ebpf.sh

clean:
	rm -rf $(BIN)
