package nft

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// Hairpin masquerade: a backend of a dnat farm that connects to the farm's
// VIP and is given itself as the backend would get a packet from its own
// address, answer itself directly, and the connection would never
// complete (an LVS-NAT real server cannot be its own client; kube-proxy
// masquerades this "hairpin" traffic: a Pod reaching its own Service). So
// each table holds the set
//
//	set hairpin4 { type ipv4_addr . ipv4_addr }   (and hairpin6)
//
// with an element "b . b" for every serving backend address b of its dnat
// farms, and its postrouting chain masquerades what matches:
//
//	ip saddr . ip daddr @hairpin4 masquerade
//
// After the dnat, source equal to destination is exactly "the client got
// itself". Comparing two fields needs no set (nftables compares a
// register only with a constant), hence one element per address. The
// elements are counted per table (several farms share a backend), so a
// change adds or deletes an element only when the first farm takes an
// address or the last one lets it go: O(changed backends), never a walk
// of the table's farms.

// hairpinElems returns the farm's elements of hairpin4/hairpin6: one per
// distinct serving backend address, for farms in mode dnat, VIP and
// firewall-mark farms (and so farms chosen by source table: the chain
// post-src masquerades them too) alike (snat farms masquerade every
// client anyway; dsr and stlsdnat keep no NAT state to masquerade with).
func hairpinElems(f *model.Farm, p *farmPlan) []elem {
	if f.Mode != model.ModeDNAT || len(p.active) == 0 {
		return nil
	}
	seen := map[netip.Addr]bool{}
	var out []elem
	for _, b := range p.active {
		a := b.Addr.Unmap()
		if seen[a] || a.Is6() != p.v6 || !a.IsValid() {
			continue
		}
		seen[a] = true
		out = append(out, elem{Key: append(a.AsSlice(), a.AsSlice()...)})
	}
	return out
}

// The hairpin sets' names.
const (
	setHair4 = "hairpin4" // backend address . the same address
	setHair6 = "hairpin6" // same for IPv6
)

func hairpinSet(v6 bool) string { return pick(v6, setHair4, setHair6) }

// hairpinSets are the table's static hairpin sets (hash sets of exact
// keys).
func hairpinSets(t *nftables.Table) []*nftables.Set {
	return []*nftables.Set{
		{Table: t, Name: setHair4, Concatenation: true, KeyByteOrder: binaryutil.BigEndian,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr)},
		{Table: t, Name: setHair6, Concatenation: true, KeyByteOrder: binaryutil.BigEndian,
			KeyType: nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeIP6Addr)},
	}
}

// hairpinRules are the postrouting rules: meta nfproto ipv4 ip saddr .
// ip daddr @hairpin4 masquerade (and the IPv6 form).
func hairpinRules() [][]expr.Any {
	var out [][]expr.Any
	for _, v6 := range []bool{false, true} {
		off, alen := uint32(12), uint32(4)
		if v6 {
			off, alen = 8, 16
		}
		out = append(out, append(nfproto(v6),
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
			&expr.Payload{DestRegister: reg32 + addrWords(v6), Base: expr.PayloadBaseNetworkHeader, Offset: off + alen, Len: alen},
			&expr.Lookup{SourceRegister: reg1, SetName: hairpinSet(v6)},
			&expr.Masq{},
		))
	}
	return out
}

// hairpinDelta is a batch's change of the table's hairpin counts, applied
// to the shard when the batch is committed.
type hairpinDelta map[string]int

// hairpin updates the table's hairpin elements for a farm going from old
// to next (either nil): an element is added when its count leaves 0 and
// deleted when it returns to 0.
func (b *batch) hairpin(old, next []elem, v6Old, v6Next bool) {
	if len(old) == 0 && len(next) == 0 {
		return
	}
	if b.hair == nil {
		b.hair = hairpinDelta{}
	}
	count := func(id string) int { return b.p.hair[id] + b.hair[id] }
	var add, del []elem
	// Adds first: an address the farm keeps never passes through 0.
	for _, e := range next {
		if count(e.id()) == 0 {
			add = append(add, e)
		}
		b.hair[e.id()]++
	}
	for _, e := range old {
		b.hair[e.id()]--
		if count(e.id()) == 0 {
			del = append(del, e)
		}
	}
	// An element of one family is never in the other's list (the key
	// lengths differ), so each list goes to its own set.
	b.addElems(b.p.static[hairpinSet(v6Next)], add)
	b.delElems(b.p.static[hairpinSet(v6Old)], del)
}

// commitHairpin applies a committed batch's counts.
func (p *shard) commitHairpin(d hairpinDelta) {
	if p.hair == nil {
		p.hair = map[string]int{}
	}
	for id, n := range d {
		if c := p.hair[id] + n; c > 0 {
			p.hair[id] = c
		} else {
			delete(p.hair, id)
		}
	}
}
