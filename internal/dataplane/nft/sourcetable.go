package nft

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Farms chosen by source table (model.Farm.SourceTable). A farm's chain is
// in its shard table and a source table's sets are in the tables' table,
// and a rule cannot look up a set of another table, so the choice is made
// in two steps, each in its own table:
//
//	table inet xlb-tables
//	chain prerouting { ...policies...
//	    ct state new ip daddr . meta l4proto . th dport vmap @fs4 }   # shared keys
//	chain s-<key hash> {                     # the key's farms, in plan.SourceOrder
//	    ip saddr & 255.255.255.0 @s7-4-24 meta mark set 0x786dXXXX ct label set 127 return
//	    ... one rule per prefix length present in each farm's table }
//
// and in the farm's shard table the farm is a firewall-mark farm of its tag
// (sourceMark): the NAT chains' first lookup, meta mark vmap @fwm4, sends
// the connection to its chain before the VIP maps send it to the key's
// default farm. The tag is the farm's, derived from its name, in marks
// 0x786d0000-0x786dffff, which firewall-mark farms may not use. What the
// shard tables find by VIP is the default farm's: the postrouting chain
// sends a tagged connection to post-src first (sourceTaggedPostRule), the
// filter chain lets a labelled one by (sourceLabelRule).

const (
	sourceMarkBase = 0x786d0000 // "xm": marks of farms chosen by source table
	sourceMarkMask = 0xffff0000
	setFS4         = "fs4"
	setFS6         = "fs6"
	srcChainPrefix = "s-"
)

// sourceMark is the packet mark that sends a connection to the farm name
// chosen by source table.
func sourceMark(name string) uint32 {
	s := sha256.Sum256([]byte(name))
	return sourceMarkBase | uint32(binary.BigEndian.Uint16(s[:2]))
}

// asMarkFarm is how the shard tables hold a farm chosen by source table: a
// firewall-mark farm of its tag. Other farms are returned as they are.
func asMarkFarm(f *model.Farm) *model.Farm {
	if f == nil || f.SourceTable == "" {
		return f
	}
	c := f.Clone()
	c.VirtualAddr, c.VirtualAddr2, c.VirtualPorts = netip.Addr{}, netip.Addr{}, nil
	c.Mark = sourceMark(f.Name)
	c.SourceTable = ""
	return &c
}

// asMarkDiff is d with its farms chosen by source table as mark farms.
func asMarkDiff(d plan.Diff) plan.Diff {
	out := plan.Diff{Changes: make([]plan.FarmChange, len(d.Changes))}
	for i, c := range d.Changes {
		out.Changes[i] = plan.FarmChange{Old: asMarkFarm(c.Old), New: asMarkFarm(c.New)}
	}
	return out
}

func asMarkFarms(fs []*model.Farm) []*model.Farm {
	out := make([]*model.Farm, len(fs))
	for i, f := range fs {
		out[i] = asMarkFarm(f)
	}
	return out
}

// checkSource refuses what this plane does not do with a source table, and
// firewall marks that are the source farms' tags.
func checkSource(f *model.Farm) error {
	if f.SourceTable == "" {
		if f.IsMarkFarm() && f.Mark&sourceMarkMask == sourceMarkBase {
			return dataplane.Refuse(f, "mark", fmt.Sprintf("0x%x", f.Mark),
				"marks 0x786d0000-0x786dffff are the nft data plane's own (farms chosen by source table): use another mark")
		}
		return nil
	}
	switch {
	case f.Mode != model.ModeSNAT && f.Mode != model.ModeDNAT:
		return dataplane.Refuse(f, "source-table", f.SourceTable,
			"the nft data plane chooses farms by source table in modes snat and dnat (mode "+f.Mode.String()+" forwards before the prerouting hook that chooses)")
	case f.Family == model.FamilyDual:
		return dataplane.Refuse(f, "source-table", f.SourceTable,
			"the nft data plane chooses farms of family ipv4 or ipv6 by source table, not dual ones: make one farm per family")
	}
	return check(asMarkFarm(f))
}

// sourceGroup is the farms chosen by source table on one VIP, protocol
// and ports (the engine makes farms sharing a key have the same ports).
type sourceGroup struct {
	farms  []*model.Farm
	v4, v6 []nftables.SetElement // the key's fs4/fs6 elements
}

func sourceChain(f *model.Farm) string {
	var b strings.Builder
	for _, a := range f.VirtualAddrs() {
		b.WriteString(a.String())
		b.WriteByte(' ')
	}
	fmt.Fprintf(&b, "%s %v", f.Protocol, f.VirtualPorts)
	s := sha256.Sum256([]byte(b.String()))
	return srcChainPrefix + hex.EncodeToString(s[:hashLen/2])
}

func sourceGroups(farms map[string]*model.Farm) map[string]*sourceGroup {
	out := map[string]*sourceGroup{}
	for _, name := range slices.Sorted(maps.Keys(farms)) {
		f := farms[name]
		ch := sourceChain(f)
		g := out[ch]
		if g == nil {
			g = &sourceGroup{}
			g.v4, g.v6, _ = farmKeys(f, ch)
			out[ch] = g
		}
		g.farms = append(g.farms, f)
	}
	return out
}

