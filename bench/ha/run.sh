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
# reset, an EOF or no echo within 2 s. Cases are
# mode/plane/how/kill|lost[/scheduler] with how one of sync, nosync (xlb's
# BGP and ECMP, with or without its connection sync), vrrp,
# vrrp+conntrackd (the LVS-style baseline: keepalived's VRRP active-backup,
# with conntrackd's FTFW sync; node lost only; vrrp@100ms: adverts every
# 100 ms instead of keepalived's default 1 s), vrrp+sync (keepalived's VRRP
# with xlb's own sync: an LVS + keepalived pair moved to xlb), scheduler
# maglev by default;
# mode snat+shared is snat to a source address the nodes share (each with
# its own --snat-ports), the backends answering through the node whose
# packet came last.
# BASELINE=1 runs the baseline comparison instead of the matrix below.
#
# Without CASEs: 22 cases, ~70 min with RUNS=3.
# Then (unless APPEND=1 or SYNCBENCH=0) the Go benchmarks of the sync
# cost per connection (internal/conntrack, internal/dataplane/ebpf,
# internal/cluster/connsync), 5 runs each, into ha-sync-bench.txt. SYNCCOST=1 (the default with
# BASELINE=1) also compares the CPU per synchronised connection of xlb's
# sync and of conntrackd (test/e2e TestSyncCost, COST_CONNS connections,
# COST_RUNS runs), into ha-sync-cost.jsonl, each line labelled with the
# date and the commit measured. RUNS=0 SYNCBENCH=0 SYNCCOST=1 APPEND=1 runs
# only that.
#
# usage: bench/ha/run.sh [CASE...]   (env CONNS=1000 PHASE=6s RUNS=3 APPEND=0 SYNCBENCH=1 BASELINE=0 SYNCCOST=$BASELINE COST_CONNS=50000 COST_RUNS=5)
# Results: bench/results/ha.jsonl (one line a run; APPEND=1 adds to it),
# ha-sync-bench.txt, then ha.md and ha.png from all of them.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "bench-ha: run as root (it creates network namespaces)" >&2; exit 1; }
CONNS=${CONNS:-1000}
PHASE=${PHASE:-6s}
RUNS=${RUNS:-3}
APPEND=${APPEND:-0}
SYNCBENCH=${SYNCBENCH:-$([ "$APPEND" = 1 ] && echo 0 || echo 1)}
SYNCCOST=${SYNCCOST:-${BASELINE:-0}}
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
	# The issue's matrix: every mode with and without sync on both
	# planes (dsr and stlsdnat keep no state: without only), the node
	# lost for the modes where it differs from a kill, and snat to a
	# source address the nodes share, which survives it.
	cases=()
	for p in nft ebpf; do
		for m in snat dnat; do
			for s in sync nosync; do
				cases+=("$m/$p/$s/kill")
			done
		done
		cases+=("dsr/$p/nosync/kill" "stlsdnat/$p/nosync/kill" "snat/$p/sync/lost" "snat+shared/$p/sync/lost" "dsr/$p/nosync/lost")
	done
	cases+=(dnat/nft/sync/lost snat/nft/nosync/lost)
	if [ "${BASELINE:-0}" = 1 ]; then
		# The master lost, LVS-style active-backup (keepalived with
		# and without conntrackd, at keepalived's default adverts and at
		# 100 ms) next to xlb's sync over ECMP, dnat (LVS-NAT), with
		# rr as an LVS director would schedule and with Maglev.
		cases=(dnat/nft/vrrp+conntrackd/lost/rr dnat/nft/vrrp+conntrackd@100ms/lost/rr dnat/nft/vrrp@100ms/lost/rr
			dnat/nft/sync/lost/rr dnat/nft/nosync/lost/rr dnat/nft/sync/lost dnat/nft/vrrp+conntrackd@100ms/lost
			dnat/nft/vrrp+sync@100ms/lost/rr dnat/ebpf/vrrp+sync@100ms/lost/rr)
	fi
