// Package model holds xlb's typed desired state (farms and backends), their
// defaults, their validation and their nftlb-compatible JSON codec.
//
// Values of these types are immutable once handed to the engine: every change
// builds a new Farm (see Clone), so snapshots can be shared without locks.
package model

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// PortRange is an inclusive range of ports; a single port has First == Last.
type PortRange struct{ First, Last uint16 }

func (r PortRange) String() string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// Overlaps reports whether two ranges share a port.
func (r PortRange) Overlaps(o PortRange) bool { return r.First <= o.Last && o.First <= r.Last }

// Farm is a virtual service: a VIP with ports and protocol, how it forwards,
// how it schedules, and its backends. Field names follow nftlb.
type Farm struct {
	Name        string
	Family      Family
	VirtualAddr netip.Addr // invalid (zero) for firewall-mark farms
	// VirtualAddr2 is a family dual farm's second VIP, of the other
	// family ("virtual-addr": "10.0.0.1,fd00::1"); each VIP is served by
	// the backends of its family. Invalid when there is none.
	VirtualAddr2 netip.Addr
	VirtualPorts []PortRange // empty: every port
	SourceAddr   netip.Addr  // snat: fixed source instead of masquerade
	Protocol     Protocol
	Mode         Mode
	Scheduler    Scheduler
	SchedParam   HashKey // keys of the hash scheduler
	Persistence  HashKey
	PersistTTL   uint32 // seconds
	Helper       Helper
	Log          LogHook
	LogPrefix    string
	Mark         uint32
	State        State
	NewRTLimit   uint32 // new connections per second, 0 = unlimited
	NewRTBurst   uint32
	RstRTLimit   uint32 // TCP resets per second, 0 = unlimited
	RstRTBurst   uint32
	EstConnLimit uint32 // established connections, 0 = unlimited
	TCPStrict    bool
	// Modes dsr and stlsdnat at ingress (nftlb's names): Iface is the
	// interface where the VIP's traffic arrives, Oface the one towards the
	// backends, EtherAddr the source MAC of frames forwarded to them.
	// Empty: the data plane finds them (dsr). A stlsdnat farm with an
	// Iface forwards at layer 2 (StlsAtIngress).
	Iface     string
	Oface     string
	EtherAddr EtherAddr
	Backends  []Backend
	Policies  []PolicyRef
	// SourceTable names an addr table that chooses the farm by the
	// client's address: several farms may serve one VIP, protocol and
	// ports when each has its own source table and at most one has none
	// (the default, serving the clients no other's table holds). ""
	// means none. See docs/tables.md ("Choosing the farm by source").
	SourceTable string
	// Check is the farm's active health check (check.go); nil: none.
	Check *Check

	// nftlb 1.0 fields (nftlb.go). Rates are per RateUnit; the limits'
	// values above are per that unit.
	NewRTUnit          RateUnit
	RstRTUnit          RateUnit
	LogRTLimit         uint32 // log lines per LogRTUnit, 0 = unlimited
	LogRTUnit          RateUnit
	LimitsTTL          uint32 // seconds a client over a limit stays banned
	NewRTLogPrefix     string
	RstRTLogPrefix     string
	EstConnLogPrefix   string
	TCPStrictLogPrefix string
	Queue              int32 // nfqueue number, -1 = none
	Verdict            Verdict
	FlowOffload        bool
	// ResponseTTL is nftlb's "responsettl" (seconds; nftlb prints it for
	// stlsdnat farms): how long a stlsdnat farm at ingress
	// (StlsAtIngress) remembers a client's MAC to send replies to. A
	// routed stlsdnat farm has no use for it.
	ResponseTTL uint32
	// IntraConnectOff is nftlb's intra-connect "off": connections the LB
	// host itself opens to the farm's address are not balanced. xlb's
	// default is on (the zero value), nftlb's off: docs/nftlb-compat.md.
	IntraConnectOff bool
	// AddrName names the farm's own address (virtual-addr, virtual-ports,
	// protocol, family), which nftlb lists in "addresses"; "" means
	// nftlb's default "<name>-addr".
	AddrName string
	// Addresses are further nftlb address objects the farm serves besides
	// its own.
	Addresses []Address
	// Sessions are static persistence sessions (nftlb's "sessions" in a
	// farm body).
	Sessions []StaticSession

	// renamedFrom is the farm's old name when a decoded body renamed it
	// ("newname"); see RenamedFrom.
	renamedFrom string

	enc *encoded // cached wire forms; see codec.go
}

