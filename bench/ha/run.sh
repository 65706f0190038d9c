#!/usr/bin/env bash
# make bench-ha: several balancers as one, measured (docs/ha.md).
#
# Each case is one run of test/e2e's failover scenario (failover_test.go):
# client -> BIRD (ECMP over BGP) -> two xlb nodes -> three backends, in
# namespaces; CONNS long-lived TCP connections with an echo a second on
# each, and 20 new connections a second; after PHASE the first node is
# killed (kill: kill -9 of its daemon; lost: kill -9 and its links down),
# after another PHASE it comes back, after another a third node is added,
# and PHASE later the run ends. A connection is broken when it sees a
# reset, an EOF or no echo within 2 s. Cases are mode/plane/sync|nosync/kill|lost.
#
# usage: bench/ha/run.sh [CASE...]   (env CONNS=1000 PHASE=8s RUNS=1)
# Results: bench/results/ha.jsonl (one line a run), ha.md, ha.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "bench-ha: run as root (it creates network namespaces)" >&2; exit 1; }
CONNS=${CONNS:-1000}
PHASE=${PHASE:-8s}
RUNS=${RUNS:-1}
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
	cases=()
	for m in dsr stlsdnat snat dnat; do
		for s in sync nosync; do
			cases+=("$m/nft/$s/kill")
		done
	done
	cases+=(snat/nft/sync/lost snat/nft/nosync/lost dnat/nft/sync/lost dsr/nft/nosync/lost)
	for m in dsr stlsdnat snat dnat; do
		cases+=("$m/ebpf/nosync/kill")
	done
fi
out=bench/results/ha.jsonl
: >"$out.new"
for r in $(seq "$RUNS"); do
	for c in "${cases[@]}"; do
		echo "bench-ha: run $r: $c" >&2
		# Each case bounded: 4 phases and set-up, killed after 5 minutes;
		# under the shared lock of privileged tests, one case at a time.
		XLB_PRIVILEGED_TESTS=1 XLB_HA_BENCH="$PWD/$out.new" XLB_HA_CONNS=$CONNS XLB_HA_PHASE=$PHASE XLB_HA_CASES="$c" \
			flock /tmp/xlb-privtest.lock timeout 300 go test -count=1 -timeout 290s ./test/e2e -run 'TestHABench$' >&2 || echo "bench-ha: $c failed" >&2
	done
done
mv "$out.new" "$out"
python3 bench/ha/report.py "$out" bench/results/ha.md bench/results/ha.png
