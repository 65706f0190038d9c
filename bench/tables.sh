#!/usr/bin/env bash
# Named tables: what a deny list costs a packet on each plane against a
# plain nftables set (BenchmarkTablesLBCPU, internal/dataplane/ebpf/
# tables_lbcpu_test.go), and the eBPF plane's table operations
# (BenchmarkTablesEBPF): ROUNDS rounds each, raw output appended to
# bench/results/tables-lbcpu.txt and tables-ebpf-bench.txt; the summary is
# written by hand into bench/results/tables.md (medians, spreads, 95 %
# confidence of differences: bench/internal/stats). Needs root.
#   bench/tables.sh
#   ROUNDS=3 PKTS=30000 bench/tables.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/tables.sh: run as root (namespaces, eBPF)" >&2; exit 1; }
ROUNDS=${ROUNDS:-5}
PKTS=${PKTS:-30000}
bin=$(mktemp -d)/ebpf.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
go test -c -o "$bin" ./internal/dataplane/ebpf
for r in $(seq "$ROUNDS"); do
	(cd internal/dataplane/ebpf && XLB_PRIVILEGED_TESTS=1 timeout 900 "$bin" -test.run '^$' -test.bench '^BenchmarkTablesLBCPU$' \
		-test.benchtime "${PKTS}x" -test.count 1) | grep -E '^BenchmarkTablesLBCPU' | tee -a bench/results/tables-lbcpu.txt
	(cd internal/dataplane/ebpf && XLB_PRIVILEGED_TESTS=1 timeout 900 "$bin" -test.run '^$' -test.bench '^BenchmarkTablesEBPF$' \
		-test.benchtime 5x -test.count 1) | grep -E '^BenchmarkTablesEBPF' | tee -a bench/results/tables-ebpf-bench.txt
done
