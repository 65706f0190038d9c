#!/usr/bin/env bash
# A/B of a bulk change between two xlb builds on the same machine, taking
# turns: a PUT /state of N farms x 1 backend from an empty state (what
# `xlb restore` sends), then a PUT /state back to empty (N deletes), each
# RUNS times per daemon start, ROUNDS rounds of old then new. Prints each
# call's time (curl's time_total) and the daemon's phase timings (its debug
# log: validate, kernel, disk; the commit costs the slower of kernel and
# disk). Root; everything runs in a namespace it creates and removes.
#   bench/restore-ab.sh OLD_XLB NEW_XLB
#   FARMS=8000 ROUNDS=3 bench/restore-ab.sh /tmp/xlb-old bin/xlb
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "bench/restore-ab.sh: run as root" >&2; exit 1; }
[ $# -eq 2 ] || { echo "usage: bench/restore-ab.sh OLD_XLB NEW_XLB" >&2; exit 2; }
FARMS=${FARMS:-16000}
ROUNDS=${ROUNDS:-2}
RUNS=${RUNS:-3}
ns=xlb-restore-ab
work=$(mktemp -d)
trap 'ip netns del "$ns" 2>/dev/null || true; rm -rf "$work"' EXIT
# The same farms as bench/ctlplane's matrix: VIP 10.64.x.y:80, one backend.
awk -v n="$FARMS" 'BEGIN {
	printf "{\"farms\":["
	for (i = 0; i < n; i++) {
		if (i) printf ","
		printf "{\"name\":\"g%05d\",\"virtual-addr\":\"10.64.%d.%d\",\"virtual-ports\":\"80\",\"backends\":[{\"name\":\"b0\",\"ip-addr\":\"172.16.0.%d\",\"port\":\"8080\"}]}", i, int(i / 256), i % 256, i % 250 + 1
	}
	printf "]}"
}' >"$work/state.json"
run() { # binary label
	ip netns del "$ns" 2>/dev/null || true
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	rm -rf "$work/state"
	mkdir -p "$work/state"
	ip netns exec "$ns" env XLB_KEY=k "$1" daemon --listen 127.0.0.1:5599 --socket none \
		--state-dir "$work/state" --log-level debug >"$work/$2.log" 2>&1 &
	local pid=$!
	for _ in $(seq 100); do
		ip netns exec "$ns" curl -s -o /dev/null -H "Key: k" http://127.0.0.1:5599/farms && break
		sleep 0.1
	done
	for _ in $(seq "$RUNS"); do
		ip netns exec "$ns" curl -s -o /dev/null -w "$2 put-$FARMS %{time_total}\n" -H "Key: k" -X PUT \
			--data-binary @"$work/state.json" http://127.0.0.1:5599/state
		ip netns exec "$ns" curl -s -o /dev/null -w "$2 put-empty %{time_total}\n" -H "Key: k" -X PUT \
			-d '{"farms":[]}' http://127.0.0.1:5599/state
	done
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	grep "change committed" "$work/$2.log" | grep -o 'validate=[^ ]* kernel=[^ ]* disk=[^ ]*' | sed "s/^/$2 phases /"
}
for _ in $(seq "$ROUNDS"); do
	run "$1" old
	run "$2" new
done
