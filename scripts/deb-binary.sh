#!/usr/bin/env bash
# Prints the path of a daemon from one of Debian's packages, fetching it on
# first use: deb-binary.sh PACKAGE BINARY [LIBRARY-PACKAGE...]
#
#   deb-binary.sh bird2 usr/sbin/bird libreadline8 libssh-gcrypt-4 libtinfo6
#
# The package is downloaded with apt and unpacked into ~/.cache/xlb/PACKAGE,
# not installed: its postinst would start the daemon as a service of the host
# (bird on the host's routing table, conntrackd on the host's conntrack).
# Tests and benchmarks run the binary only inside network namespaces they
# create, with their own configuration, socket and pid files. The libraries
# it links to are ordinary packages and are installed. See nftlb-binary.sh,
# which does the same for nftlb.
set -euo pipefail

pkg=$1 bin=$2
shift 2
dir=${XDG_CACHE_HOME:-$HOME/.cache}/xlb/$pkg
if [ ! -x "$dir/$bin" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deb-binary: need root to fetch $pkg" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	if [ $# -gt 0 ] && ! apt-get install -y -qq --no-install-recommends "$@" >&2; then
		apt-get update -qq >&2
		apt-get install -y -qq --no-install-recommends "$@" >&2
	fi
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# apt's sandbox user cannot write into a root-only temporary directory.
	chmod 755 "$tmp"
	(cd "$tmp" && apt-get download "$pkg" >&2 2>/dev/null || { apt-get update -qq >&2 && apt-get download "$pkg" >&2; })
	mkdir -p "$dir"
	dpkg-deb -x "$tmp"/"$pkg"_*.deb "$dir"
fi
[ -x "$dir/$bin" ] || { echo "deb-binary: could not get $bin from Debian's $pkg" >&2; exit 1; }
echo "$dir/$bin"
