package nft

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

var (
	typeSvc4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	typeSvc6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService)
	typeDst4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
	typeDst6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetService)
)

// staticSets returns the table's static sets and maps.
func staticSets(t *nftables.Table) []*nftables.Set {
	svc := func(name string, kt nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, IsMap: true, Interval: true, Concatenation: true,
			KeyType: kt, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.BigEndian}
	}
	set := func(name string, kt nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, Interval: true, Concatenation: true,
			KeyType: kt, KeyByteOrder: binaryutil.BigEndian}
	}
	snat := func(name string, kt, dt nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, IsMap: true, Interval: true, Concatenation: true,
			KeyType: kt, DataType: dt, KeyByteOrder: binaryutil.BigEndian}
	}
	// dst: exact VIP . protocol . port keys (a hash, not an interval
	// map: adding and deleting elements costs O(1), not a copy of the set).
	dst := func(name string, kt, dt nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, IsMap: true, Concatenation: true,
			KeyType: kt, DataType: dt, KeyByteOrder: binaryutil.BigEndian}
	}
	exact := func(s *nftables.Set) *nftables.Set {
		s.Interval = false
		return s
	}
	return append([]*nftables.Set{
		exact(svc(setSvcX4, typeSvc4)),
		exact(svc(setSvcX6, typeSvc6)),
		exact(set(setMasqX4, typeSvc4)),
		exact(set(setMasqX6, typeSvc6)),
		exact(snat(setSnatX4, typeSvc4, nftables.TypeIPAddr)),
		exact(snat(setSnatX6, typeSvc6, nftables.TypeIP6Addr)),
		svc(setSvc4, typeSvc4),
		svc(setSvc6, typeSvc6),
		set(setMasq4, typeSvc4),
		set(setMasq6, typeSvc6),
		snat(setSnat4, typeSvc4, nftables.TypeIPAddr),
		snat(setSnat6, typeSvc6, nftables.TypeIP6Addr),
		svc(setFsvc4, typeSvc4),
		svc(setFsvc6, typeSvc6),
		{Table: t, Name: setFwm4, IsMap: true, KeyType: nftables.TypeMark, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian},
		{Table: t, Name: setFwm6, IsMap: true, KeyType: nftables.TypeMark, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian},
		{Table: t, Name: setMasqM, KeyType: nftables.TypeMark, KeyByteOrder: binaryutil.NativeEndian},
		{Table: t, Name: setSnatM4, IsMap: true, KeyType: nftables.TypeMark, DataType: nftables.TypeIPAddr, KeyByteOrder: binaryutil.NativeEndian},
		{Table: t, Name: setSnatM6, IsMap: true, KeyType: nftables.TypeMark, DataType: nftables.TypeIP6Addr, KeyByteOrder: binaryutil.NativeEndian},
		svc(setLog4, typeSvc4),
		svc(setLog6, typeSvc6),
		svc(setStls4, typeSvc4),
		svc(setStls6, typeSvc6),
		svc(setStlsR4, typeSvc4),
		svc(setStlsR6, typeSvc6),
		dst(setDst4, typeSvc4, typeDst4),
		dst(setDst6, typeSvc6, typeDst6),
	}, append(append(backendSnatSets(t), hairpinSets(t)...), noLocalSets(t)...)...)
}

// exactSet names the hash twin of an interval set that holds single-port
// keys (VIP . protocol . one port), or "" if the set has none.
//
// Why: the interval (pipapo) sets copy their lookup tables on each change
// and remove an element in O(elements): deleting a farm next to 10,000
// farms cost 2.6 ms against 0.9 ms next to 1,000, and perf showed
// nft_pipapo_remove as a third of the daemon's CPU in an add/delete loop.
// A hash set adds and removes in O(1). Port ranges, "every port" and
// protocol "all" stay in the interval sets, which the base chains look up
// after the hash (a new connection to such a farm pays one hash miss).
func exactSet(name string) string {
	switch name {
	case setSvc4:
		return setSvcX4
	case setSvc6:
		return setSvcX6
	case setMasq4:
		return setMasqX4
	case setMasq6:
		return setMasqX6
	case setSnat4:
		return setSnatX4
	case setSnat6:
		return setSnatX6
	}
	return ""
}

// elemSet is the set an element of set name goes to: its hash twin for a
// single-port key.
func elemSet(name string, e elem) string {
	if e.Exact {
		return exactSet(name)
	}
	return name
}

// markExact marks the single-port keys (one protocol, one port) of els,
// which then go to the hash twins of svc4, masq4 and snat4 (exactSet).
func markExact(els []elem) []elem {
	for i := range els {
		if string(els[i].Key) == string(els[i].KeyEnd) {
			els[i].Exact, els[i].KeyEnd = true, nil
		}
	}
	return els
}

// elem is one set element; key is its identity for diffs.
type elem struct {
	Key, KeyEnd []byte
	Val         []byte // map data (snat source address)
	Chain       string // verdict map: goto this chain
	Jump        bool   // jump to Chain instead of goto
	// Exact: a single-port key (KeyEnd nil) that goes to the hash twin of
	// its interval set (exactSet).
	Exact bool
}

func (e elem) id() string { return string(e.Key) + "\x00" + string(e.KeyEnd) }

func (e elem) same(o elem) bool {
	return e.id() == o.id() && string(e.Val) == string(o.Val) && e.Chain == o.Chain && e.Jump == o.Jump
}

func (e elem) setElement() nftables.SetElement {
	se := nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd, Val: e.Val}
	if e.Chain != "" {
		se.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.Chain}
		if e.Jump {
			se.VerdictData.Kind = expr.VerdictJump
		}
	}
	return se
}

// svcKey is addr . proto . port, each field padded to 4 bytes.
func svcKey(a netip.Addr, proto uint8, port uint16) []byte {
	b := append([]byte(nil), a.AsSlice()...)
	b = append(b, proto, 0, 0, 0)
	return binary.BigEndian.AppendUint16(b, port)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// svcElems returns the farm's keys (VIP . protocols . port ranges, for
// its own address and each further one: model.Farm.Listeners); with chain
// set they are svc map elements, with val set snat map elements.
func svcElems(f *model.Farm, chain string, val []byte) []elem {
	if len(f.Addresses) == 0 {
		// The common case, without building the listeners.
		return listenerElems(nil, f.VirtualAddr, f.Protocol, f.VirtualPorts, chain, val)
	}
	var out []elem
	for _, l := range f.Listeners() {
		if l.Addr.Is6() == f.VirtualAddr.Is6() { // a dual farm's half has one family
			out = listenerElems(out, l.Addr, l.Protocol, l.Ports, chain, val)
		}
	}
	return out
}

// listenerElems appends the keys of one listener to out.
func listenerElems(out []elem, a netip.Addr, proto model.Protocol, ports []model.PortRange, chain string, val []byte) []elem {
	p0, p1 := proto.Number(), proto.Number()
	if proto == model.ProtoAll {
		p0, p1 = protoNone, anyProto
	}
	if len(ports) == 0 {
		ports = []model.PortRange{{First: 0, Last: anyPort}}
	}
	if out == nil {
		out = make([]elem, 0, len(ports))
	}
	for _, r := range ports {
		out = append(out, elem{
			Key:    pad4(svcKey(a, p0, r.First)),
			KeyEnd: pad4(svcKey(a, p1, r.Last)),
			Chain:  chain,
			Val:    val,
		})
	}
	return out
}