// Backend is one real server of a farm.
type Backend struct {
	Name         string
	Addr         netip.Addr
	Port         uint16 // 0: the port the client connected to
	Weight       uint32
	Priority     uint32
	Mark         uint32
	EstConnLimit uint32
	State        State
	// EtherAddr is the backend's MAC (mode dsr); zero: the data plane
	// looks it up in the neighbour table.
	EtherAddr EtherAddr
	// SourceAddr is the source address of connections to this backend
	// (nftlb's backend source-addr), instead of the farm's.
	SourceAddr       netip.Addr
	EstConnLogPrefix string
	// Check overrides fields of the farm's check for this backend; nil:
	// the farm's check as it is.
	Check *Check
}

// EtherAddr is an Ethernet (MAC) address; the zero value means unset.
type EtherAddr [6]byte

// IsZero reports whether the address is unset.
func (a EtherAddr) IsZero() bool { return a == EtherAddr{} }

// String returns the address as aa:bb:cc:dd:ee:ff, or "" when unset.
func (a EtherAddr) String() string {
	if a.IsZero() {
		return ""
	}
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", a[0], a[1], a[2], a[3], a[4], a[5])
}

// ParseEtherAddr parses aa:bb:cc:dd:ee:ff (or aa-bb-...); "" is the zero
// address. Multicast and broadcast addresses are refused: a frame is sent
// to one host.
func ParseEtherAddr(s string) (EtherAddr, error) {
	var a EtherAddr
	if s == "" {
		return a, nil
	}
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return a, fmt.Errorf("must be an Ethernet address aa:bb:cc:dd:ee:ff")
	}
	copy(a[:], hw)
	if a[0]&1 != 0 || a.IsZero() {
		return EtherAddr{}, fmt.Errorf("must be a unicast Ethernet address (not zero, multicast or broadcast)")
	}
	return a, nil
}

// PolicyRef attaches a named table (allow or deny list) to a farm.
type PolicyRef struct {
	Name string
}

// Limits that bound the work one object can ask of the data plane.
const (
	MaxNameLen  = 64
	MaxBackends = 4096
	MaxWeight   = 10000
	MaxPriority = 1000 // a table's order among a farm's policies
	// MaxBackendPriority: nftlb takes any positive priority; the farm's
	// level (PriorityLevel) never passes one more than its backends.
	MaxBackendPriority = 1<<31 - 1
	MaxPortRanges      = 64
	// MaxLogPrefixLen: the kernel's log prefix holds 127 bytes (counted
	// in bytes, as the kernel does); nftlb's tokens expand (FNAME to a
	// name of up to 64 bytes) and the expansion is cut to 127
	// (plan.LogPrefix). The limit is what it was when the nft plane added
	// " xlb farm=<name> ", so no saved prefix becomes invalid.
	MaxLogPrefixLen  = 127 - len(" xlb farm= ") - MaxNameLen
	DefaultTTL       = 60
	DefaultLimitsTTL = 120 // nftlb's limits-ttl
)

// NewFarm returns a farm with nftlb's defaults.
func NewFarm(name string) Farm {
	return Farm{
		Name:        name,
		Family:      FamilyIPv4,
		Protocol:    ProtoTCP,
		Mode:        ModeSNAT,
		Scheduler:   SchedRR,
		PersistTTL:  DefaultTTL,
		ResponseTTL: DefaultTTL,
		State:       StateUp,
		LimitsTTL:   DefaultLimitsTTL,
		Queue:       -1,
		Verdict:     DefaultVerdict,
	}
}

// NewBackend returns a backend with nftlb's defaults.
func NewBackend(name string) Backend {
	return Backend{Name: name, Weight: 1, Priority: 1, State: StateUp}
}

// Clone returns a deep copy whose slices can be changed freely.
func (f *Farm) Clone() Farm {
	c := *f
	c.enc = nil
	c.VirtualPorts = append([]PortRange(nil), f.VirtualPorts...)
	c.Backends = append([]Backend(nil), f.Backends...)
	c.Policies = append([]PolicyRef(nil), f.Policies...)
	c.Addresses = slices.Clone(f.Addresses)
	for i := range c.Addresses {
		c.Addresses[i].Ports = slices.Clone(c.Addresses[i].Ports)
	}
	c.Sessions = slices.Clone(f.Sessions)
	c.renamedFrom = ""
	return c
}

// Backend returns the backend with that name and its index, or -1.
func (f *Farm) Backend(name string) (*Backend, int) {
	for i := range f.Backends {
		if f.Backends[i].Name == name {
			return &f.Backends[i], i
		}
	}
	return nil, -1
}

// UsesPolicy reports whether the farm names the policy (a table) name.
func (f *Farm) UsesPolicy(name string) bool {
	return slices.ContainsFunc(f.Policies, func(r PolicyRef) bool { return r.Name == name })
}

