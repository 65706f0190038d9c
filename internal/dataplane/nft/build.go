package nft

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/fnv"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Names of the static objects of the table.
const (
	chainPrerouting  = "prerouting"
	chainOutput      = "output"
	chainPostrouting = "postrouting"

	setSvc4     = "svc4"    // ip daddr . l4proto . th dport -> goto farm chain
	setSvc6     = "svc6"    // ip6 daddr . l4proto . th dport -> goto farm chain
	setMasq4    = "masq4"   // ct original ip daddr . l4proto . ct original proto-dst: masquerade
	setMasq6    = "masq6"   // same for IPv6
	setSnat4    = "snat4"   // same key -> source address (farm source-addr)
	setSnat6    = "snat6"   // same for IPv6
	setFwm4     = "fwm4"    // meta mark -> goto farm chain (firewall-mark farms, IPv4)
	setFwm6     = "fwm6"    // same for IPv6
	setMasqM    = "masqm"   // meta mark: masquerade (snat firewall-mark farms)
	setSnatM4   = "snatm4"  // meta mark -> source address (snat firewall-mark farms with source-addr)
	setSnatM6   = "snatm6"  // same for IPv6
	setFsvc4    = "fsvc4"   // like svc4, -> goto farm filter chain (farms with filters only)
	setFsvc6    = "fsvc6"   // same for IPv6
	setLog4     = "log4"    // like svc4 (ct original keys), -> jump farm log chain (farms with log only)
	setLog6     = "log6"    // same for IPv6
	farmLog     = "l-"      // farm log chain: l-<hash>
	setStls4    = "stls4"   // like svc4: -> goto stateless farm chain (mode stlsdnat)
	setStls6    = "stls6"   // same for IPv6
	setStlsR4   = "stlsr4"  // backend addr . l4proto . port -> goto the farm's reverse chain
	setStlsR6   = "stlsr6"  // same for IPv6
	farmRev     = "r-"      // stateless reverse chain: r-<hash>
	chainRaw    = "raw"     // filter hook prerouting priority raw: stateless farms
	chainFilter = "filter"  // filter hook prerouting, after conntrack: per-farm filters
	farmFilter  = "g-"      // farm filter chain: g-<hash>
	farmChain   = "f-"      // farm chain: f-<hash>
	setSvcX4    = "svcx4"   // like svc4, single ports only: a hash map (exact keys; see exactSet)
	setSvcX6    = "svcx6"   // same for IPv6
	setMasqX4   = "masqx4"  // like masq4, single ports only
	setMasqX6   = "masqx6"  // same for IPv6
	setSnatX4   = "snatx4"  // like snat4, single ports only
	setSnatX6   = "snatx6"  // same for IPv6
	setDst4     = "dst4"    // ip daddr . l4proto . th dport -> backend addr . port (direct farms)
	setDst6     = "dst6"    // same for IPv6
	chainDir4   = "direct4" // shared chain of the IPv4 direct farms: dnat to @dst4
	chainDir6   = "direct6" // same for IPv6
	farmMap     = "m-"      // farm backend map: m-<hash>-<generation>
	hashLen     = 16        // hex digits of the name hash (64 bits)
	elemChunk   = 200       // set elements per netlink message (attributes are < 64 KiB)
	anyPort     = 0xffff    // last port of "every port"
	anyProto    = 0xff      // last protocol number of "every protocol"
	protoNone   = uint8(0)  // first protocol number of "every protocol"
)

// Registers. Concatenations are laid out from NFT_REG_1 (the 32-bit
// registers 8, 9, ... alias it), each field padded to 4 bytes, as nft does.
const (
	regVerdict = 0
	reg1       = 1 // NFT_REG_1: 16 bytes = 32-bit registers 8..11
	reg32      = 8 // NFT_REG32_00
)

// nameHash is the short hash used in kernel object names: farm names may
// be 64 characters of [A-Za-z0-9_.-], so a fixed-length hash keeps every
// derived name well inside the kernel's limits and uniform.
func nameHash(farm string) string {
	s := sha256.Sum256([]byte(farm))
	return hex.EncodeToString(s[:hashLen/2])
}

