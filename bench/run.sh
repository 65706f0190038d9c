#!/usr/bin/env bash
# make bench: control-plane benchmarks in a network namespace of their own,
# plus the Go benchmarks. Results go to bench/results/ (committed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench: run as root (it creates a network namespace)" >&2; exit 1; }
NS=xlb-bench-$$
ip netns add "$NS"
trap 'ip netns pids "$NS" 2>/dev/null | xargs -r kill -9; ip netns del "$NS"' EXIT
ip netns exec "$NS" ip link set lo up
go build -o bin/ctlplane ./bench/ctlplane
ip netns exec "$NS" bin/ctlplane -xlb bin/xlb -out bench/results "$@"
echo
echo "Go benchmarks (engine, nft data plane):"
XLB_PRIVILEGED_TESTS=1 go test -run '^$' -bench . -benchtime 100x -count 5 ./internal/engine/ ./internal/dataplane/nft/ | tee bench/results/go-bench.txt
