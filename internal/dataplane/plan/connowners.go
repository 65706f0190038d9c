package plan

import (
	"net/netip"

	"github.com/xlb-lb/xlb/internal/model"
)

// ConnOwners tells which farm a tracked connection belongs to where farms
// share a VIP, protocol and port (farms chosen by source table and their
// default farm). The connection tables match entries to farms by VIP,
// protocol and port, which names every farm of a shared key; the kernel's
// conntrack keeps no farm of its own to tell them apart (nft), and the
// eBPF program's generation ids are freed as farms change. One answer for
// both planes' listings, counts and deletions.
//
// The evidence, strongest first: the connection's backend, when only one
// of the key's farms has a backend of its address (farms chosen by source
// table usually have backends of their own); else the farm whose source
// table holds the client now, in SourceOrder, else the key's default farm.
// A connection made before its client moved to another table is named by
// the tables as they are now when its backend does not tell: the data
// path's choice at the connection's first packet is not kept.
type ConnOwners struct {
	byKey map[ownerKey][]*model.Farm // only keys of more than one farm
	order map[string]int             // source farm -> its place in SourceOrder
	tbls  map[string]*model.Table
}

type ownerKey struct {
	proto uint8
	vip   netip.Addr
}

// NewConnOwners indexes the farms (all of them, not only those listed:
// whether a key is shared depends on the others) and their tables.
func NewConnOwners(farms []*model.Farm, tables map[string]*model.Table) *ConnOwners {
	o := &ConnOwners{byKey: map[ownerKey][]*model.Farm{}, order: map[string]int{}, tbls: tables}
	shared := false
	for _, f := range farms {
		if !f.Listens() {
			continue
		}
		shared = shared || f.SourceTable != ""
		for _, v := range f.VirtualAddrs() {
			k := ownerKey{f.Protocol.Number(), v}
			o.byKey[k] = append(o.byKey[k], f)
		}
	}
	if !shared {
		o.byKey = nil
		return o
	}
	for k, fs := range o.byKey {
		if len(fs) < 2 {
			delete(o.byKey, k)
		}
	}
	for i, f := range SourceOrder(farms, tables) {
		o.order[f.Name] = i
	}
	return o
}

// Shared reports whether any farms share a key: without, Owner always
// answers "".
func (o *ConnOwners) Shared() bool { return o != nil && o.byKey != nil }

// Owner returns the name of the farm a connection of protocol proto
// (its IP protocol number) from client to vip, sent to backend, belongs
// to; "" when no farm shares the connection's key with another (the
// listings' own match by key is then the answer) or none of the key's
// farms takes it.
func (o *ConnOwners) Owner(proto uint8, vip netip.AddrPort, client, backend netip.Addr) string {
	if !o.Shared() {
		return ""
	}
	var cands []*model.Farm
	for _, p := range []uint8{proto, 0} {
		for _, f := range o.byKey[ownerKey{p, vip.Addr().Unmap()}] {
			if f.ServesPort(vip.Port()) {
				cands = append(cands, f)
			}
		}
	}
	if len(cands) < 2 {
		return ""
	}
	// The backend, when one farm only has it.
	var byBackend []*model.Farm
	for _, f := range cands {
		if hasBackendAddr(f, backend.Unmap()) {
			byBackend = append(byBackend, f)
		}
	}
	if len(byBackend) == 1 {
		return byBackend[0].Name
	}
	if len(byBackend) > 1 {
		cands = byBackend
	}
	// The tables, as the data path tries them for a new flow.
	best, dflt := -1, ""
	for i, f := range cands {
		if f.SourceTable == "" {
			if dflt == "" {
				dflt = f.Name
			}
			continue
		}
		pos, ok := o.order[f.Name]
		if !ok {
			continue
		}
		if _, in := o.tbls[f.SourceTable].LookupAddr(client.Unmap()); in && (best < 0 || pos < o.order[cands[best].Name]) {
			best = i
		}
	}
	if best >= 0 {
		return cands[best].Name
	}
	return dflt
}

func hasBackendAddr(f *model.Farm, a netip.Addr) bool {
	for i := range f.Backends {
		if f.Backends[i].Addr == a {
			return true
		}
	}
	return false
}
