package engine

import (
	"fmt"
	"net/netip"

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
