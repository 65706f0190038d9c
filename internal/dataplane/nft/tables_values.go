package nft

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Table values the nft plane applies to a farm's clients (tables a farm
// attaches whose valtype has mark, limit or dscp). Each prefix length
// present gets, next to the slot's set s<S>-<fam>-<len>:
//
//	map k<S>-<fam>-<len> { type ... : mark }          entries whose mark is not 0
//	set l<S>-<fam>-<len>-<rate>                        entries whose limit is <rate>
//	set m<S>-<fam>-<len>-<rate> { flags dynamic,timeout; timeout 60s }
//	                                                   the entries' token buckets (a meter)
//	set d<S>-<fam>-<len>-<dscp>                        entries whose dscp is <dscp>
//
// and the table's chain, for each length (longest first) before the rule
// that decides the verdict:
//
//	ct state new ip saddr & MASK @l...-<rate> update @m...-<rate> { ip saddr & MASK limit rate over <rate>/second burst <rate> packets } drop
//	ip saddr & MASK @d...-<dscp> ip dscp set <dscp>    (ip6 dscp for IPv6)
//	meta mark set ip saddr & MASK map @k... ct mark set meta mark
//	ip saddr & MASK @s... return                       (allow and value-only tables)
//
// So the most specific entry decides, as in the eBPF plane: a longer
// prefix's verdict rule returns before a shorter one's limit or mark rule
// is reached. A limit is one token bucket per entry (all the clients an
// entry matches share it): <rate> new connections a second, in bursts of
// as many. Why a set per rate: a limit expression's rate is a constant of
// the rule (nftables has no limit from a map's value), and tables hold few
// distinct rates. A DSCP is a constant of its rule for the same reason
// (a payload write takes a register, but the DSCP shares its byte with
// ECN, which the rule keeps: a mask and an xor, constants of a bitwise
// expression), and there are 63 of them at most. The DSCP is set on every
// packet of the client's direction (ipfw's setdscp on the rule's
// matches), not on the replies.

// meterTimeout is how long an entry's token bucket outlives its last new
// connection (it is full again after a second anyway).
const meterTimeout = 60 * time.Second

// regMark is the 32-bit register a mark is looked up into.
const regMark = reg32 + 4

// limKey is a prefix length and a rate.
type limKey struct {
	lenKey
	rate uint32
}

// limSets are one length's and rate's entries and their meter (or one
// length's and DSCP's entries, without a meter).
type limSets struct {
	set, meter *nftables.Set
	n          int
}

// valueSets are a slot's value objects (only for a table whose valtype has
// mark, limit or dscp). dscps are keyed by length and DSCP (limKey.rate).
type valueSets struct {
	marks map[lenKey]*nftables.Set
	markN map[lenKey]int
	lims  map[limKey]*limSets
	dscps map[limKey]*limSets
}

func newValueSets() *valueSets {
	return &valueSets{marks: map[lenKey]*nftables.Set{}, markN: map[lenKey]int{}, lims: map[limKey]*limSets{},
		dscps: map[limKey]*limSets{}}
}

func (v *valueSets) clone() *valueSets {
	c := newValueSets()
	for k, s := range v.marks {
		c.marks[k] = s
	}
	for k, n := range v.markN {
		c.markN[k] = n
	}
	for k, l := range v.lims {
		x := *l
		c.lims[k] = &x
	}
	for k, d := range v.dscps {
		x := *d
		c.dscps[k] = &x
	}
	return c
}

// sets lists every set the value objects hold (to drop them, or forget
// their batch IDs).
func (v *valueSets) sets() []*nftables.Set {
	var out []*nftables.Set
	for _, s := range v.marks {
		out = append(out, s)
	}
	for _, l := range v.lims {
		out = append(out, l.set, l.meter)
	}
	for _, d := range v.dscps {
		out = append(out, d.set)
	}
	return out
}

// hasValues reports whether the table's slot keeps value objects.
func hasValues(tb *model.Table) bool {
	return tb.Values&(model.ValMark|model.ValLimit|model.ValDSCP) != 0
}

