package model

import (
	"sort"
	"strings"
)

// enumSpec maps the wire names of one enumerated field to its typed values.
// Wire names are nftlb's, so its users' JSON works unchanged.
type enumSpec[T ~uint8] struct {
	names []string // index = value
}

func (s enumSpec[T]) parse(v string) (T, bool) {
	for i, n := range s.names {
		if n == v {
			return T(i), true
		}
	}
	return 0, false
}

func (s enumSpec[T]) name(v T) string {
	if int(v) < len(s.names) {
		return s.names[v]
	}
	return "unknown"
}

func (s enumSpec[T]) allowed() string { return strings.Join(s.names, ", ") }

// Family is the address family a farm serves.
type Family uint8

const (
	FamilyIPv4 Family = iota
	FamilyIPv6
	FamilyDual
)

var familySpec = enumSpec[Family]{[]string{"ipv4", "ipv6", "dual"}}

func (f Family) String() string { return familySpec.name(f) }

// Protocol is the transport protocol a farm balances.
type Protocol uint8

const (
	ProtoTCP Protocol = iota
	ProtoUDP
	ProtoSCTP
	ProtoAll
)

var protocolSpec = enumSpec[Protocol]{[]string{"tcp", "udp", "sctp", "all"}}

func (p Protocol) String() string { return protocolSpec.name(p) }

// Number is the IANA protocol number (0 for "all").
func (p Protocol) Number() uint8 {
	switch p {
	case ProtoTCP:
		return 6
	case ProtoUDP:
		return 17
	case ProtoSCTP:
		return 132
	}
	return 0
}

// Mode is the forwarding mode (IPVS: -m masq is dnat/snat, -g is dsr).
type Mode uint8

const (
	ModeSNAT Mode = iota
	ModeDNAT
	ModeDSR
	ModeStlsDNAT
	// ModeLocal is nftlb's mode for services of the LB host itself: the
	// VIP's traffic is filtered (limits, policies) and delivered to a
	// local socket, no backend.
	ModeLocal
)

var modeSpec = enumSpec[Mode]{[]string{"snat", "dnat", "dsr", "stlsdnat", "local"}}

func (m Mode) String() string { return modeSpec.name(m) }

// Scheduler picks a backend for a new connection.
type Scheduler uint8

const (
	SchedRR Scheduler = iota
	SchedWeight
	SchedHash
	SchedSymhash
	SchedMaglev
	// SchedLC and SchedWLC are IPVS's least-connection schedulers: the
	// serving backend with the fewest active connections (lc), or the
	// fewest per unit of weight (wlc). Only planes that count
	// connections per backend build them (the eBPF plane).
	SchedLC
	SchedWLC
)

var schedulerSpec = enumSpec[Scheduler]{[]string{"rr", "weight", "hash", "symhash", "maglev", "lc", "wlc"}}

func (s Scheduler) String() string { return schedulerSpec.name(s) }

// Helper is a conntrack helper attached to a farm's connections.
type Helper uint8

const (
	HelperNone Helper = iota
	HelperAmanda
	HelperFTP
	HelperH323
	HelperIRC
	HelperNetbiosNS
	HelperPPTP
	HelperSane
	HelperSIP
	HelperSNMP
	HelperTFTP
)

var helperSpec = enumSpec[Helper]{[]string{"none", "amanda", "ftp", "h323", "irc", "netbios-ns", "pptp", "sane", "sip", "snmp", "tftp"}}

func (h Helper) String() string { return helperSpec.name(h) }

// State is the administrative state of a farm or backend.
// up serves; down is "not serving" (as set by a health check); off is disabled by the operator.
type State uint8

const (
	StateUp State = iota
	StateDown
	StateOff
)

var stateSpec = enumSpec[State]{[]string{"up", "down", "off"}}

func (s State) String() string { return stateSpec.name(s) }

// flagSpec handles fields that are a space-separated set of keywords,
// e.g. sched-param "srcip srcport" or log "input forward".
type flagSpec[T ~uint8] struct {
	none  string   // the keyword for the empty set
	names []string // bit i = names[i]
}

func (s flagSpec[T]) parse(v string) (T, bool) {
	var out T
	words := strings.Fields(v)
	if len(words) == 0 {
		return 0, false
	}
	for _, w := range words {
		if w == s.none && len(words) == 1 {
			return 0, true
		}
		found := false
		for i, n := range s.names {
			if n == w {
				out |= 1 << i
				found = true
			}
		}
		if !found {
			return 0, false
		}
	}
	return out, true
}

func (s flagSpec[T]) name(v T) string {
	if v == 0 {
		return s.none
	}
	var parts []string
	for i, n := range s.names {
		if v&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	return strings.Join(parts, " ")
}

func (s flagSpec[T]) allowed() string {
	all := append([]string{s.none}, s.names...)
	sorted := append([]string(nil), all...)
	sort.Strings(sorted[1:])
	return strings.Join(all, ", ") + " (several separated by spaces)"
}

// HashKey is a set of packet fields used by a hash scheduler or by persistence.
type HashKey uint8

const (
	KeySrcIP HashKey = 1 << iota
	KeyDstIP
	KeySrcPort
	KeyDstPort
	KeySrcMAC
)

var hashKeySpec = flagSpec[HashKey]{"none", []string{"srcip", "dstip", "srcport", "dstport", "srcmac"}}

func (k HashKey) String() string { return hashKeySpec.name(k) }

// persistenceSpec: nftlb 1.0 prints combined persistence keys separated
// by spaces ("srcip srcport"); older nftlb documentation and xlb before it
// joined them with '-' ("srcip-srcport"), which is still accepted.
var persistenceSpec = flagSpec[HashKey]{"none", []string{"srcip", "dstip", "srcport", "dstport", "srcmac"}}

func parsePersistence(v string) (HashKey, bool) {
	return persistenceSpec.parse(strings.ReplaceAll(v, "-", " "))
}

func persistenceName(k HashKey) string { return persistenceSpec.name(k) }

// LogHook is the set of hooks at which new connections are logged.
type LogHook uint8

const (
	LogInput LogHook = 1 << iota
	LogForward
	LogOutput
)

var logSpec = flagSpec[LogHook]{"none", []string{"input", "forward", "output"}}

func (l LogHook) String() string { return logSpec.name(l) }
