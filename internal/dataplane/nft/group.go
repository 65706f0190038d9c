package nft

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/xlb-lb/xlb/internal/model"
)

// Group chains. Every commit walks every chain of every table (doc.go), so a
// chain per farm makes each change cost O(farms): about 1 ms at 10,000 farms
// with cold caches. A farm whose chain would hold only its scheduling rule
// (rr, weight, hash, symhash or maglev over a backend map; at most one
// virtual port range; no persistence, backend marks or limits, new-rtlimit
// or est-connlimit) has no chain of its own: its rule, prefixed with a match
// on the farm's VIP, protocol and ports, sits in a group chain shared by up
// to groupSize farms of its family,
//
//	chain grp4-0 {
//	  @nh,128,32 0xa630002 tcp dport 80 counter dnat ip to numgen inc mod 4 map @m-... comment "farm web"
//	  ...   (up to groupSize farms, newest first)
//	  counter drop
//	}
//
// and its svc elements goto the group chain. The farm's rule keeps its own
// numgen counter (round robin needs one per farm; nothing but a rule of its
// own gives that). A new connection to a grouped farm costs the VIP
// compare of the farms before it in its group, about 10 ns each (measured:
// see groupMatch), once per connection: nat chains see only a connection's
// first packet.
//
// A farm's rules are found by their comment ("farm <name>") when they must
// go: the group chain is listed from the kernel (groupSize rules at most)
// the first time after a change touched it. Changing a grouped farm keeps it
// in its group when it still qualifies, so its svc elements stay as they
// are. A group chain that a change empties is deleted; Reconcile packs the
// groups afresh.
const (
	chainGrp4 = "grp4-" // group chain of IPv4 farms: grp4-<index, hex>
	chainGrp6 = "grp6-" // same for IPv6
	groupSize = 16      // farms per group chain
)

func groupChain(v6 bool, i int) string {
	return pick(v6, chainGrp4, chainGrp6) + strconv.FormatInt(int64(i), 16)
}

func famIndex(v6 bool) int { return pick(v6, 0, 1) }

// groupCounts is the number of farms in each group chain, per family (IPv4,
// IPv6); -1: there is no chain of that number (it was emptied and deleted;
// the next new group takes the number).
type groupCounts [2][]int

// groupRef names a group chain.
type groupRef struct {
	v6 bool
	i  int
}

func (g groupCounts) clone() groupCounts {
	return groupCounts{slices.Clone(g[0]), slices.Clone(g[1])}
}

// setGrouped marks the farm for a group chain if its chain would hold its
// scheduling rule and nothing else (see above). Called after setDirect.
func (p *farmPlan) setGrouped(f *model.Farm) {
	if !p.isDirect() && !p.mark && !p.dsrMode && !p.stls && p.kind != kindNone && !p.ids &&
		f.NewRTLimit == 0 && f.EstConnLimit == 0 && len(f.VirtualPorts) <= 1 && len(f.Addresses) == 0 {
		p.via = chainGroup
	}
}

// setChain points the farm's service elements at chain.
func (p *farmPlan) setChain(chain string) {
	p.chain = chain
	for i := range p.svc {
		p.svc[i].Chain = chain
	}
}

// groupMatch selects a farm's packets in its group chain:
//
//	@nh,128,32 VIP [meta l4proto P [th dport A | A-B]]   (IPv6: @nh,192,128)
//
// that is ip daddr VIP, without the meta nfproto match nft needs to list it
// so: the svc map has sent only packets of the farm's family here, and the
// nfproto match cost each new connection about 25 ns per farm it passes in
// the group (BenchmarkGroupPosition: the last of 16 farms paid 474-556 ns
// more than the first with it, 137-178 ns without). nft lists the address
// in hex; the rule's comment names the farm.
func groupMatch(f *model.Farm, v6 bool) []expr.Any {
	off, alen := uint32(16), uint32(4)
	if v6 {
		off, alen = 24, 16
	}
	r := append([]expr.Any{},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: f.VirtualAddr.AsSlice()})
	if f.Protocol == model.ProtoAll {
		return r
	}
	r = append(r,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{f.Protocol.Number()}})
	if len(f.VirtualPorts) == 0 {
		return r
	}
	pr := f.VirtualPorts[0]
	r = append(r, &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	if pr.First == pr.Last {
		return append(r, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(pr.First)})
	}
	return append(r, &expr.Range{Op: expr.CmpOpEq, Register: reg1,
		FromData: binaryutil.BigEndian.PutUint16(pr.First), ToData: binaryutil.BigEndian.PutUint16(pr.Last)})
}

// farmComment is the comment that names a farm's rules in a group chain.
func farmComment(farm string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, "farm "+farm)
}