func keyType(fam uint8) nftables.SetDatatype {
	if fam == 6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

func limSetName(prefix string, slot uint32, k limKey) string {
	return prefix + slotSetName(slot, k.lenKey)[1:] + "-" + strconv.FormatUint(uint64(k.rate), 10)
}

// valueChange queues a change of the entries' value elements (mark map,
// limit and dscp sets): dels are entries (or old versions of entries) whose values
// go, adds those whose values come. Per set, removals go before additions
// (an entry whose mark changes is removed and added again: the kernel
// refuses an element that exists with other data); a set left empty is
// dropped, a new one made. It reports whether sets were made or dropped
// (the slot's tables' chains must be rewritten).
func (b *tablesBatch) valueChange(slot uint32, v *valueSets, dels, adds []model.TableEntry) bool {
	type setKey struct {
		kind valKind
		k    limKey // rate: the limit, the DSCP, 0 for a mark map
	}
	type ops struct{ del, add []nftables.SetElement }
	group := map[setKey]*ops{}
	put := func(entries []model.TableEntry, del bool) {
		for _, e := range entries {
			if e.Value == nil {
				continue
			}
			lk, key := entryLen(e.Key)
			var ks []setKey
			var els []nftables.SetElement
			if e.Value.Mark != 0 {
				ks = append(ks, setKey{valMark, limKey{lk, 0}})
				els = append(els, nftables.SetElement{Key: key, Val: binaryutil.NativeEndian.PutUint32(e.Value.Mark)})
			}
			if e.Value.Limit != 0 {
				ks = append(ks, setKey{valLimit, limKey{lk, e.Value.Limit}})
				els = append(els, nftables.SetElement{Key: key})
			}
			if e.Value.DSCP != 0 {
				ks = append(ks, setKey{valDSCP, limKey{lk, uint32(e.Value.DSCP)}})
				els = append(els, nftables.SetElement{Key: key})
			}
			for i, k := range ks {
				o := group[k]
				if o == nil {
					o = &ops{}
					group[k] = o
				}
				if del {
					o.del = append(o.del, els[i])
				} else {
					o.add = append(o.add, els[i])
				}
			}
		}
	}
	put(dels, true)
	put(adds, false)
	keys := make([]setKey, 0, len(group))
	for k := range group {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b setKey) int {
		if c := cmp.Compare(a.kind, b.kind); c != 0 {
			return c
		}
		return compareLim(a.k, b.k)
	})
	changed := false
	for _, k := range keys {
		o := group[k]
		var set, meter *nftables.Set
		var n int
		sets := v.lims
		if k.kind == valDSCP {
			sets = v.dscps
		}
		if k.kind == valMark {
			set, n = v.marks[k.k.lenKey], v.markN[k.k.lenKey]
		} else if l := sets[k.k]; l != nil {
			set, meter, n = l.set, l.meter, l.n
		}
		if set == nil {
			o.del = nil // nothing of it is in the kernel
		}
		final := n - len(o.del) + len(o.add)
		switch {
		case final <= 0:
			if set != nil {
				b.dropSets = append(b.dropSets, set)
				if meter != nil {
					b.dropSets = append(b.dropSets, meter)
				}
				changed = true
			}
			if k.kind == valMark {
				delete(v.marks, k.k.lenKey)
				delete(v.markN, k.k.lenKey)
			} else {
				delete(sets, k.k)
			}
			continue
		case set == nil && k.kind == valMark:
			set = &nftables.Set{Table: b.t.table, Name: "k" + slotSetName(slot, k.k.lenKey)[1:], IsMap: true,
				KeyType: keyType(k.k.fam), DataType: nftables.TypeMark, ID: b.t.nextID()}
			b.t.conn.AddSet(set, nil)
			v.marks[k.k.lenKey] = set
			changed = true
		case set == nil && k.kind == valDSCP:
			d := &limSets{set: &nftables.Set{Table: b.t.table, Name: limSetName("d", slot, k.k), KeyType: keyType(k.k.fam), ID: b.t.nextID()}}
			b.t.conn.AddSet(d.set, nil)
			v.dscps[k.k] = d
			set = d.set
			changed = true
		case set == nil:
			l := &limSets{
				set: &nftables.Set{Table: b.t.table, Name: limSetName("l", slot, k.k), KeyType: keyType(k.k.fam), ID: b.t.nextID()},
				meter: &nftables.Set{Table: b.t.table, Name: limSetName("m", slot, k.k), KeyType: keyType(k.k.fam), Dynamic: true,
					HasTimeout: true, Timeout: meterTimeout, ID: b.t.nextID()},
			}
			b.t.conn.AddSet(l.set, nil)
			b.t.conn.AddSet(l.meter, nil)
			v.lims[k.k] = l
			set = l.set
			changed = true
		}
		b.chunked(set, o.del, true)
		b.chunked(set, o.add, false)
		if k.kind == valMark {
			v.markN[k.k.lenKey] = final
		} else {
			sets[k.k].n = final
		}
	}
	return changed
}