func chainName(farm string) string { return farmChain + nameHash(farm) }

func mapName(farm string, gen uint64) string {
	return farmMap + nameHash(farm) + "-" + strconv.FormatUint(gen, 36)
}

// seed is the jhash seed of a hash farm: fixed per farm name, so the hash
// scheduler sends a client to the same slot across rebuilds and restarts.
// (Maglev farms hash with plan.FlowSeed, the same for every farm and on
// both planes.)
func seed(farm string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(farm))
	return h.Sum32()
}

// hashExprs loads the hashed fields into the registers from reg1 and puts
// the slot in reg1: for maglev the flow hash of plan.FlowSlot (the keys of
// plan.MaglevKeys, seed plan.FlowSeed), for hash jhash of keys with the
// farm's seed.
func hashExprs(f *model.Farm, keys model.HashKey, v6 bool, modulus uint32) []expr.Any {
	s := seed(f.Name)
	if f.Scheduler == model.SchedMaglev {
		keys, s = plan.MaglevKeys(f), plan.FlowSeed
	}
	loads, _, n := keyLoads(keys, v6, reg32)
	return append(loads, &expr.Hash{SourceRegister: reg1, DestRegister: reg1, Length: n, Modulus: modulus,
		Seed: s, Type: expr.HashTypeJenkins})
}

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
	return []*nftables.Set{
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
	}
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

// svcElems returns the farm's keys (VIP . protocols . port ranges); with
// chain set they are svc map elements, with val set snat map elements.
func svcElems(f *model.Farm, chain string, val []byte) []elem {
	p0, p1 := f.Protocol.Number(), f.Protocol.Number()
	if f.Protocol == model.ProtoAll {
		p0, p1 = protoNone, anyProto
	}
	ports := f.VirtualPorts
	if len(ports) == 0 {
		ports = []model.PortRange{{First: 0, Last: anyPort}}
	}
	out := make([]elem, 0, len(ports))
	for _, r := range ports {
		out = append(out, elem{
			Key:    pad4(svcKey(f.VirtualAddr, p0, r.First)),
			KeyEnd: pad4(svcKey(f.VirtualAddr, p1, r.Last)),
			Chain:  chain,
			Val:    val,
		})
	}
	return out
}

// mapKind is the shape of a farm's backend map.
type mapKind uint8

const (
	kindNone     mapKind = iota // no serving backend: the chain rejects new connections
	kindAddr                    // slot -> address (dnat keeps the client's port)
	kindAddrPort                // slot -> address . port
)

// farmPlan is everything derived from a farm that goes into the kernel.
type farmPlan struct {
	name   string
	v6     bool
	chain  string
	kind   mapKind
	svc    []elem // in svc4/svc6
	post   []elem // in masq4/6 (no Val) or snat4/6 (Val)
	active []model.Backend
	port   uint16 // substitute for backend port 0 when kind is kindAddrPort
	// fchain is the farm's filter chain ("" when it needs none) and
	// filt its elements in fsvc4/fsvc6.
	fchain string
	filt   []elem
	// mark: a firewall-mark farm (svc and post are keyed by the mark).
	mark bool
	// marks: some serving backend has a mark. ids: backends are named
	// by id through the ct mark (persistence or marks; see persist.go).
	marks, ids bool
	// limits: backend est-connlimit -> ids of the serving backends with
	// it; lsets are the kernel sets built for them (see limits.go).
	limits map[uint32][]uint32
	lsets  []limitSets
	// stls: mode stlsdnat (svc elements in stls4/6, reverse chain rchain
	// with elements rev in stlsr4/6).
	stls     bool
	stlsPort uint16 // the backends' common port (0: keep the client's)
	rchain   string
	rev      []elem
	// lchain is the farm's log chain ("" without log) and logs its
	// elements in log4/log6 (jump).
	lchain string
	logs   []elem
	// helper names the farm's ct helper object ("" without a helper).
	helper string
	// persist names the persistence map ("" without persistence or
	// without serving backends); see persist.go.
	persist string
	// dsrMode: mode dsr (dsr.go). The chain and map live in the netdev
	// table; svc elements are in dsr4/6 (jump), post elements in
	// dsrif4/6 (the oface's index); dsr holds the resolved links.
	dsrMode bool
	dsr     *dsrLink
	// direct: elements of the farm in dst4/dst6 (VIP . protocol . port ->
	// its one backend); the farm has no chain or map of its own and its
	// svc elements go to the shared direct chain (see setDirect).
	direct []elem
	// grouped: the farm's rules live in a group chain shared with other
	// farms (group.go), group chain number group of its family.
	grouped bool
	group   int
}

