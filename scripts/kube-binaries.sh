#!/usr/bin/env bash
# Builds the Kubernetes binaries that xlb's kube-proxy tests and benchmarks
# run against (etcd, kube-apiserver, and on request kube-proxy) from the Go
# module proxy, using the wrapper modules in test/kube/tools/, into a cache
# outside the repo:
#
#   ${XDG_CACHE_HOME:-~/.cache}/xlb/kube/<kubernetes version>/{etcd,kube-apiserver,kube-proxy}
#
# A warm run only compares a stamp (a hash of the wrapper modules) and prints
# the directory. A cold run takes ~8-10 minutes on 2 cores.
#
# Usage: scripts/kube-binaries.sh [kube-apiserver] [etcd] [kube-proxy]
#   (default: etcd kube-apiserver). Prints the cache directory on stdout.
# XLB_KUBE_BIN_DIR, if set, overrides the cache directory.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/test/kube/tools
# modver MODULE GOMOD: the required version of MODULE in GOMOD.
modver() { awk -v m="$1" '($1 == m && $2 ~ /^v/) {print $2} ($1 == "require" && $2 == m) {print $3}' "$2" | head -1; }
k8s_version=$(modver k8s.io/kubernetes "$tools/apiserver/go.mod")
etcd_version=$(modver go.etcd.io/etcd/server/v3 "$tools/etcd/go.mod")
if [ -z "$k8s_version" ] || [ -z "$etcd_version" ]; then
	echo "kube-binaries: cannot read the pinned versions from $tools/*/go.mod" >&2
	exit 1
fi
dir=${XLB_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xlb/kube/$k8s_version}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(etcd kube-apiserver)

log() { echo "kube-binaries: $*" >&2; }

# build NAME MODULE_DIR PACKAGE [LDFLAGS]
build() {
	local name=$1 mod=$2 pkg=$3 ldflags=${4:-}
	local stamp
	stamp=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-16)
	if [ -x "$dir/$name" ] && [ "$(cat "$dir/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	mkdir -p "$dir"
	log "building $name ($pkg) into $dir; a cold build takes minutes"
	local start=$SECONDS
	(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
		-ldflags "-s -w $ldflags" -o "$dir/.$name.tmp" "$pkg")
	mv -f "$dir/.$name.tmp" "$dir/$name"
	echo "$stamp" >"$dir/.$name.stamp"
	log "built $name in $((SECONDS - start))s"
}

minor=${k8s_version#v1.}
minor=${minor%%.*}
kver="-X k8s.io/component-base/version.gitVersion=$k8s_version \
-X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"

for w in "${want[@]}"; do
	case $w in
	etcd) build etcd "$tools/etcd" go.etcd.io/etcd/server/v3 \
		"-X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd_version" ;;
	kube-apiserver) build kube-apiserver "$tools/apiserver" k8s.io/kubernetes/cmd/kube-apiserver "$kver" ;;
	kube-proxy) build kube-proxy "$tools/apiserver" k8s.io/kubernetes/cmd/kube-proxy "$kver" ;;
	*)
		log "unknown binary \"$w\" (allowed: etcd, kube-apiserver, kube-proxy)"
		exit 2
		;;
	esac
done
echo "$dir"
