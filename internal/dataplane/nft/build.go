package nft

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Names of the static objects of the table.
//
// Every map whose size grows with the number of farms is one static map,
// never one set per farm: the kernel looks sets up by name in a linear list
// and interval (pipapo) sets copy their whole lookup table on every commit,
// so per-farm sets or one big interval map make each change cost O(farms).
// Exact keys go to hash maps (O(1) per element); only port ranges and
// protocol "all" use the interval maps, which stay small.
const (
	chainPrerouting  = "prerouting"
	chainOutput      = "output"
	chainPostrouting = "postrouting"

	setSvc4   = "svc4"   // ip daddr . l4proto . th dport -> goto farm chain (exact keys)
	setSvc6   = "svc6"   // ip6 daddr . l4proto . th dport -> goto farm chain
	setSvc4r  = "svc4r"  // the same for port ranges and protocol "all" (interval)
	setSvc6r  = "svc6r"  //
	setMasq4  = "masq4"  // ct original ip daddr . l4proto . ct original proto-dst: masquerade
	setMasq6  = "masq6"  // same for IPv6
	setMasq4r = "masq4r" // interval forms of the two above
	setMasq6r = "masq6r" //
	setSnat4  = "snat4"  // same key -> source address (farm source-addr)
	setSnat6  = "snat6"  // same for IPv6
	setSnat4r = "snat4r" // interval forms of the two above
	setSnat6r = "snat6r" //
	setBk4    = "bk4-"   // bk4-<shard>: slot -> backend address (backend port 0 keeps the client's port)
	setBk4p   = "bk4p-"  // bk4p-<shard>: slot -> backend address . port
	setBk6    = "bk6-"   // the same for IPv6
	setBk6p   = "bk6p-"  //
	bkShards  = 256      // backend maps per shape (see bkSetName)
	farmChain = "f-"     // farm chain: f-<hash>
	hashLen   = 16       // hex digits of the name hash (64 bits)
	elemChunk = 200      // set elements per netlink message (attributes are < 64 KiB)
	anyPort   = 0xffff   // last port of "every port"
	anyProto  = 0xff     // last protocol number of "every protocol"
	protoNone = uint8(0) // first protocol number of "every protocol"

	// maxWeightSlots bounds the slots of a weight farm. Weights are
	// divided by their greatest common divisor; if they still add up to
	// more, slots are shared out in proportion (largest remainder, at
	// least one per backend), so the split is exact to within one slot
	// in maxWeightSlots.
	maxWeightSlots = 4096
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

// seed is the jhash seed of a farm: fixed per farm name, so the hash
// scheduler sends a client to the same slot across rebuilds and restarts.
func seed(farm string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(farm))
	return h.Sum32()
}

var (
	typeSvc4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	typeSvc6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService)
	typeDst4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
	typeDst6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetService)
)

// staticSets returns the table's static sets and maps.
func staticSets(t *nftables.Table) []*nftables.Set {
	svc := func(name string, kt nftables.SetDatatype, interval bool) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, IsMap: true, Interval: interval, Concatenation: true,
			KeyType: kt, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.BigEndian}
	}
	set := func(name string, kt nftables.SetDatatype, interval bool) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, Interval: interval, Concatenation: true,
			KeyType: kt, KeyByteOrder: binaryutil.BigEndian}
	}
	snat := func(name string, kt, dt nftables.SetDatatype, interval bool) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, IsMap: true, Interval: interval, Concatenation: true,
			KeyType: kt, DataType: dt, KeyByteOrder: binaryutil.BigEndian}
	}
	return []*nftables.Set{
		svc(setSvc4, typeSvc4, false),
		svc(setSvc6, typeSvc6, false),
		svc(setSvc4r, typeSvc4, true),
		svc(setSvc6r, typeSvc6, true),
		set(setMasq4, typeSvc4, false),
		set(setMasq6, typeSvc6, false),
		set(setMasq4r, typeSvc4, true),
		set(setMasq6r, typeSvc6, true),
		snat(setSnat4, typeSvc4, nftables.TypeIPAddr, false),
		snat(setSnat6, typeSvc6, nftables.TypeIP6Addr, false),
		snat(setSnat4r, typeSvc4, nftables.TypeIPAddr, true),
		snat(setSnat6r, typeSvc6, nftables.TypeIP6Addr, true),
	}
}

