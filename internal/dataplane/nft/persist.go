package nft

import (
	"fmt"
	"hash/fnv"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Persistence (nftlb's persistence / IPVS -p) keeps a client on the
// backend it was first given. As in nftlb, the connection's ct mark carries
// the backend's id (FNV-1a of its address and port) between the
// expressions of a rule. A farm with persistence has three maps:
//
//	map m-<hash>-<gen>   { slot : mark }                   the scheduler's slots hold backend ids
//	map a-<hash>-<gen>   { mark : <backend data> }         the backends that may serve now
//	map p-<hash>-<shape> { <key> : mark; flags dynamic,timeout; timeout <ttl>s }
//
// and its chain is
//
//	ct mark set <key> map @p update @p { <key> : ct mark } dnat to ct mark map @a   (known client)
//	delete @p { <key> : ct mark }                                                  (its backend stopped serving)
//	ct mark set <scheduler> map @m add @p { <key> : ct mark } dnat to ct mark map @a (new client)
//	ct mark set <scheduler> map @m dnat to ct mark map @a                          (no key: no link-layer header)
//	drop
//
// A session lives persist-ttl seconds after the client's last new
// connection. The active map is rebuilt with the slot map, so when a
// backend goes down, drains or leaves the serving priority level, its
// clients' next connection misses in @a, forgets the session and is
// scheduled again. The persistence map survives rebuilds (its name depends
// only on the farm, family, key and ttl), so sessions live through
// unrelated changes; a change of key or ttl starts a new, empty map.
//
// Why the ct mark: the kernel could keep the backend in a register, but nft
// (1.0) cannot list a set update or a lookup whose input is another map's
// result, and `nft list ruleset` must keep working. So the connections of
// a farm with persistence have their ct mark set to the backend id (nftlb
// does the same); do not rely on your own ct marks for them.

// dynsetOpDelete is NFT_DYNSET_OP_DELETE (kernel 5.14+; not in x/sys).
const dynsetOpDelete = 2

// regKey is where persistence keys are loaded (NFT_REG32_09): clear of the
// backend data from NFT_REG_1 (at most 20 bytes, NFT_REG32_00-04). Not
// NFT_REG32_08: the kernel dumps a 16-byte aligned register as NFT_REG_3,
// and nft then cannot list a concatenation starting there. Keys up to 28
// bytes fit (NFT_REG32_09-15).
const (
	regKey     = reg32 + 9
	maxKeySize = 28
)

// persistField is one component of a persistence key.
type persistField struct {
	key  model.HashKey
	typ  func(v6 bool) nftables.SetDatatype
	load func(v6 bool, reg uint32) expr.Any
	size uint32 // bytes loaded
}

var persistFields = []persistField{
	{model.KeySrcIP, addrType, func(v6 bool, reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: pick(v6, uint32(12), 8), Len: pick(v6, uint32(4), 16)}
	}, 0},
	{model.KeyDstIP, addrType, func(v6 bool, reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: pick(v6, uint32(16), 24), Len: pick(v6, uint32(4), 16)}
	}, 0},
	{model.KeySrcPort, portType, func(_ bool, reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}
	}, 2},
	{model.KeyDstPort, portType, func(_ bool, reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	}, 2},
	{model.KeySrcMAC, func(bool) nftables.SetDatatype { return nftables.TypeEtherAddr }, func(_ bool, reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6}
	}, 6},
}

func addrType(v6 bool) nftables.SetDatatype {
	return pick(v6, nftables.TypeIPAddr, nftables.TypeIP6Addr)
}

func portType(bool) nftables.SetDatatype { return nftables.TypeInetService }

func (f persistField) bytes(v6 bool) uint32 {
	if f.size == 0 {
		return pick(v6, uint32(4), 16)
	}
	return f.size
}

// keyLoads loads a persistence (or hash) key into registers from reg on,
// each field padded to 4 bytes; it returns the loads, the key's types and
// its length in bytes.
func keyLoads(k model.HashKey, v6 bool, reg uint32) ([]expr.Any, []nftables.SetDatatype, uint32) {
	var loads []expr.Any
	var types []nftables.SetDatatype
	start := reg
	for _, f := range persistFields {
		if k&f.key == 0 {
			continue
		}
		loads = append(loads, f.load(v6, reg))
		types = append(types, f.typ(v6))
		reg += (f.bytes(v6) + 3) / 4
	}
	return loads, types, (reg - start) * 4
}

// persistName is the name of a farm's persistence map.
func persistName(f *model.Farm) string {
	return fmt.Sprintf("p-%s-%d%x-%d", nameHash(f.Name), pick(f.VirtualAddr.Is6(), 4, 6), uint8(f.Persistence), f.PersistTTL)
}

// activeName is the name of the map of serving backends by id that goes
// with the slot map mapName.
func activeName(mapName string) string { return "a" + mapName[1:] }

// backendID names a backend in the maps of a farm with persistence or
// backend marks: its mark if it has one, else FNV-1a of address and port.
func backendID(b model.Backend) uint32 {
	if b.Mark != 0 {
		return b.Mark
	}
	h := fnv.New32a()
	h.Write(b.Addr.AsSlice())
	h.Write([]byte{byte(b.Port >> 8), byte(b.Port)})
	return h.Sum32()
}