// sourceRules are the rules of a key's chain: each farm's table, in
// plan.SourceOrder, one rule per prefix length present, a match setting
// the farm's tag and ending the chain.
func (b *tablesBatch) sourceRules(g *sourceGroup) [][]expr.Any {
	var rules [][]expr.Any
	for _, f := range plan.SourceOrder(g.farms, b.tables) {
		s := b.slots[b.tables[f.SourceTable].Slot]
		if s == nil || f.State != model.StateUp {
			continue // a farm not up is not in its shard table: the default serves its clients
		}
		mark := []expr.Any{
			&expr.Immediate{Register: reg1, Data: binaryutil.NativeEndian.PutUint32(sourceMark(f.Name))},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
			&expr.Immediate{Register: reg1, Data: sourceLabel()},
			&expr.Ct{Key: expr.CtKeyLABELS, SourceRegister: true, Register: reg1},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}
		for _, lk := range sortedLens(s.sets) {
			set := s.sets[lk]
			r := append(saddrMatch(lk), &expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID})
			rules = append(rules, append(r, mark...))
		}
	}
	return rules
}

// writeSources brings the source chains and the fs4/fs6 elements from the
// groups the kernel holds (have) to those of farms; it returns the new
// groups and the chains to delete once nothing refers to them.
func (b *tablesBatch) writeSources(have map[string]*sourceGroup, farms map[string]*model.Farm) (map[string]*sourceGroup, []string) {
	want := sourceGroups(farms)
	var drop []string
	for ch, g := range have {
		if want[ch] != nil {
			continue
		}
		b.sourceElems(g, true)
		drop = append(drop, ch)
	}
	for _, ch := range slices.Sorted(maps.Keys(want)) {
		g := want[ch]
		c := b.t.conn.AddChain(b.chain(ch))
		b.t.conn.FlushChain(c)
		for _, r := range b.sourceRules(g) {
			b.t.conn.AddRule(&nftables.Rule{Table: b.t.table, Chain: c, Exprs: r})
		}
		if have[ch] == nil {
			b.sourceElems(g, false)
		}
	}
	return want, drop
}

func (b *tablesBatch) sourceElems(g *sourceGroup, del bool) {
	for name, els := range map[string][]nftables.SetElement{setFS4: g.v4, setFS6: g.v6} {
		if len(els) == 0 {
			continue
		}
		if del {
			b.t.conn.SetDeleteElements(b.t.maps[name], els)
		} else {
			b.t.conn.SetAddElements(b.t.maps[name], els)
		}
	}
}

// sourceBaseRules are the base chains' rules that send a new connection to
// a shared key's chain.
func (t *Tables) sourceBaseRules(v6 bool) []expr.Any {
	m := t.maps[pick(v6, setFS4, setFS6)]
	return append(append([]expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}, svcKeyLoads(v6)...),
		&expr.Lookup{SourceRegister: reg1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: regVerdict})
}

// sourceMarksFree refuses two farms chosen by source table whose names
// give the same tag (16 bits of a hash: rare, and a rename cures it).
func sourceMarksFree(farms map[string]*model.Farm) error {
	seen := map[uint32]string{}
	for _, name := range slices.Sorted(maps.Keys(farms)) {
		m := sourceMark(name)
		if other, ok := seen[m]; ok {
			return dataplane.Refuse(farms[name], "source-table", farms[name].SourceTable,
				fmt.Sprintf("the nft data plane tags a farm chosen by source table with a mark from its name, and farm %q has the same (0x%x): rename one of them", other, m))
		}
		seen[m] = name
	}
	return nil
}

// sourceLabelBit is the conntrack label (the last of 128) of connections
// steered to a farm chosen by source table, set with the tag: the tag is
// the mark of their first packet only, the label stays with the
// connection, so the shards' filter chain (filterPriority, -105, after the
// choice at -110; found by VIP: the key's default farm's filters) lets
// their packets by, the first included (sourceLabelRule): the default
// farm's queue and helper do not reach them.
const sourceLabelBit = 127

// sourceLabel is the label register value: bit sourceLabelBit set, in the
// kernel's order (host-endian longs), as nft's `ct label set 127` sends.
func sourceLabel() []byte {
	b := make([]byte, 16)
	b[sourceLabelBit/8] = 1 << (sourceLabelBit % 8)
	return b
}

// sourceLabelRule: ct label 127 accept, the shards' filter chain's first
// rule (only in tables with a farm that has filters).
func sourceLabelRule() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyLABELS, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 16, Mask: sourceLabel(), Xor: make([]byte, 16)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 16)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// sourceTaggedRule: meta mark & 0xffff0000 == 0x786d0000 accept, after the
// firewall-mark lookups of every table's NAT chains. The NAT chains of the
// tables run one after the other and the first that translates a
// connection decides it: a connection tagged for a farm chosen by source
// table must not meet its key's default farm (through the VIP maps) in a
// table before the one that holds its farm.
func sourceTaggedRule() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(sourceMarkMask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(sourceMarkBase)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// sourceTaggedPostRule: meta mark & 0xffff0000 == 0x786d0000 goto
// post-src, the postrouting chain's first rule. What the postrouting chain
// finds by VIP, protocol and port (the log, the backends' and the farm's
// snat or masquerade) is the key's default farm's; a connection tagged for
// another farm of the key takes only its own farm's rules, by mark. In a
// table that does not hold its farm post-src finds nothing and the
// connection goes on, untranslated, to the next table's chain. One rule
// more for the first packet of every connection.
func sourceTaggedPostRule() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(sourceMarkMask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(sourceMarkBase)},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainPostSrc},
	}
}