func (p *farmPlan) isDirect() bool { return len(p.direct) > 0 }

func (p *farmPlan) directSet() string { return pick(p.v6, setDst4, setDst6) }

// setDirect makes the farm direct if every new connection it gets goes to
// the same place: exactly one serving backend, single virtual ports of one
// protocol, and nothing that needs a rule of its own (persistence, backend
// marks or limits, the farm's new-rtlimit or est-connlimit). Whatever the
// scheduler, it would pick that backend.
//
// Why: the kernel walks every chain of every table on each commit, so a
// chain per farm makes each change cost O(farms). Direct farms share one
// chain per family, and a table of them costs a change O(1) (doc.go).
func (p *farmPlan) setDirect(f *model.Farm) {
	if len(p.active) != 1 || p.ids || p.persist != "" || f.NewRTLimit != 0 || f.EstConnLimit != 0 ||
		f.Protocol == model.ProtoAll || len(f.VirtualPorts) == 0 {
		return
	}
	for _, r := range f.VirtualPorts {
		if r.First != r.Last {
			return
		}
	}
	b := p.active[0]
	p.direct = make([]elem, 0, len(f.VirtualPorts))
	for _, r := range f.VirtualPorts {
		port := b.Port
		if port == 0 {
			port = r.First // keep the client's port: it is this one
		}
		val := pad4(binary.BigEndian.AppendUint16(append([]byte(nil), b.Addr.AsSlice()...), port))
		p.direct = append(p.direct, elem{Key: pad4(svcKey(f.VirtualAddr, f.Protocol.Number(), r.First)), Val: val})
	}
	p.setChain(pick(p.v6, chainDir4, chainDir6))
}

func (p *farmPlan) svcSet() string {
	if p.dsrMode {
		return pick(p.v6, setDsr4, setDsr6)
	}
	if p.stls {
		return pick(p.v6, setStls4, setStls6)
	}
	if p.mark {
		return pick(p.v6, setFwm4, setFwm6)
	}
	return pick(p.v6, setSvc4, setSvc6)
}
func (p *farmPlan) filtSet() string { return pick(p.v6, setFsvc4, setFsvc6) }
func (p *farmPlan) logSet() string  { return pick(p.v6, setLog4, setLog6) }
func (p *farmPlan) revSet() string  { return pick(p.v6, setStlsR4, setStlsR6) }
func (p *farmPlan) postSet() string {
	if p.dsrMode {
		return pick(p.v6, setDsrIf4, setDsrIf6)
	}
	if p.mark {
		if len(p.post) > 0 && p.post[0].Val != nil {
			return pick(p.v6, setSnatM4, setSnatM6)
		}
		return setMasqM
	}
	return postSetName(p.v6, len(p.post) > 0 && p.post[0].Val != nil)
}

func postSetName(v6, snat bool) string {
	if snat {
		return pick(v6, setSnat4, setSnat6)
	}
	return pick(v6, setMasq4, setMasq6)
}

func pick[T any](v6 bool, a, b T) T {
	if v6 {
		return b
	}
	return a
}

