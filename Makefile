# xlb — see README.md. Every target installs what it needs (scripts/install-deps.sh).
GO      ?= go
BIN     := bin
PKGS    := ./...
TESTFLAGS ?= -count=1 -timeout 30m

.PHONY: all deps build test vet fmt check-fmt demo bench bench-quick bench-datapath bench-converge bench-rulescale bench-charts clean

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

# The whole suite. Privileged tests (namespaces, nftables) run as root; with
# XLB_PRIVILEGED_TESTS=1 (as in CI) they fail instead of skipping.
test: build vet check-fmt
	$(GO) test $(TESTFLAGS) $(PKGS)

demo: build
	scripts/demo.sh

# Benchmarks (bench/run.sh; results and charts in bench/results/). bench is
# the whole suite (tens of minutes, run it on a quiet machine); bench-quick a
# smoke run of every part in under 3 minutes, results in bench/results/quick/.
bench: build
	bench/run.sh

bench-quick: build
	bench/run.sh --quick

bench-datapath: build
	bench/run.sh datapath charts

bench-converge: build
	bench/run.sh converge charts

bench-rulescale: build
	bench/run.sh rulescale charts

# Redraw the charts from the JSON results without measuring again.
bench-charts:
	$(GO) run ./bench/charts -dir bench/results

clean:
	rm -rf $(BIN)