// TableRefs lists the tables the farm uses, each once: its policies, then
// its source table.
func (f *Farm) TableRefs() []string {
	out := make([]string, 0, len(f.Policies)+1)
	for _, p := range f.Policies {
		if !slices.Contains(out, p.Name) {
			out = append(out, p.Name)
		}
	}
	if f.SourceTable != "" && !slices.Contains(out, f.SourceTable) {
		out = append(out, f.SourceTable)
	}
	return out
}

// IsMarkFarm reports whether the farm is selected by a firewall mark (IPVS -f)
// rather than by virtual address and port.
func (f *Farm) IsMarkFarm() bool { return !f.VirtualAddr.IsValid() && f.Mark != 0 }

// StlsAtIngress reports whether the farm is a stlsdnat farm that works at
// the ingress of its Iface as nftlb's does when given one: it forwards
// frames at layer 2 to Oface and the backends' replies back to Iface,
// rather than letting the kernel route both ways.
func (f *Farm) StlsAtIngress() bool { return f.Mode == ModeStlsDNAT && f.Iface != "" }

// ServesPort reports whether the farm listens on virtual port p (a farm
// without virtual ports listens on every port).
func (f *Farm) ServesPort(p uint16) bool {
	if len(f.VirtualPorts) == 0 {
		return true
	}
	for _, r := range f.VirtualPorts {
		if p >= r.First && p <= r.Last {
			return true
		}
	}
	return false
}

// VirtualAddrs returns the farm's VIPs: none (firewall-mark farms), one,
// or two (family dual).
func (f *Farm) VirtualAddrs() []netip.Addr {
	switch {
	case !f.VirtualAddr.IsValid():
		return nil
	case f.VirtualAddr2.IsValid():
		return []netip.Addr{f.VirtualAddr, f.VirtualAddr2}
	}
	return []netip.Addr{f.VirtualAddr}
}

// Serving reports whether a backend may take new connections.
func (b *Backend) Serving() bool { return b.State == StateUp && b.Weight > 0 }

// PriorityLevel is the farm's serving priority level, computed as nftlb
// computes a farm's "priority" (backends.c, backend_s_gen_priority): start
// at 1; each backend of exactly that level that cannot take new connections
// (down, off, or drained to weight 0) raises the level by one; repeat at the
// new level until a level has none. Backends up at or below the level serve,
// those above it are on standby (GET prints them "available"). So a backend
// of priority 2 is a spare that steps in when one backend of priority 1
// fails, and the farm keeps its number of serving backends.
func (f *Farm) PriorityLevel() uint32 {
	level := uint32(1)
	for {
		down := uint32(0)
		for i := range f.Backends {
			if b := &f.Backends[i]; b.Priority == level && !b.Serving() {
				down++
			}
		}
		if down == 0 {
			return level
		}
		level += down
	}
}

// Standby reports whether a backend is up but above the farm's priority
// level (nftlb's state "available"); level is f.PriorityLevel().
func (b *Backend) Standby(level uint32) bool { return b.State == StateUp && b.Priority > level }

// ActiveBackends returns the backends that take new connections: those up with
// a weight above zero, at or below the farm's priority level (PriorityLevel,
// nftlb's rule).
func (f *Farm) ActiveBackends() []Backend {
	level, n := f.PriorityLevel(), 0
	for i := range f.Backends {
		if b := &f.Backends[i]; b.Serving() && b.Priority <= level {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	// Sized up front: appending 100 backends grew the slice 8 times.
	out := make([]Backend, 0, n)
	for i := range f.Backends {
		if b := &f.Backends[i]; b.Serving() && b.Priority <= level {
			out = append(out, *b)
		}
	}
	return out
}

// FieldError says which field of which object has a bad value and what is allowed.
type FieldError struct {
	Object  string // e.g. `farm "web"` or `farm "web" backend "b1"`
	Field   string
	Value   string
	Problem string // what is wrong, including what is allowed
	// UnknownField is set when the field itself is unknown (not its
	// value). (nftlb answers those with 500; xlb with 400 as any bad
	// value: docs/nftlb-compat.md.)
	UnknownField bool
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Object != "" {
		b.WriteString(e.Object)
		b.WriteString(": ")
	}
	fmt.Fprintf(&b, "field %q", e.Field)
	if e.Value != "" {
		fmt.Fprintf(&b, " value %q", clip(e.Value))
	}
	b.WriteString(": ")
	b.WriteString(e.Problem)
	return b.String()
}

func farmObject(name string) string { return fmt.Sprintf("farm %q", name) }

func backendObject(farm, name string) string {
	return fmt.Sprintf("farm %q backend %q", farm, name)
}
