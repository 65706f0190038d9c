#!/usr/bin/env bash
# xlb demo: client -> lb (xlb) -> 3 HTTP backends, each in its own network
# namespace. Builds nothing itself (make demo builds first); creates only
# namespaces named xlb-demo-* and removes them on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
XLB=$PWD/bin/xlb
ECHO=$PWD/bin/xlb-echo
REQUESTS=${REQUESTS:-300}
VIP=192.0.2.10   # TEST-NET-1: exists only inside the demo's namespaces
P=xlb-demo-$$    # namespace prefix, unique per run
STATE=$(mktemp -d /tmp/xlb-demo.XXXXXX)
BACKENDS=(1 2 3)

[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }

cleanup() {
	set +e
	kill $(jobs -p) 2>/dev/null
	wait 2>/dev/null
	for ns in $(ip netns list | awk '{print $1}' | grep "^$P-"); do
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
		ip netns del "$ns"
	done
	rm -rf "$STATE"
}
trap cleanup EXIT

at() { local ns=$1; shift; ip netns exec "$P-$ns" "$@"; }

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "network: client -> lb -> backends (namespaces $P-*)"
ip netns add "$P-client"
ip netns add "$P-lb"
ip link add veth-c netns "$P-client" type veth peer name veth-lbc netns "$P-lb"
at client ip addr add 10.100.0.2/24 dev veth-c
at client ip link set veth-c up
at client ip link set lo up
at client ip route add default via 10.100.0.1
at lb ip addr add 10.100.0.1/24 dev veth-lbc
at lb ip link set veth-lbc up
at lb ip link set lo up
at lb ip link add br0 type bridge
at lb ip addr add 10.200.0.1/24 dev br0
at lb ip link set br0 up
at lb sysctl -qw net.ipv4.ip_forward=1
for i in "${BACKENDS[@]}"; do
	ip netns add "$P-be$i"
	ip link add "veth-b$i" netns "$P-be$i" type veth peer name "veth-lb$i" netns "$P-lb"
	at lb ip link set "veth-lb$i" master br0 up
	at "be$i" ip addr add "10.200.0.1$i/24" dev "veth-b$i"
	at "be$i" ip link set "veth-b$i" up
	at "be$i" ip link set lo up
	at "be$i" ip route add default via 10.200.0.1
	at "be$i" "$ECHO" -name "backend-$i" -listen "10.200.0.1$i:8080" >/dev/null 2>&1 &
done
echo "client 10.100.0.2 | lb 10.100.0.1 / 10.200.0.1 | backends 10.200.0.11-13:8080 | VIP $VIP:80"

step "xlb daemon in the lb namespace (state in $STATE)"
at lb "$XLB" daemon --listen 127.0.0.1:5555 --state-dir "$STATE" --log-level warn &
export XLB_KEY_FILE=$STATE/api.key
# The CLI talks to this daemon over its Unix socket, never to another xlb
# that may run on the host (the CLI's default is /var/lib/xlb/api.sock).
export XLB_API=unix:$STATE/api.sock
for _ in $(seq 100); do
	[ -s "$XLB_KEY_FILE" ] && [ -S "$STATE/api.sock" ] && at lb "$XLB" farm list >/dev/null 2>&1 && break
	sleep 0.1
done

step "create a farm with the CLI"
run() { echo "\$ xlb $*"; at lb "$XLB" "$@"; }
run farm add web --vip "$VIP" --ports 80 --proto tcp --mode snat --sched rr
for i in "${BACKENDS[@]}"; do
	run backend add web "be$i" --ip "10.200.0.1$i" --port 8080
done

step "$REQUESTS requests from the client to http://$VIP/"
count() {
	local n=$1
	for _ in $(seq "$n"); do
		at client curl -s --max-time 2 "http://$VIP/" || echo "FAILED"
	done | awk '{print $1}' | sort | uniq -c | sort -k2
}
count "$REQUESTS"

step "drain backend be3 (weight 0): new connections go to be1 and be2 only"
run backend set web be3 --weight 0
count 60

step "xlb list -n"
at lb "$XLB" list -n

step "the kernel's view: the farm's service element and its rule (farms are spread over xlb's tables; farms like this one share group chains)"
at lb nft list ruleset | awk '/^table/ { t = $0 } /^[ \t]*(map|set|chain) / { c = $0 } /192\.0\.2\.10|0xc000020a|farm web/ { if (t != shown) { print t; shown = t } if (c != cshown) { print c; cshown = c } print }'

echo
echo "demo done; removing namespaces"