fi
out=bench/results/ha.jsonl
# Build the test and the daemon once, outside the lock.
bin=$(mktemp -d /tmp/xlb-bench-ha.XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/xlb" ./cmd/xlb
go test -c -o "$bin/e2e.test" ./test/e2e
if [ "$SYNCBENCH" = 1 ]; then
	go test -c -o "$bin/conntrack.test" ./internal/conntrack
	go test -c -o "$bin/ebpf.test" ./internal/dataplane/ebpf
	go test -c -o "$bin/connsync.test" ./internal/cluster/connsync
fi
: >"$out.new"
for r in $(seq "$RUNS"); do
	for c in "${cases[@]}"; do
		echo "bench-ha: run $r: $c ($(date -u +%T))" >&2
		# Each case bounded: 4 phases and set-up, killed after 5 minutes;
		# under the shared lock of privileged tests (-o: a daemon left
		# behind must not hold it), one case at a time.
		(cd test/e2e && XLB_PRIVILEGED_TESTS=1 XLB_E2E_BIN="$bin/xlb" XLB_HA_BENCH="$PWD/../../$out.new" \
			XLB_HA_CONNS=$CONNS XLB_HA_PHASE=$PHASE XLB_HA_CASES="$c" \
			flock -o /tmp/xlb-privtest.lock timeout 300 "$bin/e2e.test" -test.count=1 -test.timeout 290s -test.run 'TestHABench$' >&2) ||
			echo "bench-ha: $c failed" >&2
	done
done
if [ "$APPEND" = 1 ] && [ -f "$out" ]; then
	cat "$out.new" >>"$out"
	rm "$out.new"
else
	mv "$out.new" "$out"
fi
if [ "$SYNCBENCH" = 1 ]; then
	sb=bench/results/ha-sync-bench.txt
	echo "# bench/ha/run.sh, $(date -u +%FT%RZ), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo '+changes'): sync cost per connection and per packet, 5 runs each, under the privileged-test lock" >"$sb.new"
	(cd internal/conntrack && XLB_PRIVILEGED_TESTS=1 flock -o /tmp/xlb-privtest.lock "$bin/conntrack.test" -test.run '^$' \
		-test.bench 'BenchmarkInstallConns|BenchmarkEventsPerConn' -test.count 5 -test.benchtime 200x) >>"$sb.new"
	(cd internal/dataplane/ebpf && XLB_PRIVILEGED_TESTS=1 flock -o /tmp/xlb-privtest.lock "$bin/ebpf.test" -test.run '^$' \
		-test.bench 'BenchmarkSyncSender|BenchmarkSyncInstall' -test.count 5 -test.benchtime 200x) | grep -v '^ ' >>"$sb.new"
	# The issue's measure: CPU per packet, sync off and on, flows of K
	# packets (about 2 minutes), and a pair of nodes without traffic.
	(cd internal/dataplane/ebpf && XLB_PRIVILEGED_TESTS=1 flock -o /tmp/xlb-privtest.lock "$bin/ebpf.test" -test.run '^$' \
		-test.bench 'BenchmarkSyncPerPacket' -test.count 5 -test.benchtime 20000x) | grep '^Benchmark' >>"$sb.new"
	(cd internal/dataplane/ebpf && XLB_PRIVILEGED_TESTS=1 flock -o /tmp/xlb-privtest.lock "$bin/ebpf.test" -test.run '^$' \
		-test.bench 'BenchmarkSyncIdle' -test.count 5 -test.benchtime 20x) | grep '^Benchmark' >>"$sb.new"
	(cd internal/cluster/connsync && flock -o /tmp/xlb-privtest.lock "$bin/connsync.test" -test.run '^$' \
		-test.bench BenchmarkWire -test.count 5) >>"$sb.new"
	mv "$sb.new" "$sb"
fi
if [ "$SYNCCOST" = 1 ]; then
	# Five or so minutes under the lock: COST_RUNS x 3 engines.
	echo "bench-ha: sync cost, xlb and conntrackd ($(date -u +%T))" >&2
	build="$(date -u +%F) $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo '+changes')"
	(cd test/e2e && XLB_PRIVILEGED_TESTS=1 XLB_E2E_BIN="$bin/xlb" XLB_SYNC_COST="$PWD/../../bench/results/ha-sync-cost.jsonl" XLB_SYNC_COST_BUILD="$build" \
		XLB_SYNC_COST_CONNS=${COST_CONNS:-50000} XLB_SYNC_COST_RUNS=${COST_RUNS:-5} \
		flock -o /tmp/xlb-privtest.lock timeout 590 "$bin/e2e.test" -test.count=1 -test.timeout 580s -test.run 'TestSyncCost$' >&2) ||
		echo "bench-ha: sync cost failed" >&2
fi
python3 bench/ha/report.py "$out" bench/results/ha.md bench/results/ha.png bench/results/ha-sync-bench.txt bench/results/ha-sync-cost.jsonl
