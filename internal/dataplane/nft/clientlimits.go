package nft

import (
	"fmt"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// A farm's new-rtlimit, rst-rtlimit and est-connlimit count per client
// address, as nftlb 1.0 does them: each has a dynamic set of the farm's
// clients, and a client over the limit meets the farm's verdict
// (verdict.go) while the others pass.
//
//	set nl-<hash>-<4|6>-<ttl> { type ipv4_addr; flags dynamic,timeout; timeout <limits-ttl>s; }
//	set rl-<hash>-<4|6>-<ttl> { same }
//	set el-<hash>-<4|6> { type ipv4_addr; flags dynamic; }
//
//	add @nl-... { ip saddr limit rate over N/<unit> burst B packets } counter log prefix "..." drop  (f-<hash>: new connections)
//	add @el-... { ip saddr ct count over N } counter log prefix "..." drop                            (f-<hash>)
//	tcp flags & rst == rst add @rl-... { ip saddr limit rate over N/<unit> burst B packets } ...     (g-<hash>: every packet)
//
// limits-ttl is the rate sets' timeout: a client's rate state (and so its
// ban once over the limit) lasts limits-ttl seconds after it was made. The
// counting set has no timeout (the kernel drops a client's element when its
// last connection closes), as nftlb's. The sets are named with the family
// and the ttl, so a change of either makes a new set; the names stay across
// other changes, so the clients' state survives rebuilds of the farm.

const (
	setNewRT   = "nl-"
	setRstRT   = "rl-"
	setEstConn = "el-"
)

func familyTag(v6 bool) string { return pick(v6, "4", "6") }

func newRTSetName(p *farmPlan, ttl uint32) string {
	return fmt.Sprintf("%s%s-%s-%d", setNewRT, nameHash(p.name), familyTag(p.v6), ttl)
}

func rstRTSetName(p *farmPlan, ttl uint32) string {
	return fmt.Sprintf("%s%s-%s-%d", setRstRT, nameHash(p.name), familyTag(p.v6), ttl)
}

func estConnSetName(p *farmPlan) string {
	return fmt.Sprintf("%s%s-%s", setEstConn, nameHash(p.name), familyTag(p.v6))
}

// clientSets names the per-client sets the farm needs (set by planFarm).
type clientSets struct {
	newRT, rstRT, estConn string
}

func (c clientSets) names() []string {
	var out []string
	for _, n := range []string{c.newRT, c.rstRT, c.estConn} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// planClientSets sets p.clients from the farm's limits.
func (p *farmPlan) planClientSets(f *model.Farm) {
	if f.NewRTLimit != 0 {
		p.clients.newRT = newRTSetName(p, f.LimitsTTL)
	}
	if f.RstRTLimit != 0 {
		p.clients.rstRT = rstRTSetName(p, f.LimitsTTL)
	}
	if f.EstConnLimit != 0 {
		p.clients.estConn = estConnSetName(p)
	}
}

// clientSet is the definition of one per-client set.
func (p *farmPlan) clientSet(t *nftables.Table, name string, ttl uint32) *nftables.Set {
	kt := nftables.TypeIPAddr
	if p.v6 {
		kt = nftables.TypeIP6Addr
	}
	s := &nftables.Set{Table: t, Name: name, KeyType: kt, Dynamic: true}
	if ttl != 0 {
		s.HasTimeout, s.Timeout = true, time.Duration(ttl)*time.Second
	}
	return s
}

// addClientSets adds the farm's per-client sets (idempotent: existing sets
// keep their clients) before the rules that use them, and returns them by
// name.
func (b *batch) addClientSets(pl *farmPlan, f *model.Farm) map[string]*nftables.Set {
	out := map[string]*nftables.Set{}
	for _, x := range []struct {
		name string
		ttl  uint32
	}{{pl.clients.newRT, f.LimitsTTL}, {pl.clients.rstRT, f.LimitsTTL}, {pl.clients.estConn, 0}} {
		if x.name == "" {
			continue
		}
		s := pl.clientSet(b.p.table, x.name, x.ttl)
		s.ID = b.nextID()
		_ = b.c.AddSet(s, nil)
		out[x.name] = s
	}
	pl.clientSetDefs = out
	return out
}

// saddrLoad loads the client's address into reg1. The family match is
// implied by the service map, but lets nft list the load as ip saddr.
func saddrLoad(v6 bool) []expr.Any {
	off, n := uint32(12), uint32(4)
	if v6 {
		off, n = 8, 16
	}
	return append(nfproto(v6), &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
}

// perClient returns `add @set { <saddr> <stateful> }`: it matches when the
// client's element's expression does (the rate is over or the count is).
func perClient(v6 bool, s *nftables.Set, stateful expr.Any) []expr.Any {
	return append(saddrLoad(v6), &expr.Dynset{SrcRegKey: reg1, SetName: s.Name, SetID: s.ID,
		Operation: unix.NFT_DYNSET_OP_ADD, Exprs: []expr.Any{stateful}})
}

// newConnLimitRules returns the farm chain's rules for new-rtlimit and
// est-connlimit (the nat chain sees a connection's first packet only).
func (p *farmPlan) newConnLimitRules(f *model.Farm, group uint16) [][]expr.Any {
	var out [][]expr.Any
	if s := p.clientSetDefs[p.clients.newRT]; s != nil {
		then, _ := onMatch(f, kindNewRT, limitPrefix(f.NewRTLogPrefix, kindNewRT.kname, f.Name, ""), group)
		out = append(out, append(perClient(p.v6, s, &expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(f.NewRTLimit),
			Unit: limitUnit(f.NewRTUnit), Burst: f.NewRTBurst, Over: true}), then...))
	}
	if s := p.clientSetDefs[p.clients.estConn]; s != nil {
		then, _ := onMatch(f, kindEstConn, limitPrefix(f.EstConnLogPrefix, kindEstConn.kname, f.Name, ""), group)
		out = append(out, append(perClient(p.v6, s, &expr.Connlimit{Count: f.EstConnLimit, Flags: connlimitOver}), then...))
	}
	return out
}

// rstLimitRule returns the filter chain's rule for rst-rtlimit (nil
// without it): tcp flags & rst == rst add @rl-... { ip saddr limit rate
// over N/unit burst B packets } <verdict>.
func rstLimitRule(f *model.Farm, v6 bool, s *nftables.Set, group uint16) []expr.Any {
	if s == nil {
		return nil
	}
	then, _ := onMatch(f, kindRstRT, limitPrefix(f.RstRTLogPrefix, kindRstRT.kname, f.Name, ""), group)
	r := append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 1, Mask: []byte{0x04}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0}},
	}, perClient(v6, s, &expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(f.RstRTLimit),
		Unit: limitUnit(f.RstRTUnit), Burst: f.RstRTBurst, Over: true})...)
	return append(r, then...)
}
