package nft

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Names of the static objects of the table.
const (
	chainPrerouting  = "prerouting"
	chainOutput      = "output"
	chainPostrouting = "postrouting"
	chainPostSrc     = "post-src" // postrouting of connections tagged for a farm chosen by source table (sourcetable.go)
	chainChecks      = "checks"   // output, raw priority: the health checks' packets untracked

	setSvc4     = "svc4"    // ip daddr . l4proto . th dport -> goto farm chain
	setSvc6     = "svc6"    // ip6 daddr . l4proto . th dport -> goto farm chain
	setMasq4    = "masq4"   // ct original ip daddr . l4proto . ct original proto-dst: masquerade
	setMasq6    = "masq6"   // same for IPv6
	setSnat4    = "snat4"   // same key -> source address (farm source-addr)
	setSnat6    = "snat6"   // same for IPv6
	setFwm4     = "fwm4"    // meta mark -> goto farm chain (firewall-mark farms, IPv4)
	setFwm6     = "fwm6"    // same for IPv6
	setMasqM    = "masqm"   // meta mark: masquerade (snat firewall-mark farms)
	setSnatM4   = "snatm4"  // meta mark -> source address (snat firewall-mark farms with source-addr)
	setSnatM6   = "snatm6"  // same for IPv6
	setFsvc4    = "fsvc4"   // like svc4, -> goto farm filter chain (farms with filters only)
	setFsvc6    = "fsvc6"   // same for IPv6
	setLog4     = "log4"    // like svc4 (ct original keys), -> jump farm log chain (farms with log only)
	setLog6     = "log6"    // same for IPv6
	farmLog     = "l-"      // farm log chain: l-<hash>
	setStls4    = "stls4"   // like svc4: -> goto stateless farm chain (mode stlsdnat)
	setStls6    = "stls6"   // same for IPv6
	setStlsR4   = "stlsr4"  // backend addr . l4proto . port -> goto the farm's reverse chain
	setStlsR6   = "stlsr6"  // same for IPv6
	farmRev     = "r-"      // stateless reverse chain: r-<hash>
	chainRaw    = "raw"     // filter hook prerouting priority raw: stateless farms
	chainFilter = "filter"  // filter hook prerouting, after conntrack: per-farm filters
	farmFilter  = "g-"      // farm filter chain: g-<hash>
	farmChain   = "f-"      // farm chain: f-<hash>
	setSvcX4    = "svcx4"   // like svc4, single ports only: a hash map (exact keys; see exactSet)
	setSvcX6    = "svcx6"   // same for IPv6
	setMasqX4   = "masqx4"  // like masq4, single ports only
	setMasqX6   = "masqx6"  // same for IPv6
	setSnatX4   = "snatx4"  // like snat4, single ports only
	setSnatX6   = "snatx6"  // same for IPv6
	setDst4     = "dst4"    // ip daddr . l4proto . th dport -> backend addr . port (direct farms)
	setDst6     = "dst6"    // same for IPv6
	chainDir4   = "direct4" // shared chain of the IPv4 direct farms: dnat to @dst4
	chainDir6   = "direct6" // same for IPv6
	farmMap     = "m-"      // farm backend map: m-<hash>-<generation>
	hashLen     = 16        // hex digits of the name hash (64 bits)
	elemChunk   = 200       // set elements per netlink message (attributes are < 64 KiB)
	anyPort     = 0xffff    // last port of "every port"
	anyProto    = 0xff      // last protocol number of "every protocol"
	protoNone   = uint8(0)  // first protocol number of "every protocol"
)

// nameHash is the short hash used in kernel object names: farm names may
// be 64 characters of [A-Za-z0-9_.-], so a fixed-length hash keeps every
// derived name well inside the kernel's limits and uniform.
func nameHash(farm string) string {
	s := sha256.Sum256([]byte(farm))
	return hex.EncodeToString(s[:hashLen/2])
}

func chainName(farm string) string { return farmChain + nameHash(farm) }

func mapName(farm string, gen uint64) string {
	return farmMap + nameHash(farm) + "-" + strconv.FormatUint(gen, 36)
}

func pick[T any](v6 bool, a, b T) T {
	if v6 {
		return b
	}
	return a
}
