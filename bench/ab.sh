#!/usr/bin/env bash
# A/B of two xlb builds on the same machine, taking turns, for what a
# redesign must not slow down: the control plane next to 10,000 farms
# (bench/ctlplane: an API call adding a farm of 100 backends, and a bulk
# POST of 1000 farms x 4), the restore of 16,000 farms (bench/restore-ab.sh),
# the eBPF program's per-packet cost (BPF_PROG_TEST_RUN, BenchmarkConntrack)
# and the nft plane's kernel transaction (BenchmarkApplyAddFarm100Backends).
# OLD and NEW are directories holding each build's xlb, ebpf.test and
# nft.test (go build ./cmd/xlb; go test -c ./internal/dataplane/ebpf and
# ./internal/dataplane/nft). Raw output goes to OUT (default
# bench/results/redesign-ab); bench/results/redesign-ab.md reads it. Root.
# The builds take turns, old first in odd rounds and new first in even ones.
#   bench/ab.sh /tmp/ab/old /tmp/ab/new
#   ROUNDS=3 bench/ab.sh OLD NEW
#   PARTS=ctlplane CTLFLAGS="-existing 0,10000 -existing-backends 1" OUT=/tmp/ab bench/ab.sh OLD NEW
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "bench/ab.sh: run as root" >&2; exit 1; }
[ $# -eq 2 ] || { echo "usage: bench/ab.sh OLD_DIR NEW_DIR" >&2; exit 2; }
old=$(realpath "$1") new=$(realpath "$2")
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
PARTS=${PARTS:-ctlplane gobench restore}
CTLFLAGS=${CTLFLAGS:--existing 0,10000 -existing-backends 1,4}
OUT=${OUT:-bench/results/redesign-ab}
mkdir -p "$OUT"
go build -o bin/ctlplane ./bench/ctlplane
ns=xlb-ab-ctl
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ctl() { # label dir round
	ip netns del "$ns" 2>/dev/null || true
	ip netns add "$ns"
	ip netns exec "$ns" ip link set lo up
	mkdir -p "$OUT/ctlplane-$1-$3"
	# shellcheck disable=SC2086 # flags are meant to split
	ip netns exec "$ns" bin/ctlplane -xlb "$2/xlb" -nftlb "" $CTLFLAGS \
		-matrix 100x1 -out "$OUT/ctlplane-$1-$3" 2>&1 | sed "s/^/$1 /"
	ip netns pids "$ns" | xargs -r kill -9
	ip netns del "$ns"
}
gobench() { # label dir round
	(cd internal/dataplane/ebpf && XLB_PRIVILEGED_TESTS=1 "$2/ebpf.test" -test.run '^$' \
		-test.bench '^BenchmarkBaseline$|^BenchmarkConntrack$/^conns=(1k|64k)$' -test.benchtime 2000x -test.count 3) |
		grep -E '^Benchmark' | sed "s/^/$1 /"
	(cd internal/dataplane/nft && XLB_PRIVILEGED_TESTS=1 "$2/nft.test" -test.run '^$' \
		-test.bench '^BenchmarkApplyAddFarm100Backends$' -test.benchtime 100x -test.count 3) |
		grep -E '^Benchmark' | sed "s/^/$1 /"
}
has() { [[ " $PARTS " == *" $1 "* ]]; }
for r in $(seq "$ROUNDS"); do
	order=(old new)
	[ $((r % 2)) -eq 0 ] && order=(new old)
	for l in "${order[@]}"; do
		d=$old
		[ "$l" = new ] && d=$new
		if has ctlplane; then ctl "$l" "$d" "$r"; fi
		if has gobench; then gobench "$l" "$d" "$r"; fi
	done
done | tee "$OUT/ctlplane-gobench.txt"
if has restore; then
	ROUNDS=$ROUNDS bench/restore-ab.sh "$old/xlb" "$new/xlb" | tee "$OUT/restore.txt"
fi
