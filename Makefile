# xlb — see README.md. Every target installs what it needs (scripts/install-deps.sh).
GO      ?= go
BIN     := bin
PKGS    := ./...
TESTFLAGS ?= -count=1 -timeout 30m

.PHONY: all deps build test vet staticcheck fmt check-fmt generate check-generate kube-binaries demo bench bench-quick bench-datapath bench-conntable bench-converge bench-health bench-dashboard bench-rulescale bench-charts bench-ebpf bench-ebpf-cpu bench-kube bench-ha clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(GO) build -o $(BIN)/xlb ./cmd/xlb
	$(GO) build -o $(BIN)/xlb-kube-proxy ./cmd/xlb-kube-proxy
	$(GO) build -tags kubecrd -o $(BIN)/xlb-kube-daemon ./cmd/xlb
	$(GO) build -o $(BIN)/xlb-echo ./test/cmd/xlb-echo

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags kubecrd ./cmd/xlb

# staticcheck is a tool dependency in go.mod (like bpf2go), so every machine
# runs the same version.
staticcheck:
	$(GO) tool staticcheck $(PKGS)
	$(GO) tool staticcheck -tags kubecrd ./cmd/xlb

# Go with gofmt, bpf/*.c and *.h with clang-format (bpf/.clang-format).
fmt:
	gofmt -w $$(git ls-files '*.go')
	clang-format -i $$(git ls-files 'bpf/*.c' 'bpf/*.h')

check-fmt: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@clang-format --dry-run --Werror $$(git ls-files 'bpf/*.c' 'bpf/*.h') || { echo "clang-format needed: run make fmt"; exit 1; }

# The eBPF objects (bpf/*.c -> internal/dataplane/ebpf/xlb_bpfel.{go,o}) with
# bpf2go; the generated files are committed.
generate: deps
	$(GO) generate ./internal/dataplane/ebpf ./internal/kube/crd ./internal/health

# Fails when the committed generated files differ from what the sources give.
check-generate: generate
	@git diff --exit-code --stat -- 'internal/dataplane/ebpf/*_bpfel.*' 'internal/health/*_bpfel.*' || { echo "generated eBPF files are stale: run make generate and commit"; exit 1; }
	@out=$$(git status --porcelain --untracked-files=all -- 'internal/dataplane/ebpf/*_bpfel.*' 'internal/health/*_bpfel.*'); if [ -n "$$out" ]; then echo "untracked generated files:"; echo "$$out"; exit 1; fi

# etcd and kube-apiserver for test/kube, built from the Go module proxy into
# ~/.cache/xlb/kube/<version>/ (a cold build takes ~8-10 minutes, a warm run
# well under a second).
kube-binaries:
	@scripts/kube-binaries.sh etcd kube-apiserver >/dev/null

# The whole suite. Privileged tests (namespaces, nftables, eBPF, a real
# kube-apiserver) run as root; with XLB_PRIVILEGED_TESTS=1 (as in CI) they fail
# instead of skipping. check-generate fails when the committed bpf2go output
# differs from what bpf/*.c gives.
test: build vet staticcheck check-fmt check-generate kube-binaries
	$(GO) test $(TESTFLAGS) $(PKGS)

demo: build
	scripts/demo.sh

# Benchmarks (bench/run.sh; results and charts in bench/results/). bench is
# the whole suite: every part of bench/run.sh, then the eBPF program's
# ns/packet (bench/ebpf.sh) and the Kubernetes service proxy (bench/kube.sh)
# (an hour or more, run it on a quiet machine); bench-quick a smoke run of
# every bench/run.sh part in under 3 minutes, results in bench/results/quick/.
bench: build kube-binaries
	bench/run.sh
	bench/ebpf.sh
	bench/ebpf-cpu.sh
	bench/kube.sh

bench-quick: build
	bench/run.sh --quick

bench-datapath: build
	bench/run.sh datapath charts

bench-converge: build
	bench/run.sh converge charts

bench-conntable: build
	bench/run.sh conntable charts

bench-health: build
	bench/run.sh health

# Several balancers as one (docs/ha.md): failover of long-lived connections
# through 2-3 xlb nodes behind BIRD's ECMP, per mode, plane and sync.
bench-ha: deps
	bench/ha/run.sh

# The picture of the Grafana dashboard in docs/img/dashboard.png (a 4-minute run
# with Prometheus scraping xlb; see docs/observability.md).
bench-dashboard: build
	$(GO) build -o $(BIN)/dashboard ./bench/dashboard
	$(BIN)/dashboard -xlb $(BIN)/xlb -echo $(BIN)/xlb-echo -out docs/img/dashboard.png

bench-rulescale: build
	bench/run.sh rulescale charts

# Redraw the charts from the JSON results without measuring again.
bench-charts:
	$(GO) run ./bench/charts -dir bench/results

# ns/packet of the eBPF program (BPF_PROG_TEST_RUN) at 1k..4M connections;
# writes bench/results/ebpf-conntrack.md. Root.
bench-ebpf: deps
	bench/ebpf.sh

# CPU per packet in the LB, eBPF plane vs nft plane, in the same run; writes
# bench/results/ebpf-vs-nft-cpu.md. Root.
bench-ebpf-cpu: deps
	bench/ebpf-cpu.sh

# Kubernetes service proxy: endpoint change -> live at 1k/10k Services.
bench-kube: build
	bench/kube.sh

clean:
	rm -rf $(BIN)
