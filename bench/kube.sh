#!/usr/bin/env bash
# Kubernetes service proxy benchmark: endpoint change -> live with 1,000 and
# 10,000 Services present, against a real kube-apiserver and etcd, all inside
# a network namespace of its own. Writes bench/results/kube.md.
# Side by side it runs kube-proxy (nftables mode) on the same API server;
# -kube-proxy "" turns that off.
# Usage: bench/kube.sh [-services 1000,10000] [-runs 30] [-endpoints 10] [-kube-proxy nftables]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/kube: run as root (it creates a network namespace)" >&2; exit 1; }
XLB_KUBE_BIN_DIR=$(scripts/kube-binaries.sh etcd kube-apiserver kube-proxy)
export XLB_KUBE_BIN_DIR
mkdir -p bin
go build -o bin/kubebench ./bench/kubebench
NS=xlb-kubebench-$$
ip netns add "$NS"
trap 'ip netns pids "$NS" 2>/dev/null | xargs -r kill -9; ip netns del "$NS"' EXIT
ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" bin/kubebench -out bench/results "$@"
