package engine

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	iradix "github.com/hashicorp/go-immutable-radix/v2"

	"github.com/xlb-lb/xlb/internal/model"
)

// State is one published, immutable version of the desired state. Readers
// (API GETs, dumps, metrics) use it without any lock. It is built on
// persistent radix trees, so a change copies only the paths it touches:
// publishing a new state costs O(changed), not O(farms).
type State struct {
	farms *iradix.Tree[*model.Farm]
	// listeners indexes farms by what they listen on (VIP or mark), to find
	// conflicts in O(farms on that VIP).
	listeners *iradix.Tree[[]string]
	version   uint64
	// ts holds the named tables (tables.go).
	ts tableState
	// addrs are the address objects no farm uses (addresses.go).
	addrs *iradix.Tree[*model.Address]
}

func emptyState() *State {
	return &State{farms: iradix.New[*model.Farm](), listeners: iradix.New[[]string](), ts: emptyTableState(), addrs: iradix.New[*model.Address]()}
}

// Version counts the changes applied since the daemon started.
func (s *State) Version() uint64 { return s.version }

// Len is the number of farms.
func (s *State) Len() int { return s.farms.Len() }

// Farm returns the farm with that name.
func (s *State) Farm(name string) (*model.Farm, bool) { return s.farms.Get([]byte(name)) }

// Farms returns every farm, ordered by name.
func (s *State) Farms() []*model.Farm {
	out := make([]*model.Farm, 0, s.farms.Len())
	it := s.farms.Root().Iterator()
	for _, f, ok := it.Next(); ok; _, f, ok = it.Next() {
		out = append(out, f)
	}
	return out
}

// listenerKeys are the index keys of what a farm listens on: its mark, or
// the addresses of its listeners (two VIPs for a family dual farm, and its
// further addresses: model.Farm.Listeners), each once.
func listenerKeys(f *model.Farm) [][]byte {
	if f.IsMarkFarm() {
		return [][]byte{fmt.Appendf(nil, "m%08x", f.Mark)}
	}
	var out [][]byte
	add := func(v netip.Addr) {
		a := v.As16()
		k := append([]byte{'a'}, a[:]...)
		for _, o := range out {
			if string(o) == string(k) {
				return
			}
		}
		out = append(out, k)
	}
	if len(f.Addresses) == 0 {
		for _, v := range f.VirtualAddrs() {
			add(v)
		}
		return out
	}
	for _, l := range f.Listeners() {
		add(l.Addr)
	}
	return out
}

// listensOn reports whether f listens on key.
func listensOn(f *model.Farm, key []byte) bool {
	for _, k := range listenerKeys(f) {
		if string(k) == string(key) {
			return true
		}
	}
	return false
}

// listenersOn returns f's listeners on the address of key (one for a farm
// without further addresses); nil for a mark key.
func listenersOn(f *model.Farm, key []byte) []model.Listener {
	if key[0] != 'a' {
		return nil
	}
	a, _ := netip.AddrFromSlice(key[1:])
	var out []model.Listener
	for _, l := range f.Listeners() {
		if l.Addr.As16() == a.As16() {
			out = append(out, l)
		}
	}
	return out
}

// overlap reports whether two farms on the same listener key would both claim
// some packet: same (or "all") protocol and overlapping ports. For an
// address key it compares the farms' listeners on that address; it returns
// the protocol and where they clash.
func overlap(a, b *model.Farm, key []byte) (bool, model.Protocol, string) {
	if key[0] != 'a' || len(a.Addresses) == 0 && len(b.Addresses) == 0 {
		// One listener each on key (both VIPs of a dual farm have the
		// farm's protocol and ports): no listeners to build, the common
		// case of a bulk change of many farms on one VIP.
		clash, where := overlapPorts(a.Protocol, a.VirtualPorts, b.Protocol, b.VirtualPorts)
		return clash, a.Protocol, where
	}
	for _, la := range listenersOn(a, key) {
		for _, lb := range listenersOn(b, key) {
			if clash, where := overlapPorts(la.Protocol, la.Ports, lb.Protocol, lb.Ports); clash {
				return true, la.Protocol, where
			}
		}
	}
	return false, 0, ""
}

func overlapPorts(pa model.Protocol, a []model.PortRange, pb model.Protocol, b []model.PortRange) (bool, string) {
	if pa != pb && pa != model.ProtoAll && pb != model.ProtoAll {
		return false, ""
	}
	if len(a) == 0 || len(b) == 0 {
		return true, "every port"
	}
	for _, ra := range a {
		for _, rb := range b {
			if ra.Overlaps(rb) {
				return true, "port " + ra.String()
			}
		}
	}
	return false, ""
}

// describeListener names the listener of f with key.
func describeListener(f *model.Farm, key []byte) string {
	if f.IsMarkFarm() {
		return fmt.Sprintf("mark 0x%x", f.Mark)
	}
	a, _ := netip.AddrFromSlice(key[1:])
	return a.Unmap().String()
}

// shareBySource decides whether farms f and g, which overlap on key
// (protocol proto, where), may share it: only when the farms are chosen
// by source table (model.Farm.SourceTable), each with its own table and at
// most one without (the default), on exactly the same protocol and ports,
// and none of them with policies (a policy is looked up by VIP, protocol
// and port, which would no longer name one farm). Otherwise it returns the
// conflict, with what would make it work.
func shareBySource(f, g *model.Farm, key []byte, proto model.Protocol, where string) error {
	at := fmt.Sprintf("%s %s %s", describeListener(f, key), proto, where)
	switch {
	case f.SourceTable == "" && g.SourceTable == "":
		return &ConflictError{Msg: fmt.Sprintf("farm %q: %s is already served by farm %q (farms may share it only when all but one choose their clients by source-table)", f.Name, at, g.Name)}
	case f.SourceTable == g.SourceTable:
		return &ConflictError{Msg: fmt.Sprintf("farm %q: %s is already served by farm %q with the same source-table %q: farms sharing an address, protocol and port need different source tables", f.Name, at, g.Name, f.SourceTable)}
	case f.IsMarkFarm() || g.IsMarkFarm() || len(f.Addresses) > 0 || len(g.Addresses) > 0 ||
		f.Protocol != g.Protocol || !slices.Equal(f.VirtualPorts, g.VirtualPorts):
		return &ConflictError{Msg: fmt.Sprintf("farm %q: %s is already served by farm %q (protocol %s, virtual-ports %q): farms chosen by source-table on one address must have the same protocol and virtual-ports", f.Name, at, g.Name, g.Protocol, portsText(g.VirtualPorts))}
	case len(f.Policies) > 0 || len(g.Policies) > 0:
		p := f
		if len(p.Policies) == 0 {
			p = g
		}
		return &ConflictError{Msg: fmt.Sprintf("farm %q: %s is shared by farms chosen by source-table, and farm %q has policies: a farm on a shared address, protocol and port cannot have policies (put the clients in the source tables instead)", f.Name, at, p.Name)}
	}
	return nil
}

// portsText is a farm's virtual-ports as the API writes them.
func portsText(ps []model.PortRange) string {
	if len(ps) == 0 {
		return ""
	}
	parts := make([]string, len(ps))
	for i, r := range ps {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}
