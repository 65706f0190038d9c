package nft

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// mapKind is the shape of a farm's backend map.
type mapKind uint8

const (
	kindNone     mapKind = iota // no serving backend: the chain rejects new connections
	kindAddr                    // slot -> address (dnat keeps the client's port)
	kindAddrPort                // slot -> address . port
)

// farmPlan is everything derived from a farm that goes into the kernel.
type farmPlan struct {
	// placement is where the farm goes (placement.go); the rest is what
	// it holds.
	placement
	name   string
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
	// l2: stlsdnat at ingress (stlsingress.go): chain, maps and reply
	// chain in the netdev table, svc elements in dsr4/6 and rev in
	// dsrr4/6 (jump), post elements in l2to4/6 and l2back in l2back4/6;
	// dsr holds the links.
	l2     bool
	l2back []elem
	learnt string // the map of clients' MACs (learntName)
	rchain string
	rev    []elem
	// lchain is the farm's log chain ("" without log) and logs its
	// elements in log4/log6 (jump).
	lchain string
	logs   []elem
	// helper names the farm's ct helper object ("" without a helper).
	helper string
	// persist names the persistence map ("" without persistence or
	// without serving backends); see persist.go.
	persist string
	// static are the elements of the farm's static sessions map and sset
	// its definition in the batch being built (staticsessions.go).
	static []nftables.SetElement
	sset   *nftables.Set
	// dsrMode: mode dsr (dsr.go). The chain and map live in the netdev
	// table; svc elements are in dsr4/6 (jump), post elements in
	// dsrif4/6 (the oface's index); dsr holds the resolved links.
	dsrMode bool
	dsr     *dsrLink
	// direct: elements of the farm in dst4/dst6 (VIP . protocol . port ->
	// its one backend); the farm has no chain or map of its own and its
	// svc elements go to the shared direct chain (see setDirect).
	direct []elem
	// hair: the farm's elements of hairpin4/6 (hairpin.go).
	hair []elem
	// clients are the farm's per-client limit sets (clientlimits.go),
	// clientSetDefs their definitions in the batch being built; vchains
	// the verdict chains its limits jump to (verdict.go); logGroup the
	// NFLOG group of its log lines (Options.LogGroup).
	// local: mode local (local.go): the farm's chain holds its limits and
	// accepts, the LB's own sockets serve the VIP.
	local bool
	// bsnat: the farm's elements in snatb4/6 (backend source-addr,
	// backendsnat.go).
	bsnat []elem
	// nolocal: the farm's elements in nolocal4/6 (intra-connect off,
	// intraconnect.go).
	nolocal       []elem
	clients       clientSets
	clientSetDefs map[string]*nftables.Set
	vchains       []string
	logGroup      uint16
}

// planFarm derives what a farm needs in the kernel. A farm that is not up
// needs nothing: it is absent from the service maps, so the LB does not
// handle its traffic.
func planFarm(f *model.Farm) *farmPlan {
	if f.State != model.StateUp {
		return nil
	}
	p := &farmPlan{name: f.Name, placement: placement{v6: f.VirtualAddr.Is6(), via: chainOwn, chain: chainName(f.Name)}}
	defer p.place()
	defer p.planClientSets(f) // runs first: p.v6 is final by then
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
		p.backends(f)
		p.hair = hairpinElems(f, p) // a farm chosen by source table is one of these
		return p
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
	if f.StlsAtIngress() {
		// The links (and so the post elements) are set by setL2.
		p.stls, p.l2, p.learnt = true, true, learntName(f)
		p.chain = farmDsr + nameHash(f.Name)
		p.rchain = farmL2Rev + nameHash(f.Name)
		p.svc, p.rev = svcElems(f, p.chain, nil), revElems(f, p.rchain)
		for _, es := range [][]elem{p.svc, p.rev} {
			for i := range es {
				es[i].Jump = true
			}
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
	if needsFilter(f, p.helper) {
		p.fchain = farmFilter + nameHash(f.Name)
		p.filt = svcElems(f, p.fchain, nil)
	}
	if f.Mode == model.ModeLocal {
		// The LB itself serves the VIP (local.go): no backends, no NAT.
		p.local = true
		p.planNoLocal(f)
		p.svc = markExact(p.svc)
		return p
	}
	if f.Mode == model.ModeSNAT {
		if f.SourceAddr.IsValid() {
			p.post = markExact(svcElems(f, "", f.SourceAddr.AsSlice()))
		} else {
			p.post = markExact(svcElems(f, "", nil))
		}
	}
	p.planBackendSnat(f)
	p.planNoLocal(f)
	p.svc = markExact(p.svc)
	p.backends(f)
	p.hair = hairpinElems(f, p)
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
	if p.kind == kindAddrPort && f.SinglePort() {
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
		p.planStatic(f) // staticsessions.go
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
	if f.Scheduler == model.SchedMaglev || f.Scheduler == model.SchedHash {
		// One element per slot of the table both planes use: the
		// Maglev table, or the hash scheduler's weighted slots.
		var table []int
		if f.Scheduler == model.SchedMaglev {
			table = plan.MaglevTable(f, p.active)
		} else {
			table = plan.HashTable(p.active)
		}
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