// planFarm derives what a farm needs in the kernel. A farm that is not up
// needs nothing: it is absent from the service maps, so the LB does not
// handle its traffic.
func planFarm(f *model.Farm) *farmPlan {
	if f.State != model.StateUp {
		return nil
	}
	p := &farmPlan{name: f.Name, v6: f.VirtualAddr.Is6(), chain: chainName(f.Name)}
	if f.IsMarkFarm() {
		p.mark, p.v6 = true, f.Family == model.FamilyIPv6
		key := binaryutil.NativeEndian.PutUint32(f.Mark)
		p.svc = []elem{{Key: key, Chain: p.chain}}
		if f.Mode == model.ModeSNAT {
			p.post = []elem{{Key: key}}
			if f.SourceAddr.IsValid() {
				p.post[0].Val = f.SourceAddr.AsSlice()
			}
		}
		return p.backends(f)
	}
	if f.Mode == model.ModeDSR {
		// The links (and so the post elements) are set by setDSR.
		p.dsrMode = true
		p.chain = farmDsr + nameHash(f.Name)
		p.svc = svcElems(f, p.chain, nil)
		for i := range p.svc {
			p.svc[i].Jump = true
		}
		return p.backends(f)
	}
	p.svc = svcElems(f, p.chain, nil)
	if f.Mode == model.ModeStlsDNAT {
		p.stls = true
		p.rchain = farmRev + nameHash(f.Name)
		p.rev = revElems(f, p.rchain)
		return p.backends(f)
	}
	if f.Helper != model.HelperNone {
		p.helper = helperObjName(f)
	}
	if f.Log != 0 {
		p.lchain = farmLog + nameHash(f.Name)
		p.logs = svcElems(f, p.lchain, nil)
		for i := range p.logs {
			p.logs[i].Jump = true
		}
	}
	if len(filterRules(f, p.helper)) > 0 {
		p.fchain = farmFilter + nameHash(f.Name)
		p.filt = svcElems(f, p.fchain, nil)
	}
	if f.Mode == model.ModeSNAT {
		if f.SourceAddr.IsValid() {
			p.post = markExact(svcElems(f, "", f.SourceAddr.AsSlice()))
		} else {
			p.post = markExact(svcElems(f, "", nil))
		}
	}
	p.svc = markExact(p.svc)
	p.backends(f)
	p.setDirect(f)
	p.setGrouped(f)
	return p
}

// backends fills in the serving backends and the backend map's shape.
func (p *farmPlan) backends(f *model.Farm) *farmPlan {
	p.active = f.ActiveBackends()
	if len(p.active) == 0 {
		return p
	}
	p.kind = kindAddr
	for _, b := range p.active {
		if b.Port != 0 {
			p.kind = kindAddrPort
		}
	}
	if p.kind == kindAddrPort && len(f.VirtualPorts) == 1 && f.VirtualPorts[0].First == f.VirtualPorts[0].Last {
		p.port = f.VirtualPorts[0].First
	}
	if p.dsrMode {
		// The map holds MACs: ports never change in dsr.
		p.kind = kindAddr
	}
	if p.stls && p.kind == kindAddrPort {
		// Check makes every backend of a stateless farm share a port:
		// the map holds addresses and the port is a constant, so nft
		// can list the rewrite.
		p.kind = kindAddr
		for _, b := range p.active {
			p.stlsPort = max(p.stlsPort, b.Port)
		}
	}
	if f.Persistence != 0 && p.kind != kindNone {
		p.persist = persistName(f)
	}
	for _, b := range p.active {
		p.marks = p.marks || b.Mark != 0
	}
	for _, b := range p.active {
		if b.EstConnLimit != 0 {
			if p.limits == nil {
				p.limits = map[uint32][]uint32{}
			}
			p.limits[b.EstConnLimit] = append(p.limits[b.EstConnLimit], backendID(b))
		}
	}
	p.ids = p.persist != "" || p.marks || len(p.limits) > 0
	return p
}