// groupRules returns a grouped farm's rules as they go into its group
// chain: the farm chain's rules without the final drop (the group chain
// ends with one), each prefixed with the farm's match.
func groupRules(f *model.Farm, v6 bool, rules [][]expr.Any) [][]expr.Any {
	rules = rules[:len(rules)-1]
	out := make([][]expr.Any, len(rules))
	for i, r := range rules {
		out[i] = append(groupMatch(f, v6), r...)
	}
	return out
}

// joinGroup gives a grouped farm a place in a group chain of its family:
// prefer (its group before this change, or -1) if it has room, else the
// first group with room, else a new group chain.
func (b *batch) joinGroup(pl *farmPlan, prefer int) {
	fi := famIndex(pl.v6)
	counts := b.groups[fi]
	g := -1
	if prefer >= 0 && prefer < len(counts) && counts[prefer] >= 0 && counts[prefer] < groupSize {
		g = prefer
	}
	for i := 0; g < 0 && i < len(counts); i++ {
		if counts[i] >= 0 && counts[i] < groupSize {
			g = i
		}
	}
	if g < 0 {
		g = slices.Index(counts, -1)
		if g < 0 {
			g = len(counts)
			b.groups[fi] = append(counts, -1)
		}
		b.addGroupChain(pl.v6, g)
		b.groups[fi][g] = 0
	}
	b.groups[fi][g]++
	pl.group = g
	pl.setChain(groupChain(pl.v6, g))
	b.touched[pl.chain] = groupRef{pl.v6, g}
}

// dropEmptyGroups deletes the group chains this batch emptied. It goes
// last in the batch: the svc elements that pointed to them are gone by then.
func (b *batch) dropEmptyGroups() {
	for name, g := range b.touched {
		if b.groups[famIndex(g.v6)][g.i] == 0 {
			ch := &nftables.Chain{Table: b.p.table, Name: name}
			b.c.FlushChain(ch)
			b.delChain(ch)
			b.groups[famIndex(g.v6)][g.i] = -1
		}
	}
}

// addGroupChain creates (or empties) group chain g: only its final drop,
// which a packet reaches if no farm of the group matches (it cannot: the
// svc elements and the farms' rules change in the same batch), so that it
// never falls through to local sockets.
func (b *batch) addGroupChain(v6 bool, g int) {
	ch := b.c.AddChain(&nftables.Chain{Table: b.p.table, Name: groupChain(v6, g)})
	b.c.FlushChain(ch)
	b.c.AddRule(&nftables.Rule{Table: b.p.table, Chain: ch, Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}})
}

// insertGroupRules puts a grouped farm's rules at the head of its group
// chain, in order.
func (b *batch) insertGroupRules(pl *farmPlan, f *model.Farm, rules [][]expr.Any) {
	ch := &nftables.Chain{Table: b.p.table, Name: pl.chain}
	ud := farmComment(pl.name)
	rules = groupRules(f, pl.v6, rules)
	for i := len(rules) - 1; i >= 0; i-- { // each insert goes to the head
		b.c.InsertRule(&nftables.Rule{Table: b.p.table, Chain: ch, Exprs: rules[i], UserData: ud})
	}
}

// leaveGroup deletes a grouped farm's rules from its group chain. They are
// found by their comment; a rule deleted by hand is not there to delete
// (Reconcile repairs such drift). If the chain cannot be listed, the batch
// fails (b.err).
func (b *batch) leaveGroup(pl *farmPlan) {
	chain := groupChain(pl.v6, pl.group)
	handles, err := b.p.groupHandles(chain)
	if err != nil {
		b.err = cmp.Or(b.err, err)
		return
	}
	for _, h := range handles[pl.name] {
		_ = b.c.DelRule(&nftables.Rule{Table: b.p.table, Chain: &nftables.Chain{Table: b.p.table, Name: chain}, Handle: h})
	}
	b.groups[famIndex(pl.v6)][pl.group]--
	b.touched[chain] = groupRef{pl.v6, pl.group}
}

// groupHandles returns the rule handles of each farm in a group chain,
// listing the chain from the kernel unless no change touched it since it
// was last listed.
func (p *shard) groupHandles(chain string) (map[string][]uint64, error) {
	if h, ok := p.ghandles[chain]; ok {
		return h, nil
	}
	rules, err := p.conn.GetRules(p.table, &nftables.Chain{Table: p.table, Name: chain})
	if err != nil {
		return nil, fmt.Errorf("list group chain %s: %w", chain, err)
	}
	h := map[string][]uint64{}
	for _, r := range rules {
		if c, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && len(c) > len("farm ") && c[:len("farm ")] == "farm " {
			h[c[len("farm "):]] = append(h[c[len("farm "):]], r.Handle)
		}
	}
	p.ghandles[chain] = h
	return h, nil
}