// dataType is the type of the backend map's data.
func (p *farmPlan) dataType() nftables.SetDatatype {
	if p.kind == kindAddr {
		return pick(p.v6, nftables.TypeIPAddr, nftables.TypeIP6Addr)
	}
	return pick(p.v6, typeDst4, typeDst6)
}

// persistSet returns the definition of the farm's persistence map.
func (p *farmPlan) persistSet(t *nftables.Table, f *model.Farm, id uint32) *nftables.Set {
	_, types, _ := keyLoads(f.Persistence, p.v6, regKey)
	s := &nftables.Set{Table: t, Name: p.persist, ID: id, IsMap: true, Dynamic: true, HasTimeout: true,
		Timeout: time.Duration(f.PersistTTL) * time.Second, DataType: nftables.TypeMark, KeyByteOrder: binaryutil.BigEndian}
	if len(types) == 1 {
		s.KeyType = types[0]
	} else {
		s.KeyType = nftables.MustConcatSetType(types...)
		s.Concatenation = true
	}
	return s
}

// activeSet returns the definition of the map of serving backends by id.
func (p *farmPlan) activeSet(t *nftables.Table, name string, id uint32) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, ID: id, IsMap: true, KeyType: nftables.TypeMark,
		DataType: p.dataType(), KeyByteOrder: binaryutil.NativeEndian}
}

func (p *farmPlan) activeElems() []nftables.SetElement {
	var out []nftables.SetElement
	seen := map[uint32]bool{}
	for _, b := range p.active {
		id := backendID(b)
		if seen[id] { // the same address and port twice
			continue
		}
		seen[id] = true
		out = append(out, nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(id), Val: p.backendData(b)})
	}
	return out
}

// persistRules returns the chain of a farm with persistence (without the
// final drop). sched is the scheduling rule: it leaves a backend id in
// reg1 and ends with counter and dnat n.
func (p *farmPlan) persistRules(f *model.Farm, sched []expr.Any, n *expr.NAT, pset, aset *nftables.Set) [][]expr.Any {
	loads, _, _ := keyLoads(f.Persistence, p.v6, regKey)
	setMark := &expr.Ct{Key: expr.CtKeyMARK, Register: reg1, SourceRegister: true}
	getMark := &expr.Ct{Key: expr.CtKeyMARK, Register: reg1}
	dyn := func(op uint32) expr.Any {
		return &expr.Dynset{SrcRegKey: regKey, SrcRegData: reg1, SetName: pset.Name, SetID: pset.ID, Operation: op}
	}
	resolve := p.resolve(n, aset)
	cat := func(parts ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, x := range parts {
			out = append(out, x...)
		}
		return out
	}
	known := cat(nfproto(p.v6), loads, []expr.Any{
		&expr.Lookup{SourceRegister: regKey, SetName: pset.Name, SetID: pset.ID, IsDestRegSet: true, DestRegister: reg1},
		setMark, getMark, dyn(unix.NFT_DYNSET_OP_UPDATE)}, resolve)
	forget := cat(nfproto(p.v6), loads, []expr.Any{getMark, dyn(dynsetOpDelete)})
	head := sched[:len(sched)-2] // without counter and dnat: the id is in reg1
	fresh := cat(nfproto(p.v6), head, []expr.Any{setMark}, loads, []expr.Any{getMark, dyn(unix.NFT_DYNSET_OP_ADD)}, resolve)
	plain := cat(head, []expr.Any{setMark}, resolve)
	if p.sset != nil {
		return [][]expr.Any{p.staticRule(f, n, p.sset, aset), known, forget, fresh, plain}
	}
	return [][]expr.Any{known, forget, fresh, plain}
}

// persistKeySize is the length in bytes of a farm's persistence key in
// registers.
func persistKeySize(f *model.Farm) int {
	_, _, n := keyLoads(f.Persistence, f.VirtualAddr.Is6(), regKey)
	return int(n)
}

// resolve turns the backend id in the ct mark into the backend and dnats
// to it. With backend marks the packet mark is set to it first, so the
// connection's first packet is routed by it (policy routing).
func (p *farmPlan) resolve(n *expr.NAT, aset *nftables.Set) []expr.Any {
	out := []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: reg1}}
	if p.marks {
		out = append(out, &expr.Meta{Key: expr.MetaKeyMARK, Register: reg1, SourceRegister: true})
	}
	return append(out,
		&expr.Lookup{SourceRegister: reg1, SetName: aset.Name, SetID: aset.ID, IsDestRegSet: true, DestRegister: reg1},
		&expr.Counter{}, n)
}

// markRules returns the chain of a farm with backend marks and no
// persistence (without the final drop):
//
//	ct mark set <scheduler> map @m meta mark set ct mark dnat to ct mark map @a
func (p *farmPlan) markRules(sched []expr.Any, n *expr.NAT, aset *nftables.Set) [][]expr.Any {
	head := sched[:len(sched)-2]
	r := append(append([]expr.Any(nil), head...), &expr.Ct{Key: expr.CtKeyMARK, Register: reg1, SourceRegister: true})
	return [][]expr.Any{append(r, p.resolve(n, aset)...)}
}
