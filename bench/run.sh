#!/usr/bin/env bash
# make bench, bench-quick, bench-datapath: the benchmark suite (see
# DESIGN.md, Benchmarks). Results go to bench/results/ (committed); with
# --quick to bench/results/quick/ (not committed).
#
# usage: bench/run.sh [--quick] [PART...]
#   PART: ctlplane converge datapath conntable rulescale health gobench charts (default: all, in that order)
#   --quick: tiny sizes, one or a few runs each: a smoke run of every part in
#            under 3 minutes, to check that the harness works, not to measure.
# More flags for a part: CTLPLANE_FLAGS, CONVERGE_FLAGS, DATAPATH_FLAGS,
# CONNTABLE_FLAGS, RULESCALE_FLAGS (e.g. DATAPATH_FLAGS="-runs 10 -d 10s"),
# GOBENCH_FLAGS.
#
# Every namespace made here is named xlbb-<pid of this script>-*; the trap
# kills what runs in them and deletes them on exit, also on failure or ^C.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench: run as root (it creates network namespaces)" >&2; exit 1; }

quick=0
parts=()
for a in "$@"; do
	case $a in
	--quick) quick=1 ;;
	ctlplane | converge | datapath | conntable | rulescale | health | gobench | charts) parts+=("$a") ;;
	*) echo "usage: bench/run.sh [--quick] [ctlplane|converge|datapath|conntable|rulescale|health|gobench|charts]..." >&2; exit 2 ;;
	esac
done
[ ${#parts[@]} -gt 0 ] || parts=(ctlplane converge datapath conntable rulescale health gobench charts)

OUT=bench/results
if [ $quick -eq 1 ]; then
	OUT=bench/results/quick
	# Smallest sizes that still exercise every code path.
	CTLPLANE_FLAGS="-runs 4 -existing 0,1000 -matrix 1000x4,100x10+100fw -nftlb-existing 0 -nftlb-runs 3 -nftlb-bulk=false ${CTLPLANE_FLAGS:-}"
	CONVERGE_FLAGS="-runs 4 -existing 0,1000 -backends 10,100 ${CONVERGE_FLAGS:-}"
	DATAPATH_FLAGS="-runs 1 -d 1s -warmup 0 ${DATAPATH_FLAGS:-}"
	# 40000 one-way flows overfill a table of 16384 connections (32768
	# entries): the fill, the count and the LRU's evictions all run.
	CONNTABLE_FLAGS="-runs 1 -d 0.5s -sizes 1000,40000 -tables 16384 ${CONNTABLE_FLAGS:-}"
	GOBENCH_FLAGS="-benchtime 1x -count 1 ${GOBENCH_FLAGS:-}"
	HEALTH_FLAGS="-runs 1 -faults kill,503 -cpu-runs 1 -cpu-seconds 3 -cpu-backends 1000 ${HEALTH_FLAGS:-}"
fi
mkdir -p "$OUT"

P=xlbb-$$
cleanup() {
	set +e
	for ns in $(ip netns list | awk '{print $1}' | grep "^$P-"); do
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
		ip netns del "$ns"
	done
	# conntable's bpffs, if it could not unmount it itself (killed).
	for m in $(awk -v p="/$P-bpffs-" 'index($2, p) { print $2 }' /proc/mounts); do
		umount -l "$m" && rmdir "$m"
	done
}
trap cleanup EXIT

# in_ns NAME CMD...: runs CMD in a fresh namespace of its own, then removes it.
in_ns() {
	local ns=$P-$1
	shift
	ip netns add "$ns"
	ip netns exec "$ns" ip link set lo up
	ip netns exec "$ns" "$@"
	ip netns pids "$ns" | xargs -r kill -9
	ip netns del "$ns"
}

# nftlb_bin prints the path of Debian's nftlb (scripts/nftlb-binary.sh
# fetches it on first use).
nftlb_bin() { scripts/nftlb-binary.sh; }

step() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

for p in ctlplane converge datapath conntable rulescale health charts; do
	go build -o "bin/$p" "./bench/$p"
done

for part in "${parts[@]}"; do
	case $part in
	ctlplane)
		step "control plane"
		# shellcheck disable=SC2086 # flags are meant to split
		in_ns ctlplane bin/ctlplane -xlb bin/xlb -nftlb "$(nftlb_bin)" -out "$OUT" ${CTLPLANE_FLAGS:-}
		;;
	converge)
		step "control plane: time until traffic follows"
		# It makes its own namespaces (client, lb, 3 backends) under our prefix.
		# shellcheck disable=SC2086
		bin/converge -xlb bin/xlb -echo bin/xlb-echo -out "$OUT" -prefix "$P" ${CONVERGE_FLAGS:-}
		;;
	health)
		step "health checks: detection, client failures, CPU"
		# It makes its own namespaces (client, lb, 3 backends) under our prefix.
		# shellcheck disable=SC2086
		bin/health -xlb bin/xlb -echo bin/xlb-echo -out "$OUT" -prefix "$P" ${HEALTH_FLAGS:-}
		;;
	datapath)
		step "data path"
		# It makes its own namespaces (client, lb, 3 backends) under our prefix.
		# shellcheck disable=SC2086
		bin/datapath -xlb bin/xlb -echo bin/xlb-echo -out "$OUT" -prefix "$P" ${DATAPATH_FLAGS:-}
		;;
	conntable)
		step "connection table: per-packet cost by tracked connections"
		# Its own namespaces under our prefix, and a bpffs it mounts in a
		# temporary directory (ebpf) and unmounts on exit.
		# shellcheck disable=SC2086
		bin/conntable -xlb bin/xlb -echo bin/xlb-echo -out "$OUT" -prefix "$P" ${CONNTABLE_FLAGS:-}
		;;
	rulescale)
		step "rule scale"
		# shellcheck disable=SC2086
		in_ns rulescale bin/rulescale -xlb bin/xlb -out "$OUT" ${RULESCALE_FLAGS:-}
		;;
	gobench)
		step "Go benchmarks (engine, nft data plane)"
		# shellcheck disable=SC2086
		XLB_PRIVILEGED_TESTS=1 go test -run '^$' -bench . -skip 'BenchmarkApplyAddFarmCold|BenchmarkGroupPosition' \
			${GOBENCH_FLAGS:--benchtime 100x -count 5} ./internal/engine/ ./internal/dataplane/nft/ | tee "$OUT/go-bench.txt"
		# These two set up 10,000 farms per table count, or need many
		# new flows per sample: their own counts, and not in --quick.
		if [ $quick -eq 0 ]; then
			XLB_PRIVILEGED_TESTS=1 go test -run '^$' -bench 'BenchmarkApplyAddFarmCold' -benchtime 30x -count 3 \
				./internal/dataplane/nft/ | tee -a "$OUT/go-bench.txt"
			XLB_PRIVILEGED_TESTS=1 go test -run '^$' -bench 'BenchmarkGroupPosition' -benchtime 60000x -count 5 \
				./internal/dataplane/nft/ | tee -a "$OUT/go-bench.txt"
		fi
		;;
	charts)
		step "charts"
		bin/charts -dir "$OUT"
		;;
	esac
done
step "done: results in $OUT"