// mapSet returns the definition of a farm's backend map.
func (p *farmPlan) mapSet(t *nftables.Table, f *model.Farm, name string, id uint32) *nftables.Set {
	s := &nftables.Set{Table: t, Name: name, ID: id, IsMap: true, KeyType: nftables.TypeInteger,
		KeyByteOrder: binaryutil.NativeEndian}
	if f.Scheduler == model.SchedWeight {
		// numgen random is converted to network byte order before the
		// lookup: interval sets compare keys as big-endian bytes.
		s.Interval = true
		s.KeyByteOrder = binaryutil.BigEndian
	}
	s.DataType = p.dataType()
	if p.dsrMode {
		s.DataType = nftables.TypeEtherAddr
	}
	if p.ids {
		s.DataType = nftables.TypeMark // backend id, see persist.go
	}
	return s
}

// elemBytes holds the keys and data of a backend map's elements in one
// buffer: each key and datum was an allocation of its own (PutUint32,
// AsSlice, append), about 300 of the 1,235 allocations of an Apply that
// adds a farm of 100 backends.
type elemBytes []byte

// since returns the bytes appended from start, capped so that later
// appends (which may move the buffer, leaving it in place) never touch
// them.
func (d elemBytes) since(start int) []byte { return d[start:len(d):len(d)] }

// u32 appends v in order and returns it.
func (d *elemBytes) u32(order binary.AppendByteOrder, v uint32) []byte {
	start := len(*d)
	*d = order.AppendUint32(*d, v)
	return d.since(start)
}

// slot appends a slot's data in the backend map and returns it: the
// backend, or its id in farms with persistence or backend marks.
func (d *elemBytes) slot(p *farmPlan, b *model.Backend) []byte {
	start := len(*d)
	switch {
	case p.dsrMode:
		m := p.dsr.macs[b.Addr]
		*d = append(*d, m[:]...)
	case p.ids:
		*d = binary.NativeEndian.AppendUint32(*d, backendID(*b))
	default:
		*d = p.appendBackendData(*d, b)
	}
	return d.since(start)
}

// slotSize is an upper bound of the bytes of one slot's data.
const slotSize = 16 + 4

func (p *farmPlan) backendData(b model.Backend) []byte {
	return p.appendBackendData(nil, &b)
}

// appendBackendData appends a backend's address (and port) as the backend
// map holds it.
func (p *farmPlan) appendBackendData(d []byte, b *model.Backend) []byte {
	start := len(d)
	d = appendAddr(d, b.Addr)
	if p.kind == kindAddrPort {
		port := b.Port
		if port == 0 {
			port = p.port
		}
		d = binary.BigEndian.AppendUint16(d, port)
		for (len(d)-start)%4 != 0 {
			d = append(d, 0) // pad4
		}
	}
	return d
}

// appendAddr appends what a.AsSlice returns, without allocating it.
func appendAddr(d []byte, a netip.Addr) []byte {
	switch {
	case a.Is4():
		v := a.As4()
		return append(d, v[:]...)
	case a.Is6():
		v := a.As16()
		return append(d, v[:]...)
	}
	return d
}

