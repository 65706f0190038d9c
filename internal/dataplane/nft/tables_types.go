package nft

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// Policies over number, iface, mac and flow tables. A slot of such a table
// is one hash set (with element counters) per family its keys need: flow
// tables with an address field have one per family (the addresses' size
// differs), the others one. What a packet is looked up by:
//
//	number  th sport                              the client's port (entries past 65535 match nothing)
//	iface   meta iifname                          the interface the packet came in on
//	mac     ether saddr                           the client's (or its router's) Ethernet address
//	flow    ip saddr . meta l4proto . th sport . ip daddr . th dport, the table's fields only
//
// The table's chain t<id> has one rule per set: <loads> @o<S>-<fam> drop
// (deny) or return (allow, then a last rule that drops).

// otherSlot is the sets of a slot of a number, iface, mac or flow table.
type otherSlot struct {
	typ   model.TableType
	flow  model.FlowFields
	sets  map[uint8]*nftables.Set // family (0: none, 4, 6) -> set
	count map[uint8]int
}

func newOtherSlot(tb *model.Table) *otherSlot {
	return &otherSlot{typ: tb.Type, flow: tb.Flow, sets: map[uint8]*nftables.Set{}, count: map[uint8]int{}}
}

func (o *otherSlot) clone() *otherSlot {
	c := &otherSlot{typ: o.typ, flow: o.flow, sets: map[uint8]*nftables.Set{}, count: map[uint8]int{}}
	for k, s := range o.sets {
		c.sets[k] = s
	}
	for k, n := range o.count {
		c.count[k] = n
	}
	return c
}

func otherSetName(slot uint32, fam uint8) string {
	return "o" + strconv.FormatUint(uint64(slot), 10) + "-" + strconv.Itoa(int(fam))
}

// hasAddr reports whether flow fields include an address.
func hasAddr(ff model.FlowFields) bool { return ff&(model.FlowSrcIP|model.FlowDstIP) != 0 }

// otherKeyType is the set's key type for a family (4, 6, or 0).
func (o *otherSlot) keyType(fam uint8) nftables.SetDatatype {
	switch o.typ {
	case model.TableNumber:
		return nftables.TypeInetService
	case model.TableIface:
		return nftables.TypeIFName
	case model.TableMAC:
		return nftables.TypeEtherAddr
	}
	var ts []nftables.SetDatatype
	addr := nftables.TypeIPAddr
	if fam == 6 {
		addr = nftables.TypeIP6Addr
	}
	for _, f := range []struct {
		bit model.FlowFields
		t   nftables.SetDatatype
	}{{model.FlowSrcIP, addr}, {model.FlowProto, nftables.TypeInetProto}, {model.FlowSrcPort, nftables.TypeInetService},
		{model.FlowDstIP, addr}, {model.FlowDstPort, nftables.TypeInetService}} {
		if o.flow&f.bit != 0 {
			ts = append(ts, f.t)
		}
	}
	if len(ts) == 1 {
		return ts[0]
	}
	return nftables.MustConcatSetType(ts...)
}

