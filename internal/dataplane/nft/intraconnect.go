package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// intra-connect off (nftlb's field): connections the LB host itself opens
// to the farm's address are not balanced. nftlb balances them only with
// intra-connect on, by hooking output too; xlb's output chain looks up the
// same service maps as prerouting (xlb's default is on), after a set of
// the keys of the farms that have it off:
//
//	set nolocal4 { type ipv4_addr . inet_proto . inet_service; flags interval; }
//	chain output { ... ip daddr . meta l4proto . th dport @nolocal4 accept; (the service lookups) }
//
// (and the IPv6 forms). Accept in a nat chain leaves the connection
// untranslated: it goes wherever the host routes the address, as with
// nftlb. Modes snat, dnat and local only: dsr and stlsdnat work at netdev
// ingress or raw prerouting, which the host's own packets never pass, so
// their intra-connect changes nothing (in nftlb neither).

const (
	setNoLocal4 = "nolocal4" // VIP . l4proto . port of farms with intra-connect off
	setNoLocal6 = "nolocal6" // same for IPv6
)

// noLocalSets are the static sets of intra-connect off.
func noLocalSets(t *nftables.Table) []*nftables.Set {
	s := func(name string, kt nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, Interval: true, Concatenation: true, KeyType: kt, KeyByteOrder: binaryutil.BigEndian}
	}
	return []*nftables.Set{s(setNoLocal4, typeSvc4), s(setNoLocal6, typeSvc6)}
}

func (p *farmPlan) noLocalSet() string { return pick(p.v6, setNoLocal4, setNoLocal6) }

// planNoLocal sets p.nolocal: the farm's elements of nolocal4/6.
func (p *farmPlan) planNoLocal(f *model.Farm) {
	if f.IntraConnectOff && !f.IsMarkFarm() {
		p.nolocal = svcElems(f, "", nil)
	}
}

// noLocalRule: ip daddr . meta l4proto . th dport @nolocal4 accept (or the
// ip6 form), first in the output chain.
func noLocalRule(v6 bool) []expr.Any {
	return append(svcKeyLoads(v6),
		&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setNoLocal4, setNoLocal6)},
		&expr.Verdict{Kind: expr.VerdictAccept})
}
