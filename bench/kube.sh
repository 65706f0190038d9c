#!/usr/bin/env bash
# Kubernetes service proxy benchmarks against a real kube-apiserver and etcd,
# all inside network namespaces of their own (the node, a client, the pods),
# xlb kube-proxy (nft and ebpf data planes) side by side with kube-proxy
# (nftables and iptables modes) on the same API server:
#   - Service create/delete until traffic, 10/50/100 endpoints
#     (bench/results/kube-create-delete.{md,json,png});
#   - endpoint change to live with 1,000 and 10,000 Services present
#     (bench/results/kube.{md,json}).
# Usage: bench/kube.sh [-services 1000,10000] [-runs 30] [-endpoints 10]
#   [-create-delete 10,50,100] [-create-delete-runs 30]
#   [-planes nft,ebpf] [-kube-proxy nftables,iptables]
# (-services "" or -create-delete "" skips that benchmark; -kube-proxy ""
# runs no kube-proxy.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/kube: run as root (it creates network namespaces)" >&2; exit 1; }
XLB_KUBE_BIN_DIR=$(scripts/kube-binaries.sh etcd kube-apiserver kube-proxy)
export XLB_KUBE_BIN_DIR
mkdir -p bin
go build -o bin/kubebench ./bench/kubebench
NS=xlb-kubebench-$$
ip netns add "$NS"
cleanup() {
	# The benchmark removes its client and pods namespaces itself: those
	# that are gone must not turn a finished run's exit status into a failure.
	for n in "$NS" "$NS-cl" "$NS-ep"; do
		{ ip netns pids "$n" 2>/dev/null || true; } | xargs -r kill -9 2>/dev/null || true
		ip netns del "$n" 2>/dev/null || true
	done
}
trap cleanup EXIT
ip netns exec "$NS" ip link set lo up
# -out DIR (default bench/results) is where the results and the chart go.
out=bench/results
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
	case ${args[i]} in
	-out | --out) out=${args[i + 1]:-$out} ;;
	-out=* | --out=*) out=${args[i]#*=} ;;
	esac
done
ip netns exec "$NS" bin/kubebench -out "$out" -netns "$NS" "$@"
if [ -f "$out/kube-create-delete.json" ]; then
	go run ./bench/charts -dir "$out" -only kube-create-delete.json
fi