// mapElems returns the backend map's elements and the modulus of the
// scheduling expression.
func (p *farmPlan) mapElems(f *model.Farm) ([]nftables.SetElement, uint32) {
	if f.Scheduler == model.SchedMaglev {
		table := plan.MaglevTable(f, p.active)
		out := make([]nftables.SetElement, 0, len(table))
		d := make(elemBytes, 0, len(table)*(4+slotSize))
		for i, bi := range table {
			out = append(out, nftables.SetElement{Key: d.u32(binary.NativeEndian, uint32(i)), Val: d.slot(p, &p.active[bi])})
		}
		return out, uint32(len(table))
	}
	if f.Scheduler != model.SchedWeight {
		out := make([]nftables.SetElement, 0, len(p.active))
		d := make(elemBytes, 0, len(p.active)*(4+slotSize))
		for i := range p.active {
			out = append(out, nftables.SetElement{Key: d.u32(binary.NativeEndian, uint32(i)), Val: d.slot(p, &p.active[i])})
		}
		return out, uint32(len(p.active))
	}
	// The weighted slot table (plan.SlotRuns): each backend's run of
	// slots [start, start+n) is one interval, sent as a start element and
	// an end element (key one past the range, flagged as an interval
	// end), as nft does.
	weights := make([]uint32, len(p.active))
	for i := range p.active {
		weights[i] = p.active[i].Weight
	}
	var total uint32
	out := make([]nftables.SetElement, 0, 2*len(p.active))
	d := make(elemBytes, 0, len(p.active)*(8+slotSize))
	for i, n := range plan.SlotRuns(weights, plan.MaxWeightedSlots) {
		b := &p.active[i]
		out = append(out,
			nftables.SetElement{Key: d.u32(binary.BigEndian, total), Val: d.slot(p, b)},
			nftables.SetElement{Key: d.u32(binary.BigEndian, total+uint32(n)), IntervalEnd: true})
		total += uint32(n)
	}
	return out, total
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
	if f.NewRTLimit != 0 {
		// The nat chain sees only the first packet of a connection, so
		// this limits new connections.
		pre = append(pre, []expr.Any{
			&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(f.NewRTLimit), Unit: expr.LimitTimeSecond, Burst: f.NewRTBurst, Over: true},
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}})
	}
	if f.EstConnLimit != 0 {
		pre = append(pre, []expr.Any{
			&expr.Connlimit{Count: f.EstConnLimit, Flags: connlimitOver},
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}})
	}
	r, n := p.schedRule(f, f.SchedParam, mapName, mapID, modulus)
	var rules [][]expr.Any
	switch {
	case pset != nil:
		rules = p.persistRules(f, r, n, pset, aset)
	case aset != nil:
		rules = p.markRules(r, n, aset)
		if len(p.lsets) > 0 {
			rules = p.limitRules(r, n, aset)
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

// filterRules returns the rules of a farm's filter chain: what must see
// every packet of the farm's connections from clients, not only the first
// (the nat chains see only that one).
//
//	ct state invalid counter drop                                        (tcp-strict)
//	tcp flags & rst == rst limit rate over N/second burst B counter drop (rst-rtlimit)
//	ct helper set "h-<hash>-<helper>-<proto>"                            (helper)
//
// helper is the name of the farm's ct helper object.
func filterRules(f *model.Farm, helper string) [][]expr.Any {
	var out [][]expr.Any
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	if f.TCPStrict {
		out = append(out, append([]expr.Any{
			&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitINVALID), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		}, drop...))
	}
	if f.RstRTLimit != 0 {
		out = append(out, append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 1, Mask: []byte{0x04}, Xor: []byte{0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0}},
			&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(f.RstRTLimit), Unit: expr.LimitTimeSecond, Burst: f.RstRTBurst, Over: true},
		}, drop...))
	}
	if helper != "" {
		out = append(out, []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_CT_HELPER, Name: helper}})
	}
	return out
}

// logPrefix is the prefix of a farm's log lines: the farm's log-prefix,
// then "xlb farm=<name> ". The logged packet is the connection's first,
// after dnat: its destination is the backend chosen.
func logPrefix(f *model.Farm) string {
	p := "xlb farm=" + f.Name + " "
	if f.LogPrefix != "" {
		p = f.LogPrefix + " " + p
	}
	return p
}

// logRules returns the rules of a farm's log chain, reached from the
// postrouting chain (nat: the first packet of each new connection, after
// the backend was chosen): `log prefix "..." [group N]`, then back.
func logRules(f *model.Farm, group uint16) [][]expr.Any {
	l := &expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte(logPrefix(f))}
	if group != 0 {
		l.Key |= 1 << unix.NFTA_LOG_GROUP
		l.Group = group
	}
	return [][]expr.Any{{l}}
}

// Mode stlsdnat: stateless DNAT both ways, before conntrack. The raw chain
// (prerouting, priority raw) sends a client's packet for the VIP to the
// farm's chain, which marks it untracked, picks a backend per packet (so
// only hash schedulers: hash, symhash, maglev) and rewrites destination
// address and port (checksums fixed up); the kernel then routes it to the
// backend. A backend's reply (source backend . protocol . port, in
// stlsr4/6) goes to the farm's reverse chain, which marks it untracked and
// rewrites its source back to the VIP and virtual port. Backends must route
// replies through the LB (as in dnat mode). Nothing is kept per connection.

