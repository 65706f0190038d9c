package nft

import (
	"fmt"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Mode stlsdnat at ingress (model.Farm.StlsAtIngress), as nftlb does it
// when a stlsdnat farm has an iface: stateless DNAT at the netdev ingress
// hook, forwarding frames at layer 2 both ways instead of letting the
// kernel route them. In the netdev table, beside mode dsr (dsr.go):
//
//	chain dsr {                                                   (static, dsr.go)
//	  ip daddr . meta l4proto . th dport vmap @dsr4               -> jump d-<hash>
//	  fwd to ip daddr . meta l4proto . th dport map @dsrif4       (dsr)
//	  ip saddr . meta l4proto . th sport vmap @dsrr4              -> jump dr-<hash>
//	  (and the ip6 forms) }
//	chain l2to {                                                  (static)
//	  fwd to ip daddr . meta l4proto . th dport map @l2to4 (and ip6) }
//	chain l2back {                                                (static)
//	  fwd to ip saddr . meta l4proto . th sport map @l2back4 (and ip6) }
//	chain d-<hash> {                                              the farm: clients' packets
//	  meta iifname != "<iface>" accept
//	  update @cm-<hash>-4-<responsettl> { ip saddr timeout <responsettl>s : ether saddr }
//	    ip daddr set <scheduler> map @m-<hash>-<gen> [th dport set <port>]
//	    ether daddr set ip daddr map @hw-<hash>-<gen> ether saddr set <LB's MAC on oface> counter goto l2to
//	  counter drop }                                              (no backend serves)
//	chain dr-<hash> {                                             the backends' replies
//	  meta iifname != "<oface>" accept
//	  ether daddr set ip daddr map @cm-... ip saddr set <VIP> [th sport set <port>]
//	    ether saddr set <iface's MAC> counter goto l2back
//	  counter drop }                                              (a client not seen for responsettl)
//
// The farm chains end in the static chains l2to and l2back, whose fwd
// rules send the rewritten frame out: google/nftables has no fwd
// expression, so fwd lives only in static rules sent raw (dsr.go,
// fwdExpr). The reply lookup comes after dsr's fwd in chain dsr, so a dsr
// packet costs what it did before this mode; other packets on a hooked
// device pay one lookup more (dsrr4/6). A farm's elements of l2to4/6 are
// its backends' keys (backend . protocol . port) to oface, those of
// l2back4/6 its VIP's keys to iface.
//
// Clients' MACs (the client's, or its router's) are learnt per farm in
// cm-..., kept responsettl seconds after the client's last packet (each
// packet refreshes its entry), as nftlb's responsettl says. A reply to a
// client not seen within that time is dropped. Backend MACs, the LB's MACs
// and the interfaces' indexes are found when the farm is applied, as for
// dsr (resolveFarm).

// Names in the netdev table.
const (
	setDsrR4    = "dsrr4"   // backend addr . l4proto . port -> jump the farm's reply chain (stlsdnat at ingress)
	setDsrR6    = "dsrr6"   // same for IPv6
	setL2To4    = "l2to4"   // backend addr . l4proto . port -> oface (stlsdnat at ingress)
	setL2To6    = "l2to6"   // same for IPv6
	setL2Back4  = "l2back4" // VIP . l4proto . port -> iface (stlsdnat at ingress)
	setL2Back6  = "l2back6" // same for IPv6
	farmL2Rev   = "dr-"     // reply chain of a stlsdnat farm at ingress: dr-<hash>
	chainL2To   = "l2to"    // static: forwards what a farm chain sent to a backend
	chainL2Back = "l2back"  // static: forwards what a reply chain sent to a client
	regMAC      = 2         // NFT_REG_2: the client's MAC learnt (reg1 holds its address)
	learntPref  = "cm-"     // learnt client MACs: cm-<hash>-<4|6>-<responsettl>
)

// hwName is the name of the backend MAC map that goes with the slot map
// mapName.
func hwName(mapName string) string { return "hw" + mapName[1:] }

// learntName is the name of a farm's map of clients' MACs: a new
// responsettl makes a new map (a set's timeout is fixed).
func learntName(f *model.Farm) string {
	return fmt.Sprintf("%s%s-%d-%d", learntPref, nameHash(f.Name), pick(f.VirtualAddr.Is6(), 4, 6), f.ResponseTTL)
}

// responseTTL is how long a client's MAC is kept: responsettl, or the
// default when 0 (the kernel would keep it forever).
func responseTTL(f *model.Farm) time.Duration {
	if f.ResponseTTL == 0 {
		return time.Duration(model.DefaultTTL) * time.Second
	}
	return time.Duration(f.ResponseTTL) * time.Second
}

// l2Key loads ip <daddr|saddr> . meta l4proto . th <dport|sport> into
// the registers from reg1 (after netdevKey's family match).
func l2Key(v6, src bool) []expr.Any {
	if src {
		return revKey(v6)
	}
	return netdevKey(v6)
}

// revKey loads ip saddr . meta l4proto . th sport into the registers
// from reg1 (after netdevKey's family match).
func revKey(v6 bool) []expr.Any {
	off, alen := uint32(12), uint32(4)
	if v6 {
		off, alen = 8, 16
	}
	w := addrWords(v6)
	return append(netdevKey(v6)[:2:2],
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
		&expr.Payload{DestRegister: reg32 + w + 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
	)
}

// l2RulesRaw returns the rules of the static chain l2to (src false: fwd
// by the destination, a backend) or l2back (src true: by the source, the
// VIP).
func l2RulesRaw(src bool) ([][]rawExpr, error) {
	var rules [][]rawExpr
	for _, v6 := range []bool{false, true} {
		r, err := encNetdev(append(l2Key(v6, src),
			&expr.Lookup{SourceRegister: reg1, SetName: pick(src, pick(v6, setL2To4, setL2To6), pick(v6, setL2Back4, setL2Back6)), IsDestRegSet: true, DestRegister: reg1}))
		if err != nil {
			return nil, err
		}
		rules = append(rules, append(r, fwdExpr(reg1)))
	}
	return rules, nil
}

// l2Elems returns a farm's elements of l2to4/6 (its backends' keys to
// oface) and of l2back4/6 (its VIP's keys to iface).
func l2Elems(f *model.Farm, l *dsrLink, stlsPort uint16) (to, back []elem) {
	to = revElems(f, "")
	for i := range to {
		to[i].Val = binaryutil.NativeEndian.PutUint32(l.ofIdx)
	}
	vports := f.VirtualPorts
	if stlsPort != 0 {
		vports = []model.PortRange{{First: f.VirtualPorts[0].First, Last: f.VirtualPorts[0].First}}
	}
	for _, r := range vports {
		back = append(back, elem{Key: pad4(svcKey(f.VirtualAddr, f.Protocol.Number(), r.First)),
			KeyEnd: pad4(svcKey(f.VirtualAddr, f.Protocol.Number(), r.Last)), Val: binaryutil.NativeEndian.PutUint32(l.ifIdx)})
	}
	return to, back
}

// setL2 completes a stlsdnat farm's plan at ingress with the resolved
// links.
func (p *farmPlan) setL2(f *model.Farm, l *dsrLink) {
	p.dsr = l
	p.post, p.l2back = l2Elems(f, l, p.stlsPort)
}

func (p *farmPlan) l2backSet() string { return pick(p.v6, setL2Back4, setL2Back6) }

// hwSet returns the definition of the backend MAC map (backend address ->
// MAC) and its elements.
func (p *farmPlan) hwSet(t *nftables.Table, name string, id uint32) (*nftables.Set, []nftables.SetElement) {
	s := &nftables.Set{Table: t, Name: name, ID: id, IsMap: true, KeyType: pick(p.v6, nftables.TypeIPAddr, nftables.TypeIP6Addr),
		DataType: nftables.TypeEtherAddr}
	var els []nftables.SetElement
	seen := map[string]bool{}
	for _, b := range p.active {
		if seen[string(b.Addr.AsSlice())] {
			continue
		}
		seen[string(b.Addr.AsSlice())] = true
		m := p.dsr.macs[b.Addr]
		els = append(els, nftables.SetElement{Key: b.Addr.AsSlice(), Val: append([]byte(nil), m[:]...)})
	}
	s.Size = uint32(len(els))
	return s, els
}

// learntSet returns the definition of the farm's map of clients' MACs.
// Idempotent like the persistence map: clients stay known across rebuilds.
func (p *farmPlan) learntSet(t *nftables.Table, f *model.Farm, id uint32) *nftables.Set {
	return &nftables.Set{Table: t, Name: learntName(f), ID: id, IsMap: true, Dynamic: true, HasTimeout: true,
		Timeout: responseTTL(f), KeyType: pick(p.v6, nftables.TypeIPAddr, nftables.TypeIP6Addr), DataType: nftables.TypeEtherAddr}
}

// l2FarmRules returns the rules of the farm's chain d-<hash> (see above).
func (p *farmPlan) l2FarmRules(f *model.Farm, mapName string, mapID, modulus uint32, hw, learnt *nftables.Set) [][]expr.Any {
	l := p.dsr
	other := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifnameData(l.iface)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	if p.kind == kindNone {
		return [][]expr.Any{other, drop}
	}
	off, alen := pick(p.v6, uint32(12), 8), pick(p.v6, uint32(4), 16)
	r := append(netdevKey(p.v6)[:2:2],
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Payload{DestRegister: regMAC, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: etherAlen},
		&expr.Dynset{SrcRegKey: reg1, SrcRegData: regMAC, SetName: learnt.Name, SetID: learnt.ID,
			Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: responseTTL(f)},
	)
	r = append(r, netdevSched(f, p.v6, modulus)...)
	r = append(r, &expr.Lookup{SourceRegister: reg1, SetName: mapName, SetID: mapID, IsDestRegSet: true, DestRegister: reg1})
	r = append(r, writeAddrPort(p.v6, f.Protocol, false, p.stlsPort)...)
	// The backend's MAC by the address just written, loaded again as nft
	// does for "ether daddr set ip daddr map @hw" (so nft lists it so).
	r = append(r,
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: pick(p.v6, uint32(16), 24), Len: alen},
		&expr.Lookup{SourceRegister: reg1, SetName: hw.Name, SetID: hw.ID, IsDestRegSet: true, DestRegister: reg1},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 0, Len: etherAlen},
		&expr.Immediate{Register: reg1, Data: l.lbMAC[:]},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: etherAlen},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainL2To},
	)
	return [][]expr.Any{other, r, drop}
}

// l2ReplyRules returns the rules of the farm's reply chain dr-<hash>.
func (p *farmPlan) l2ReplyRules(f *model.Farm, learnt *nftables.Set) [][]expr.Any {
	l := p.dsr
	other := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifnameData(l.oface)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
	off, alen := pick(p.v6, uint32(16), 24), pick(p.v6, uint32(4), 16)
	r := append(netdevKey(p.v6)[:2:2],
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Lookup{SourceRegister: reg1, SetName: learnt.Name, SetID: learnt.ID, IsDestRegSet: true, DestRegister: reg1},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 0, Len: etherAlen},
		&expr.Immediate{Register: reg1, Data: l.ifMAC[:]},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: etherAlen},
		&expr.Immediate{Register: reg1, Data: f.VirtualAddr.AsSlice()},
	)
	var port uint16
	if p.stlsPort != 0 {
		port = f.VirtualPorts[0].First
	}
	r = append(r, writeAddrPort(p.v6, f.Protocol, true, port)...)
	r = append(r, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainL2Back})
	return [][]expr.Any{other, r, {&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}}
}
