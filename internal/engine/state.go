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
}

func emptyState() *State {
	return &State{farms: iradix.New[*model.Farm](), listeners: iradix.New[[]string](), ts: emptyTableState()}
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
// its VIPs (two for a family dual farm).
func listenerKeys(f *model.Farm) [][]byte {
	if f.IsMarkFarm() {
		return [][]byte{fmt.Appendf(nil, "m%08x", f.Mark)}
	}
	var out [][]byte
	for _, v := range f.VirtualAddrs() {
		a := v.As16()
		out = append(out, append([]byte{'a'}, a[:]...))
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

// overlap reports whether two farms on the same listener key would both claim
// some packet: same (or "all") protocol and overlapping ports.
func overlap(a, b *model.Farm) (bool, string) {
	if a.Protocol != b.Protocol && a.Protocol != model.ProtoAll && b.Protocol != model.ProtoAll {
		return false, ""
	}
	if len(a.VirtualPorts) == 0 || len(b.VirtualPorts) == 0 {
		return true, "every port"
	}
	for _, ra := range a.VirtualPorts {
		for _, rb := range b.VirtualPorts {
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
