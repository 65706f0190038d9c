package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Registers. Concatenations are laid out from NFT_REG_1 (the 32-bit
// registers 8, 9, ... alias it), each field padded to 4 bytes, as nft does.
const (
	regVerdict = 0
	reg1       = 1 // NFT_REG_1: 16 bytes = 32-bit registers 8..11
	reg32      = 8 // NFT_REG32_00
)

// hashExprs loads the hashed fields into the registers from reg1 and puts
// the slot in reg1: the flow hash of plan.FlowSlot (jhash with seed
// plan.FlowSeed, scaled to modulus), over plan.MaglevKeys for maglev and
// over keys for hash. The eBPF program computes the same, so both planes
// and every node pick the same slot.
func hashExprs(f *model.Farm, keys model.HashKey, v6 bool, modulus uint32) []expr.Any {
	if f.Scheduler == model.SchedMaglev {
		keys = plan.MaglevKeys(f)
	}
	loads, _, n := keyLoads(keys, v6, reg32)
	return append(loads, &expr.Hash{SourceRegister: reg1, DestRegister: reg1, Length: n, Modulus: modulus,
		Seed: plan.FlowSeed, Type: expr.HashTypeJenkins})
}

func nfproto(v6 bool) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if v6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}
}

// addrWords is the number of 32-bit registers an address takes.
func addrWords(v6 bool) uint32 {
	if v6 {
		return 4
	}
	return 1
}

// checksNotrackRule: meta mark 0x786c6263 notrack (the health checks'
// packets, dataplane.CheckSocketMark).
func checksNotrackRule() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(dataplane.CheckSocketMark)},
		&expr.Notrack{},
	}
}

// fwmRule: meta nfproto ipv4 meta mark vmap @fwm4 (or the ipv6 form).
func fwmRule(v6 bool) []expr.Any {
	return append(nfproto(v6),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setFwm4, setFwm6), IsDestRegSet: true, DestRegister: regVerdict},
	)
}

// revRule: ip saddr . meta l4proto . th sport vmap @stlsr4 (or the ip6 form).
func revRule(v6 bool) []expr.Any {
	off, alen := uint32(12), uint32(4)
	if v6 {
		off, alen = 8, 16
	}
	w := addrWords(v6)
	return append(nfproto(v6),
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
		&expr.Payload{DestRegister: reg32 + w + 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
		&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setStlsR4, setStlsR6), IsDestRegSet: true, DestRegister: regVerdict},
	)
}

// svcRule: ip daddr . meta l4proto . th dport vmap @svc4 (or the ip6 form).
func svcRule(v6 bool) []expr.Any { return vmapRule(v6, pick(v6, setSvc4, setSvc6)) }

// svcExactRule: ip daddr . meta l4proto . th dport vmap @svcx4 (or the ip6
// form), before svcRule: single ports are looked up in a hash first.
func svcExactRule(v6 bool) []expr.Any { return vmapRule(v6, pick(v6, setSvcX4, setSvcX6)) }

// vmapRule: ip daddr . meta l4proto . th dport vmap @set (or the ip6 form).
func vmapRule(v6 bool, set string) []expr.Any {
	return append(svcKeyLoads(v6),
		&expr.Lookup{SourceRegister: reg1, SetName: set, IsDestRegSet: true, DestRegister: regVerdict})
}

// svcKeyLoads loads ip daddr . meta l4proto . th dport (or the ip6 form)
// into the registers from reg1, after matching the family.
func svcKeyLoads(v6 bool) []expr.Any {
	off, alen := uint32(16), uint32(4)
	if v6 {
		off, alen = 24, 16
	}
	w := addrWords(v6)
	return append(nfproto(v6),
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
		&expr.Payload{DestRegister: reg32 + w + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	)
}

// directRules are the rules of the shared direct chain of a family:
//
//	dnat ip to ip daddr . meta l4proto . th dport map @dst4
//	counter drop
//
// The drop is never reached (a direct farm's svc and dst elements come
// and go in the same batch), but if it were, the packet must not reach
// local sockets.
func directRules(v6 bool) [][]expr.Any {
	r := append(svcKeyLoads(v6),
		&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setDst4, setDst6), IsDestRegSet: true, DestRegister: reg1},
		&expr.Counter{},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily(v6), RegAddrMin: reg1, RegProtoMin: reg32 + addrWords(v6)})
	return [][]expr.Any{r, {&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}}
}

