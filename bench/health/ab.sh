#!/usr/bin/env bash
# A/B of the health checks' CPU (bench/results/health-cpu.md): two xlb
# binaries take turns inside one hold of the shared test lock per plane
# and round (round 1: A then B, round 2: B then A), each checking 10,000
# backends every second with half-open and connect checks, 2 samples of
# each kind per turn. With PERF=1 the first sample of B in round 1 runs
# under perf record and is classified (bench/health/perf.go).
#
# With EXTRA="-steer" (or other bench/health flags) every run gets them:
# -steer measures the LB's own CPU (bench/health/steer.go).
#
# usage: [CHECKS=half-open] [RUNS=2] [EXTRA=flags] bench/health/ab.sh XLB_A XLB_B [OUT_DIR]
#   XLB_A, XLB_B: xlb binaries (e.g. main's and this tree's)
#   OUT_DIR: where the reports (ab-ROUND-PLANE-A/B.md, .json) go; default a new
#            directory under /tmp (the bench binaries are built there too)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: bench/health/ab.sh XLB_A XLB_B [OUT_DIR]" >&2; exit 2; }
A=$1 B=$2 OUT=${3:-$(mktemp -d /tmp/xlb-health-ab.XXXXXX)}
LOCK=${LOCK:-/tmp/xlb-privtest.lock}
mkdir -p "$OUT"
go build -o "$OUT/health" ./bench/health
go build -o "$OUT/xlb-echo" ./test/cmd/xlb-echo
run() { # NAME BINARY PLANE ROUND [FLAGS...]
	local name=$1 bin=$2 plane=$3 round=$4
	shift 4
	timeout 300 "$OUT/health" -xlb "$bin" -echo "$OUT/xlb-echo" -out "$OUT" -name "ab-$round-$plane-$name" \
		-detect=false -flap=false -planes "$plane" -cpu-runs "${RUNS:-2}" -cpu-checks "${CHECKS:-half-open,connect}" ${EXTRA:-} "$@"
}
export -f run
export OUT RUNS CHECKS EXTRA
for round in 1 2; do
	for plane in nft ebpf; do
		perf=""
		[ "$round" = 1 ] && [ "${PERF:-0}" = 1 ] && perf="-perf $OUT/perf-B"
		if [ "$round" = 1 ]; then
			flock "$LOCK" bash -c "run A $A $plane $round && run B $B $plane $round $perf"
		else
			flock "$LOCK" bash -c "run B $B $plane $round && run A $A $plane $round"
		fi
	done
done
