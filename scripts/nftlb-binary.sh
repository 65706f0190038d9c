#!/usr/bin/env bash
# Prints the path of Debian's nftlb (the peer xlb's nftlb-compatible API is
# checked against: test/nftlb, bench/ctlplane), fetching it on first use.
#
# The package is downloaded with apt and unpacked into ~/.cache/xlb/nftlb, not
# installed: on a systemd host the package's postinst starts nftlb.service,
# which would program the host's own nftables. Tests run the binary only inside
# network namespaces they create. Its libraries are ordinary packages and are
# installed.
set -euo pipefail

dir=${XDG_CACHE_HOME:-$HOME/.cache}/xlb/nftlb
if [ ! -x "$dir/usr/sbin/nftlb" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "nftlb-binary: need root to install nftlb's libraries" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -qq --no-install-recommends libev4 libjansson4 libmnl0 libnftables1 >&2; then
		apt-get update -qq >&2
		apt-get install -y -qq --no-install-recommends libev4 libjansson4 libmnl0 libnftables1 >&2
	fi
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# apt's sandbox user cannot write into a root-only temporary directory.
	chmod 755 "$tmp"
	(cd "$tmp" && apt-get download nftlb >&2 2>/dev/null || { apt-get update -qq >&2 && apt-get download nftlb >&2; })
	mkdir -p "$dir"
	dpkg-deb -x "$tmp"/nftlb_*.deb "$dir"
fi
[ -x "$dir/usr/sbin/nftlb" ] || { echo "nftlb-binary: could not get Debian's nftlb" >&2; exit 1; }
echo "$dir/usr/sbin/nftlb"