func compareLim(a, b limKey) int {
	if c := cmp.Compare(a.fam, b.fam); c != 0 {
		return c
	}
	if c := cmp.Compare(b.bits, a.bits); c != 0 {
		return c
	}
	return cmp.Compare(a.rate, b.rate)
}

// chunked queues elements in messages of tableElemChunk (half for IPv6).
func (b *tablesBatch) chunked(set *nftables.Set, els []nftables.SetElement, del bool) {
	chunk := tableElemChunk / 2
	for len(els) > 0 {
		n := min(chunk, len(els))
		if del {
			b.t.conn.SetDeleteElements(set, els[:n])
		} else {
			b.t.conn.SetAddElements(set, els[:n])
		}
		els = els[n:]
	}
}

// valKind is what a value set holds.
type valKind uint8

const (
	valMark valKind = iota
	valLimit
	valDSCP
)

// keysOfLen are m's keys of prefix length lk, in rule order.
func keysOfLen(m map[limKey]*limSets, lk lenKey) []limKey {
	var keys []limKey
	for k := range m {
		if k.lenKey == lk {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareLim)
	return keys
}

// valueRules are a length's limit, dscp and mark rules (before its verdict
// rule); base loads the client's address, masked, into reg1.
func valueRules(v *valueSets, lk lenKey, base []expr.Any) [][]expr.Any {
	if v == nil {
		return nil
	}
	var rules [][]expr.Any
	for _, k := range keysOfLen(v.lims, lk) {
		l := v.lims[k]
		r := []expr.Any{
			&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		}
		r = append(r, base...)
		r = append(r,
			&expr.Lookup{SourceRegister: reg1, SetName: l.set.Name, SetID: l.set.ID},
			&expr.Dynset{SrcRegKey: reg1, SetName: l.meter.Name, SetID: l.meter.ID, Operation: unix.NFT_DYNSET_OP_UPDATE,
				Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(k.rate), Unit: expr.LimitTimeSecond, Burst: k.rate, Over: true}}},
			&expr.Verdict{Kind: expr.VerdictDrop})
		rules = append(rules, r)
	}
	for _, k := range keysOfLen(v.dscps, lk) {
		d := v.dscps[k]
		r := append(slices.Clone(base), &expr.Lookup{SourceRegister: reg1, SetName: d.set.Name, SetID: d.set.ID})
		rules = append(rules, append(r, setDSCP(lk.fam == 6, uint8(k.rate))...))
	}
	if m := v.marks[lk]; m != nil {
		r := append(slices.Clone(base),
			&expr.Lookup{SourceRegister: reg1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: regMark},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: regMark},
			&expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: regMark})
		rules = append(rules, r)
	}
	return rules
}

// setDSCP is `ip dscp set d` (`ip6 dscp set d`), as nft writes it: the
// header's first two bytes loaded, the DSCP's six bits replaced (ECN and
// the rest kept), written back; IPv4's header checksum updated.
func setDSCP(v6 bool, d uint8) []expr.Any {
	keep, set := []byte{0xff, 0x03}, []byte{0, d << 2} // version+IHL, TOS = DSCP<<2 | ECN
	csum := expr.CsumTypeInet
	if v6 { // version(4) traffic class(8: DSCP<<2 | ECN) flow label(20)
		keep, set = []byte{0xf0, 0x3f}, []byte{d >> 2, d << 6}
		csum = expr.CsumTypeNone
	}
	w := &expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 0, Len: 2,
		CsumType: csum}
	if !v6 {
		w.CsumOffset = 10
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 0, Len: 2},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 2, Mask: keep, Xor: set},
		w,
	}
}
