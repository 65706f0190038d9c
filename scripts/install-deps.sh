#!/usr/bin/env bash
# Installs what xlb's build, tests, demo and benchmarks need on a fresh
# Debian machine: kernel tools from apt, Go modules from the module proxy.
# Safe to run again: it installs only what is missing.
set -euo pipefail

need=()
# haproxy, iptables-legacy and gnuplot: the data-path baselines and the charts
# of make bench; clang-format: make check-fmt of bpf/*.c. prometheus: promtool
# checks the metrics in the tests, and the server draws the dashboard's picture
# (make bench-dashboard).
for pair in nft:nftables ip:iproute2 curl:curl conntrack:conntrack hyperfine:hyperfine wrk:wrk clang:clang llvm-strip:llvm \
	clang-format:clang-format haproxy:haproxy iptables-legacy:iptables gnuplot:gnuplot-nox promtool:prometheus; do
	cmd=${pair%%:*} pkg=${pair##*:}
	command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
# libbpf's headers for `go generate` of the eBPF data plane (bpf/*.c).
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: need root to install: ${need[*]}" >&2
		exit 1
	fi
	echo "install-deps: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's nftlb, the peer test/nftlb compares xlb's API with (unpacked
# into ~/.cache/xlb/nftlb, not installed: see the script).
"$(dirname "$0")/nftlb-binary.sh" >/dev/null
# BIRD 2, the BGP router of the HA tests and benchmark (unpacked into
# ~/.cache/xlb/bird2, not installed: see the script).
"$(dirname "$0")/deb-binary.sh" bird2 usr/sbin/bird libreadline8 libssh-gcrypt-4 libtinfo6 >/dev/null
command -v go >/dev/null 2>&1 || { echo "install-deps: go is not installed" >&2; exit 1; }
go mod download