// isBackendMap says whether a set is one of the backend maps (their
// elements belong to farm builds, not to service keys).
func isBackendMap(name string) bool {
	for _, prefix := range []string{setBk4, setBk4p, setBk6, setBk6p} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// bkSetDef returns the definition of backend map name (from bkSetName).
func bkSetDef(t *nftables.Table, name string) *nftables.Set {
	var dt nftables.SetDatatype
	switch {
	case strings.HasPrefix(name, setBk4p):
		dt = typeDst4
	case strings.HasPrefix(name, setBk4):
		dt = nftables.TypeIPAddr
	case strings.HasPrefix(name, setBk6p):
		dt = typeDst6
	default:
		dt = nftables.TypeIP6Addr
	}
	return &nftables.Set{Table: t, Name: name, IsMap: true,
		KeyType: nftables.TypeInteger, DataType: dt, KeyByteOrder: binaryutil.NativeEndian}
}

// bkSetName names a farm's backend map: one of bkShards maps per shape,
// chosen by the farm name. Why shards: every farm rule that looks a map up
// binds to it, and the kernel checks each new element against every
// binding and walks every element on each new binding. With one map for
// all farms a change costs O(farms); with a set per farm it costs O(farms)
// in name lookups (the kernel keeps a table's sets in a list). Shards keep
// both small: bindings and elements per map are 1/bkShards of the total,
// and the table has at most 4 x bkShards backend maps.
func bkSetName(prefix, farm string) string {
	h := fnv.New32a()
	h.Write([]byte(farm))
	return fmt.Sprintf("%s%02x", prefix, h.Sum32()%bkShards)
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

// svcRule: ip daddr . meta l4proto . th dport vmap @svc4 (or the ip6 or
// interval forms: set names the map).
func svcRule(v6 bool, set string) []expr.Any {
	off, alen := uint32(16), uint32(4)
	if v6 {
		off, alen = 24, 16
	}
	w := addrWords(v6)
	return append(nfproto(v6),
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
		&expr.Payload{DestRegister: reg32 + w + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg1, SetName: set, IsDestRegSet: true, DestRegister: regVerdict},
	)
}

func natFamily(v6 bool) uint32 {
	if v6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// elem is one set element; key is its identity for diffs.
type elem struct {
	Set         string // the static set it belongs in
	Key, KeyEnd []byte
	Val         []byte // map data (snat source address)
	Chain       string // verdict map: goto this chain
}

func (e elem) id() string { return string(e.Key) + "\x00" + string(e.KeyEnd) }

func (e elem) same(o elem) bool {
	return e.Set == o.Set && e.id() == o.id() && string(e.Val) == string(o.Val) && e.Chain == o.Chain
}

func (e elem) setElement() nftables.SetElement {
	se := nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd, Val: e.Val}
	if e.Chain != "" {
		se.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.Chain}
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

// Kinds of service-keyed sets, for svcElems.
const (
	keySvc  = iota // svc4/svc6: -> goto farm chain
	keyMasq        // masq4/masq6
	keySnat        // snat4/snat6: -> source address
)

// svcSetName names the static set of a service key: exact keys (one
// protocol, one port) go to the hash sets, ranges to the interval sets.
func svcSetName(kind int, v6, interval bool) string {
	names := [3][2][2]string{
		keySvc:  {{setSvc4, setSvc4r}, {setSvc6, setSvc6r}},
		keyMasq: {{setMasq4, setMasq4r}, {setMasq6, setMasq6r}},
		keySnat: {{setSnat4, setSnat4r}, {setSnat6, setSnat6r}},
	}
	return names[kind][b2i(v6)][b2i(interval)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// svcElems returns the farm's keys (VIP . protocols . port ranges) as
// elements of the kind's sets: with chain set they are svc map elements,
// with val set snat map elements.
func svcElems(f *model.Farm, kind int, chain string, val []byte) []elem {
	p0, p1 := f.Protocol.Number(), f.Protocol.Number()
	if f.Protocol == model.ProtoAll {
		p0, p1 = protoNone, anyProto
	}
	ports := f.VirtualPorts
	if len(ports) == 0 {
		ports = []model.PortRange{{First: 0, Last: anyPort}}
	}
	v6 := f.VirtualAddr.Is6()
	out := make([]elem, 0, len(ports))
	for _, r := range ports {
		e := elem{Key: pad4(svcKey(f.VirtualAddr, p0, r.First)), Chain: chain, Val: val}
		interval := p0 != p1 || r.First != r.Last
		if interval {
			e.KeyEnd = pad4(svcKey(f.VirtualAddr, p1, r.Last))
		}
		e.Set = svcSetName(kind, v6, interval)
		out = append(out, e)
	}
	return out
}

// mapKind is the shape of a farm's backend map.
type mapKind uint8

const (
	kindNone     mapKind = iota // no serving backend: the chain drops
	kindAddr                    // slot -> address (dnat keeps the client's port)
	kindAddrPort                // slot -> address . port
)

// farmPlan is everything derived from a farm that goes into the kernel.
type farmPlan struct {
	name   string
	v6     bool
	chain  string
	kind   mapKind
	svc    []elem // in svc4/svc6 and their interval forms
	post   []elem // in masq4/6 (no Val) or snat4/6 (Val) and their interval forms
	active []model.Backend
	port   uint16 // substitute for backend port 0 when kind is kindAddrPort
}

// bkSet names the farm's backend map.
func (p *farmPlan) bkSet() string {
	if p.kind == kindAddr {
		return bkSetName(pick(p.v6, setBk4, setBk6), p.name)
	}
	return bkSetName(pick(p.v6, setBk4p, setBk6p), p.name)
}

func pick[T any](v6 bool, a, b T) T {
	if v6 {
		return b
	}
	return a
}

// plan derives what a farm needs in the kernel. A farm that is not up
// needs nothing: it is absent from the service maps, so the LB does not
// handle its traffic.
func plan(f *model.Farm) *farmPlan {
	if f.State != model.StateUp {
		return nil
	}
	p := &farmPlan{name: f.Name, v6: f.VirtualAddr.Is6(), chain: chainName(f.Name)}
	p.svc = svcElems(f, keySvc, p.chain, nil)
	if f.Mode == model.ModeSNAT {
		if f.SourceAddr.IsValid() {
			p.post = svcElems(f, keySnat, "", f.SourceAddr.AsSlice())
		} else {
			p.post = svcElems(f, keyMasq, "", nil)
		}
	}
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
	return p
}

func (p *farmPlan) backendData(b model.Backend) []byte {
	d := append([]byte(nil), b.Addr.AsSlice()...)
	if p.kind == kindAddrPort {
		port := b.Port
		if port == 0 {
			port = p.port
		}
		d = pad4(binary.BigEndian.AppendUint16(d, port))
	}
	return d
}

// slotKey is a backend map key: a slot number in host byte order, as
// numgen and jhash leave it in their register. Each farm owns a range of
// slots [base, base+n): its scheduler is "numgen/jhash mod n offset base",
// so all farms share one map per shape (see the const block).
func slotKey(slot uint32) []byte { return binaryutil.NativeEndian.PutUint32(slot) }

// slots returns, for each slot of the farm's backend map, the index of the
// active backend it sends to. rr and hash: one slot per backend. weight:
// slots in proportion to the weights (see maxWeightSlots).
func (p *farmPlan) slots(f *model.Farm) []int {
	var out []int
	if f.Scheduler != model.SchedWeight {
		for i := range p.active {
			out = append(out, i)
		}
		return out
	}
	for i, n := range weightSlots(p.active, maxWeightSlots) {
		for range n {
			out = append(out, i)
		}
	}
	return out
}

// weightSlots shares out at most limit slots among backends in proportion
// to their weights (all > 0): weights divided by their gcd if that fits,
// else the largest-remainder method with at least one slot each.
func weightSlots(bs []model.Backend, limit int) []int {
	g := uint64(0)
	for _, b := range bs {
		g = gcd(g, uint64(b.Weight))
	}
	var total uint64
	out := make([]int, len(bs))
	for i, b := range bs {
		out[i] = int(uint64(b.Weight) / g)
		total += uint64(out[i])
	}
	if total <= uint64(limit) {
		return out
	}
	var sum uint64
	for _, b := range bs {
		sum += uint64(b.Weight)
	}
	type rem struct {
		i int
		r uint64
	}
	free := uint64(limit - len(bs)) // every backend keeps one slot
	rems := make([]rem, len(bs))
	used := uint64(0)
	for i, b := range bs {
		share := free * uint64(b.Weight)
		out[i] = 1 + int(share/sum)
		used += share / sum
		rems[i] = rem{i, share % sum}
	}
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.r, a.r) })
	for k := 0; used < free; k++ {
		out[rems[k].i]++
		used++
	}
	return out
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// mapElems returns the farm's backend map elements for slots from base.
func (p *farmPlan) mapElems(f *model.Farm, base uint32) []nftables.SetElement {
	slots := p.slots(f)
	out := make([]nftables.SetElement, len(slots))
	for s, i := range slots {
		out[s] = nftables.SetElement{Key: slotKey(base + uint32(s)), Val: p.backendData(p.active[i])}
	}
	return out
}

// hashLoads loads the farm's hash keys into consecutive 32-bit registers
// from NFT_REG_1 and returns the expressions and the number of bytes loaded.
func hashLoads(f *model.Farm, v6 bool) ([]expr.Any, uint32) {
	var out []expr.Any
	reg := uint32(reg32)
	alen, saddr, daddr := uint32(4), uint32(12), uint32(16)
	if v6 {
		alen, saddr, daddr = 16, 8, 24
	}
	load := func(base expr.PayloadBase, off, n uint32) {
		out = append(out, &expr.Payload{DestRegister: reg, Base: base, Offset: off, Len: n})
		reg += (n + 3) / 4
	}
	k := f.SchedParam
	if k&model.KeySrcIP != 0 {
		load(expr.PayloadBaseNetworkHeader, saddr, alen)
	}
	if k&model.KeyDstIP != 0 {
		load(expr.PayloadBaseNetworkHeader, daddr, alen)
	}
	if k&model.KeySrcPort != 0 {
		load(expr.PayloadBaseTransportHeader, 0, 2)
	}
	if k&model.KeyDstPort != 0 {
		load(expr.PayloadBaseTransportHeader, 2, 2)
	}
	return out, (reg - reg32) * 4
}

// farmRules returns the rules of a farm's chain: the scheduler picks a
// slot in [base, base+modulus) (numgen or jhash with an offset) and the
// shared backend map turns it into the backend.
func (p *farmPlan) farmRules(f *model.Farm, base, modulus uint32) [][]expr.Any {
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	if p.kind == kindNone {
		return [][]expr.Any{drop}
	}
	var r []expr.Any
	switch f.Scheduler {
	case model.SchedRR:
		r = append(r, &expr.Numgen{Register: reg1, Type: unix.NFT_NG_INCREMENTAL, Modulus: modulus, Offset: base})
	case model.SchedWeight:
		r = append(r, &expr.Numgen{Register: reg1, Type: unix.NFT_NG_RANDOM, Modulus: modulus, Offset: base})
	case model.SchedHash:
		loads, n := hashLoads(f, p.v6)
		// The family match is implied by the service map, but lets nft
		// list the loads as ip saddr/ip6 saddr instead of raw offsets.
		r = append(r, nfproto(p.v6)...)
		r = append(r, loads...)
		r = append(r, &expr.Hash{SourceRegister: reg1, DestRegister: reg1, Length: n, Modulus: modulus,
			Seed: seed(f.Name), Offset: base, Type: expr.HashTypeJenkins})
	}
	n := &expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily(p.v6), RegAddrMin: reg1}
	if p.kind == kindAddrPort {
		n.RegProtoMin = reg32 + addrWords(p.v6)
	}
	r = append(r,
		&expr.Lookup{SourceRegister: reg1, SetName: p.bkSet(), IsDestRegSet: true, DestRegister: reg1},
		&expr.Counter{},
		n,
	)
	// A lookup miss cannot happen (slots cover the modulus), but if it
	// did the packet must not reach local sockets: drop.
	return [][]expr.Any{r, drop}
}