func natFamily(v6 bool) uint32 {
	if v6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// connlimitOver is NFT_CONNLIMIT_F_INV: "ct count over N".
const connlimitOver = 1

// farmRules returns the rules of a farm's chain. pset and aset are the
// persistence map and the active map (nil without persistence).
func (p *farmPlan) farmRules(f *model.Farm, mapName string, mapID uint32, modulus uint32, pset, aset *nftables.Set) [][]expr.Any {
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	if p.kind == kindNone && p.stls {
		return [][]expr.Any{drop}
	}
	if p.local {
		return p.localRules(f)
	}
	if p.kind == kindNone {
		// No backend can serve: refuse new connections at once (TCP reset,
		// else ICMP port unreachable) rather than let clients time out, as
		// IPVS answers when it finds no destination and as kube-proxy does
		// for Services without endpoints.
		return [][]expr.Any{
			{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Counter{}, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}},
			{&expr.Counter{}, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}},
		}
	}
	if p.stls {
		r, _ := p.schedRule(f, f.SchedParam, mapName, mapID, modulus)
		return [][]expr.Any{p.stlsForward(f, r[:len(r)-2]), drop}
	}
	var pre [][]expr.Any
	if p.mark && f.Protocol != model.ProtoAll {
		// A mark selects packets of any protocol: others go on to the
		// VIP farms.
		pre = append(pre, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{f.Protocol.Number()}},
			&expr.Verdict{Kind: expr.VerdictReturn}})
	}
	// new-rtlimit and est-connlimit per client (clientlimits.go).
	pre = append(pre, p.newConnLimitRules(f, p.logGroup)...)
	r, n := p.schedRule(f, f.SchedParam, mapName, mapID, modulus)
	var rules [][]expr.Any
	switch {
	case pset != nil:
		rules = p.persistRules(f, r, n, pset, aset)
	case aset != nil:
		rules = p.markRules(r, n, aset)
		if len(p.lsets) > 0 {
			rules = p.limitRules(f, r, n, aset)
		}
	case f.Scheduler == model.SchedHash && f.SchedParam&model.KeySrcMAC != 0 && f.SchedParam != model.KeySrcMAC:
		// Packets without a link-layer header (local clients) hash the
		// other keys.
		r2, _ := p.schedRule(f, f.SchedParam&^model.KeySrcMAC, mapName, mapID, modulus)
		rules = [][]expr.Any{r, r2}
	default:
		rules = [][]expr.Any{r}
	}
	return append(append(pre, rules...), drop)
}

// schedRule returns the rule that picks a backend (hash keys for the hash
// scheduler) and dnats to it, and its nat expression.
func (p *farmPlan) schedRule(f *model.Farm, keys model.HashKey, mapName string, mapID uint32, modulus uint32) ([]expr.Any, *expr.NAT) {
	var r []expr.Any
	switch f.Scheduler {
	case model.SchedRR:
		r = append(r, &expr.Numgen{Register: reg1, Type: unix.NFT_NG_INCREMENTAL, Modulus: modulus})
	case model.SchedWeight:
		r = append(r,
			&expr.Numgen{Register: reg1, Type: unix.NFT_NG_RANDOM, Modulus: modulus},
			&expr.Byteorder{SourceRegister: reg1, DestRegister: reg1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		)
	case model.SchedHash, model.SchedMaglev:
		// The family match is implied by the service map, but lets nft
		// list the loads as ip saddr/ip6 saddr instead of raw offsets.
		r = append(r, nfproto(p.v6)...)
		r = append(r, hashExprs(f, keys, p.v6, modulus)...)
	case model.SchedSymhash:
		r = append(r, &expr.Hash{DestRegister: reg1, Modulus: modulus, Type: expr.HashTypeSym})
	}
	n := &expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily(p.v6), RegAddrMin: reg1}
	if p.kind == kindAddrPort {
		n.RegProtoMin = reg32 + addrWords(p.v6)
	}
	r = append(r,
		&expr.Lookup{SourceRegister: reg1, SetName: mapName, SetID: mapID, IsDestRegSet: true, DestRegister: reg1},
		&expr.Counter{},
		n,
	)
	// A lookup miss cannot happen (slots cover the modulus), but if it
	// did the packet must not reach local sockets: drop.
	return r, n
}

// needsFilter reports whether a farm needs a filter chain (filterRules).
func needsFilter(f *model.Farm, helper string) bool {
	return f.TCPStrict || f.RstRTLimit != 0 || f.Queue >= 0 || helper != ""
}

// filterRules returns the rules of a farm's filter chain: what must see
// every packet of the farm's connections from clients, not only the first
// (the nat chains see only that one).
//
//	ct state invalid counter log prefix "..." drop                      (tcp-strict)
//	tcp flags & rst == rst add @rl-... { ip saddr limit rate over ... } (rst-rtlimit, per client)
//	ct state new counter queue num N bypass                              (queue, queue.go)
//	ct helper set "h-<hash>-<helper>-<proto>"                           (helper)
//
// What follows a match is the farm's verdict (verdict.go). helper is the
// name of the farm's ct helper object.
func (p *farmPlan) filterRules(f *model.Farm, helper string) [][]expr.Any {
	var out [][]expr.Any
	if f.TCPStrict {
		then, _ := onMatch(f, kindStrict, limitPrefix(f.TCPStrictLogPrefix, kindStrict.kname, f.Name, ""), p.logGroup)
		out = append(out, append([]expr.Any{
			&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitINVALID), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		}, then...))
	}
	if r := rstLimitRule(f, p.v6, p.clientSetDefs[p.clients.rstRT], p.logGroup); r != nil {
		out = append(out, r)
	}
	if r := queueRule(f); r != nil {
		out = append(out, r)
	}
	if helper != "" {
		out = append(out, []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_CT_HELPER, Name: helper}})
	}
	return out
}

// logRules returns the rules of a farm's log chain, reached from the
// postrouting chain (nat: the first packet of each new connection, after
// the backend was chosen): one `log prefix "..." [group N]` for each hook
// of the farm's log, with nftlb's prefixes (plan.FarmLogPrefixes: "IN-f ",
// "FWD-f " by default), then back.
func logRules(f *model.Farm, group uint16) [][]expr.Any {
	var rules [][]expr.Any
	for _, p := range plan.FarmLogPrefixes(f) {
		rules = append(rules, []expr.Any{logExpr(p, group)})
	}
	return rules
}
