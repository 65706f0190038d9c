#!/usr/bin/env bash
# A/B of the eBPF plane's policy check: two builds' test binaries of
# internal/dataplane/ebpf (OLD and NEW, e.g. main's and this branch's, each
# with tables_hit_bench_test.go), ROUNDS rounds taking turns:
#   BenchmarkTablesHit           the program's own ns per packet of a tracked
#                                flow (BPF_PROG_TEST_RUN), no list / 1k / 1M
#   BenchmarkTablesStateless     the program's own ns per packet of a
#                                stateless farm's policy check (no policies
#                                / empty list / 1k / 1M)
#   BenchmarkTablesLBCPU/n=1M    the LB's CPU per packet through veth pairs
#                                (ebpf-list against ebpf-0, stls-list against
#                                stls-0: the rate ratios)
# Raw output goes to OUT/tables-ab-old.txt and -new.txt (OUT: bench/results
# by default); the summary (medians, Welch's 95 % confidence of each
# difference) is
#   go run ./bench/tablesreport -ab -dir OUT
# Needs root; each run takes the shared lock (XLB_LOCK) by itself.
#   OLD=/tmp/old/ebpf.test NEW=/tmp/new/ebpf.test ROUNDS=5 bench/tables-ab.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/tables-ab.sh: run as root (namespaces, eBPF)" >&2; exit 1; }
: "${OLD:?the old build's ebpf test binary}" "${NEW:?the new build's ebpf test binary}"
ROUNDS=${ROUNDS:-5}
PKTS=${PKTS:-30000}
LOCK=${XLB_LOCK:-/tmp/xlb-privtest.lock}
OUT=$(realpath "${OUT:-bench/results}")
mkdir -p "$OUT"
run() { # which binary bench benchtime
	(cd internal/dataplane/ebpf && XLB_PRIVILEGED_TESTS=1 flock "$LOCK" timeout 900 "$2" -test.run '^$' -test.bench "$3" \
		-test.benchtime "$4" -test.count 1) | grep -E '^Benchmark' | tee -a "$OUT/tables-ab-$1.txt"
}
for r in $(seq "$ROUNDS"); do
	# Alternate which build goes first, so a drift in the machine's load
	# does not always favour the same one.
	if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
	for w in $order; do
		bin=$OLD
		[ "$w" = new ] && bin=$NEW
		run "$w" "$bin" '^BenchmarkTablesHit$' 400x
		run "$w" "$bin" '^BenchmarkTablesStateless$' 4000x
		run "$w" "$bin" '^BenchmarkTablesLBCPU$/^n=1000000$' "${PKTS}x"
	done
done
