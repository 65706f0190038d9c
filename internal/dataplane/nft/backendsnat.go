package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// A backend's source-addr (nftlb's backend "source-addr"): in an snat farm,
// connections to that backend leave the LB from that address instead of
// the farm's source-addr or masquerade. nftlb names backends by ct mark and
// keeps `mark : address` in services-back-m; xlb keys a static map by the
// VIP side of the connection and the backend it went to, looked up in the
// postrouting chain before the farm-wide snat and masquerade rules:
//
//	map snatb4 { type ipv4_addr . inet_proto . inet_service . ipv4_addr : ipv4_addr; flags interval; }
//	meta nfproto ipv4 snat ip to ct original ip daddr . meta l4proto . ct original proto-dst . ip daddr map @snatb4
//
// (and the IPv6 forms). In postrouting, ip daddr is the backend chosen
// (after dnat). A farm has one element per virtual port range and backend
// with a source-addr, whatever the backend's state.

const (
	setSnatB4 = "snatb4" // VIP . l4proto . port . backend -> backend source-addr
	setSnatB6 = "snatb6" // same for IPv6
)

var (
	typeSvcB4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeIPAddr)
	typeSvcB6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeIP6Addr)
)

// backendSnatSets are the static maps of backend source addresses.
func backendSnatSets(t *nftables.Table) []*nftables.Set {
	m := func(name string, kt, dt nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, IsMap: true, Interval: true, Concatenation: true,
			KeyType: kt, DataType: dt, KeyByteOrder: binaryutil.BigEndian}
	}
	return []*nftables.Set{m(setSnatB4, typeSvcB4, nftables.TypeIPAddr), m(setSnatB6, typeSvcB6, nftables.TypeIP6Addr)}
}

func (p *farmPlan) bsnatSet() string { return pick(p.v6, setSnatB4, setSnatB6) }

// planBackendSnat sets p.bsnat: the farm's elements of snatb4/6.
func (p *farmPlan) planBackendSnat(f *model.Farm) {
	if f.Mode != model.ModeSNAT || f.IsMarkFarm() {
		return
	}
	keys := svcElems(f, "", nil)
	for _, b := range f.Backends {
		if !b.SourceAddr.IsValid() {
			continue
		}
		addr := b.Addr.AsSlice()
		for _, k := range keys {
			p.bsnat = append(p.bsnat, elem{
				Key:    append(append([]byte(nil), k.Key...), addr...),
				KeyEnd: append(append([]byte(nil), k.KeyEnd...), addr...),
				Val:    b.SourceAddr.AsSlice(),
			})
		}
	}
}

// backendSnatRules returns the postrouting rules of the backend source
// addresses (see the top of this file), v4 then v6.
func backendSnatRules(ports model.PortRange) ([][]rawExpr, error) {
	var rules [][]rawExpr
	for _, v6 := range []bool{false, true} {
		w := addrWords(v6)
		off, alen := uint32(16), uint32(4)
		if v6 {
			off, alen = 24, 16
		}
		head, err := encodeAll(nfproto(v6))
		if err != nil {
			return nil, err
		}
		tail, err := encodeAll(append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
			&expr.Ct{Register: reg32 + w + 1, Key: expr.CtKeyPROTODST, Direction: 0},
			&expr.Payload{DestRegister: reg32 + w + 2, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
			&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setSnatB4, setSnatB6), IsDestRegSet: true, DestRegister: reg1},
		}, snatTo(v6, ports)...))
		if err != nil {
			return nil, err
		}
		rules = append(rules, append(append(head, ctOrigDaddr(v6)), tail...))
	}
	return rules, nil
}

func encodeAll(es []expr.Any) ([]rawExpr, error) {
	out := make([]rawExpr, 0, len(es))
	for _, e := range es {
		b, err := encode(e)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