// revElems are the reverse keys: each backend . protocol . its port (or
// the virtual ports when it keeps the client's port).
func revElems(f *model.Farm, chain string) []elem {
	var out []elem
	seen := map[string]bool{}
	for _, b := range f.Backends {
		ports := []model.PortRange{{First: b.Port, Last: b.Port}}
		if b.Port == 0 {
			ports = f.VirtualPorts
		}
		for _, r := range ports {
			e := elem{Key: pad4(svcKey(b.Addr, f.Protocol.Number(), r.First)), KeyEnd: pad4(svcKey(b.Addr, f.Protocol.Number(), r.Last)), Chain: chain}
			if !seen[e.id()] {
				seen[e.id()] = true
				out = append(out, e)
			}
		}
	}
	return out
}

// l4csum is the offset of the transport checksum.
func l4csum(p model.Protocol) uint32 {
	if p == model.ProtoUDP {
		return 6
	}
	return 16
}

// writeAddrPort rewrites the destination (or source) address from reg1
// and, when port is not 0, the port to it, fixing the IP and transport
// checksums.
func writeAddrPort(v6 bool, proto model.Protocol, src bool, port uint16) []expr.Any {
	off := pick(v6, uint32(16), 24)
	poff := uint32(2)
	if src {
		off, poff = pick(v6, uint32(12), 8), 0
	}
	// IPv4: fix the header checksum (offset 10) and, as the address is
	// in the pseudo header, the transport checksum (L4CSUM_PSEUDOHDR).
	//
	// IPv6 has no header checksum: only the transport checksum is to be
	// fixed, i.e. checksum type none with the pseudo-header flag, which
	// the kernel takes but google/nftables v0.3.0 cannot send (it sends
	// the flags only with a checksum type). So the inet checksum offset
	// points into the address field being written: the kernel
	// (nft_payload_set_eval) updates that 16-bit "checksum", then the
	// transport checksum, then stores the new address over both bytes,
	// so the net effect is type none plus the flag. (A transport
	// checksum offset would be wrong for CHECKSUM_PARTIAL packets, which
	// only the pseudo-header path handles.)
	csumOff := uint32(10)
	if v6 {
		csumOff = off
	}
	a := &expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseNetworkHeader,
		Offset: off, Len: pick(v6, uint32(4), 16), CsumType: expr.CsumTypeInet, CsumOffset: csumOff, CsumFlags: unix.NFT_PAYLOAD_L4CSUM_PSEUDOHDR}
	out := []expr.Any{a}
	if port != 0 {
		out = append(out,
			&expr.Immediate{Register: reg1, Data: binary.BigEndian.AppendUint16(nil, port)},
			&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1,
				Base: expr.PayloadBaseTransportHeader, Offset: poff, Len: 2, CsumType: expr.CsumTypeInet, CsumOffset: l4csum(proto)})
	}
	return out
}

// stlsForward: notrack; <scheduler> map @m -> backend; rewrite; accept.
func (p *farmPlan) stlsForward(f *model.Farm, head []expr.Any) []expr.Any {
	r := append([]expr.Any{&expr.Notrack{}}, head...)
	r = append(r, writeAddrPort(p.v6, f.Protocol, false, p.stlsPort)...)
	return append(r, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})
}

// stlsReverse: notrack; ip saddr set VIP [th sport set virtual port]; accept.
func stlsReverse(f *model.Farm, rewritePort bool) [][]expr.Any {
	v6 := f.VirtualAddr.Is6()
	r := append(nfproto(v6), &expr.Notrack{}, &expr.Immediate{Register: reg1, Data: f.VirtualAddr.AsSlice()})
	var port uint16
	if rewritePort {
		port = f.VirtualPorts[0].First
	}
	r = append(r, writeAddrPort(v6, f.Protocol, true, port)...)
	return [][]expr.Any{append(r, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})}
}