// elemKey is an entry's key as the kernel holds it, and its family; ok is
// false for a key no packet can match (a number past 65535).
func (o *otherSlot) elemKey(k model.TableKey) (key []byte, fam uint8, ok bool) {
	switch o.typ {
	case model.TableNumber:
		n := k.Number()
		if n > 0xffff {
			return nil, 0, false
		}
		return binary.BigEndian.AppendUint16(nil, uint16(n)), 0, true
	case model.TableIface:
		b := make([]byte, 16)
		copy(b, k)
		return b, 0, true
	case model.TableMAC:
		return []byte(k), 0, true
	}
	f := k.Flow(o.flow)
	if hasAddr(o.flow) {
		fam = 4
		if (o.flow&model.FlowSrcIP != 0 && f.SrcIP.Is6()) || (o.flow&model.FlowSrcIP == 0 && f.DstIP.Is6()) {
			fam = 6
		}
	}
	var b []byte
	field := func(v []byte) {
		b = append(b, v...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	if o.flow&model.FlowSrcIP != 0 {
		field(f.SrcIP.AsSlice())
	}
	if o.flow&model.FlowProto != 0 {
		field([]byte{f.Proto})
	}
	if o.flow&model.FlowSrcPort != 0 {
		field(binary.BigEndian.AppendUint16(nil, f.SrcPort))
	}
	if o.flow&model.FlowDstIP != 0 {
		field(f.DstIP.AsSlice())
	}
	if o.flow&model.FlowDstPort != 0 {
		field(binary.BigEndian.AppendUint16(nil, f.DstPort))
	}
	if countFields(o.flow) == 1 {
		// A single field is a plain key, not a concatenation: no padding.
		switch {
		case o.flow&(model.FlowSrcIP|model.FlowDstIP) != 0:
		case o.flow&model.FlowProto != 0:
			b = b[:1]
		default:
			b = b[:2]
		}
	}
	return b, fam, true
}

func countFields(ff model.FlowFields) int {
	n := 0
	for ; ff != 0; ff &= ff - 1 {
		n++
	}
	return n
}

// keyOf turns a kernel element's key back into the entry's key (for the
// counters).
func (o *otherSlot) keyOf(b []byte, fam uint8) (model.TableKey, bool) {
	switch o.typ {
	case model.TableNumber:
		if len(b) < 2 {
			return "", false
		}
		return model.NumberKey(uint32(binary.BigEndian.Uint16(b))), true
	case model.TableIface:
		n := slices.Index(b, 0)
		if n < 0 {
			n = len(b)
		}
		return model.TableKey(b[:n]), true
	case model.TableMAC:
		if len(b) < 6 {
			return "", false
		}
		return model.TableKey(b[:6]), true
	}
	var f model.FlowKey
	alen := 4
	if fam == 6 {
		alen = 16
	}
	single := countFields(o.flow) == 1
	take := func(n int) []byte {
		w := n
		if !single {
			w = (n + 3) &^ 3
		}
		if len(b) < w {
			return nil
		}
		v := b[:n]
		b = b[w:]
		return v
	}
	addr := func() netip.Addr {
		a, _ := netip.AddrFromSlice(take(alen))
		return a
	}
	if o.flow&model.FlowSrcIP != 0 {
		f.SrcIP = addr()
	}
	if o.flow&model.FlowProto != 0 {
		if v := take(1); v != nil {
			f.Proto = v[0]
		}
	}
	if o.flow&model.FlowSrcPort != 0 {
		if v := take(2); v != nil {
			f.SrcPort = binary.BigEndian.Uint16(v)
		}
	}
	if o.flow&model.FlowDstIP != 0 {
		f.DstIP = addr()
	}
	if o.flow&model.FlowDstPort != 0 {
		if v := take(2); v != nil {
			f.DstPort = binary.BigEndian.Uint16(v)
		}
	}
	return f.Key(o.flow), true
}

// otherEntries queues entries' elements (added, or with del removed); a
// family's first element makes its set, its last drops it. It reports
// whether sets were made or dropped (the chains must be rewritten).
func (b *tablesBatch) otherEntries(slot uint32, o *otherSlot, entries []model.TableEntry, del bool) bool {
	groups := map[uint8][]nftables.SetElement{}
	for _, e := range entries {
		if key, fam, ok := o.elemKey(e.Key); ok {
			groups[fam] = append(groups[fam], nftables.SetElement{Key: key})
		}
	}
	changed := false
	fams := make([]uint8, 0, len(groups))
	for f := range groups {
		fams = append(fams, f)
	}
	slices.Sort(fams)
	for _, fam := range fams {
		els := groups[fam]
		set := o.sets[fam]
		switch {
		case del && set == nil:
			continue
		case del:
			o.count[fam] -= len(els)
			if o.count[fam] <= 0 {
				delete(o.sets, fam)
				delete(o.count, fam)
				b.dropSets = append(b.dropSets, set)
				changed = true
				continue
			}
		case set == nil:
			kt := o.keyType(fam)
			set = &nftables.Set{Table: b.t.table, Name: otherSetName(slot, fam), KeyType: kt, Counter: true,
				Concatenation: len(nftables.ConcatSetTypeElements(kt)) > 1, ID: b.t.nextID()}
			b.t.conn.AddSet(set, nil)
			o.sets[fam] = set
			changed = true
			fallthrough
		default:
			o.count[fam] += len(els)
		}
		b.chunked(set, els, del)
	}
	return changed
}

// otherLoads loads what a packet is looked up by into the registers from
// reg1, for a set of family fam.
func (o *otherSlot) otherLoads(fam uint8) []expr.Any {
	switch o.typ {
	case model.TableNumber:
		return []expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}}
	case model.TableIface:
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}}
	case model.TableMAC:
		return []expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6}}
	}
	var out []expr.Any
	v6 := fam == 6
	if fam != 0 {
		out = nfproto(v6)
	}
	sip, dip, alen := uint32(12), uint32(16), uint32(4)
	if v6 {
		sip, dip, alen = 8, 24, 16
	}
	reg := uint32(reg32)
	next := func(words uint32) uint32 {
		r := reg
		reg += words
		if r == reg32 {
			return reg1
		}
		return r
	}
	if o.flow&model.FlowSrcIP != 0 {
		out = append(out, &expr.Payload{DestRegister: next(alen / 4), Base: expr.PayloadBaseNetworkHeader, Offset: sip, Len: alen})
	}
	if o.flow&model.FlowProto != 0 {
		out = append(out, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next(1)})
	}
	if o.flow&model.FlowSrcPort != 0 {
		out = append(out, &expr.Payload{DestRegister: next(1), Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2})
	}
	if o.flow&model.FlowDstIP != 0 {
		out = append(out, &expr.Payload{DestRegister: next(alen / 4), Base: expr.PayloadBaseNetworkHeader, Offset: dip, Len: alen})
	}
	if o.flow&model.FlowDstPort != 0 {
		out = append(out, &expr.Payload{DestRegister: next(1), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	}
	return out
}

// otherRules are the rules of the chain of a number, iface, mac or flow
// policy table.
func (o *otherSlot) otherRules(tb *model.Table, logx []expr.Any) [][]expr.Any {
	verdict := expr.VerdictDrop
	if tb.Verdict == model.ListAllow {
		verdict = expr.VerdictReturn
	}
	fams := make([]uint8, 0, len(o.sets))
	for f := range o.sets {
		fams = append(fams, f)
	}
	slices.Sort(fams)
	var rules [][]expr.Any
	for _, fam := range fams {
		s := o.sets[fam]
		r := append(o.otherLoads(fam), &expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID})
		if verdict == expr.VerdictDrop {
			r = append(r, logx...)
		}
		rules = append(rules, append(r, &expr.Verdict{Kind: verdict}))
	}
	if verdict == expr.VerdictReturn {
		rules = append(rules, append(slices.Clone(logx), &expr.Verdict{Kind: expr.VerdictDrop}))
	}
	return rules
}

// otherCounters reads the element counters of a slot's sets.
func (t *Tables) otherCounters(o *otherSlot, out dataplane.TableCounters) error {
	for fam, s := range o.sets {
		els, err := t.conn.GetSetElements(s)
		if err != nil {
			t.redial()
			return err
		}
		for _, el := range els {
			if el.Counter == nil || el.Counter.Packets == 0 {
				continue
			}
			if k, ok := o.keyOf(el.Key, fam); ok {
				out[k] = dataplane.EntryCounters{Packets: el.Counter.Packets, Bytes: el.Counter.Bytes}
			}
		}
	}
	return nil
}
