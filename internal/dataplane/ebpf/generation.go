package ebpf

import (
	"fmt"
	"net/netip"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// A generation is one immutable version of a farm in the maps: its service
// keys all point at one svc_val whose id names its slots and, through them,
// its backend entries. A change writes a whole new generation under a fresh
// id, then flips the service keys to it (each key flip is one atomic map
// update), then frees the old generation one change later, so a packet
// always sees the old or the new farm, never a mix.
//
// A backend keeps its id (and entry) across the generations of its farm as
// long as the farm lists it (ids are reference-counted), so tracked flows
// know what became of their backend: while it is down or off its entry is
// flagged gone (beFlagGone) and the program expires their flows
// (expire_nodest_conn); drained or standby backends keep theirs. A backend
// removed from the farm (or a farm going down) leaves its tracked flows
// alone, as the nft plane does.
type generation struct {
	farm  string
	keys  []xlbSvcKey
	val   xlbSvcVal    // val.Id is the generation id once written
	bes   []xlbBackend // distinct backends: the active ones first
	names []string     // backend names, parallel to bes (the first of duplicates)
	slots []int        // slot -> index into bes
	// lcWeights: wlc's weight of the backend of slot i, written to
	// xlb_slots under Idx lcWeightIdx|i (bpf/xlb_lc.h); nil for others.
	lcWeights []uint32
	ids       []uint32 // backend ids, parallel to bes, once written
	// active: bes[:active] take new flows (slots, persistence); the
	// others take none: up ones (weight 0, a higher priority level)
	// keep their tracked flows, down or off ones (Flags beFlagGone)
	// expire them.
	active int
	// stlsdnat: reply mappings (backend -> VIP), parallel slices.
	stlKeys []xlbStlKey
	stlVals []xlbStlVal
	// log: the farm logs new connections (xlb_svc_flags), a line for
	// each of these prefixes (one per hook of its log).
	log         bool
	logPrefixes []string
	// passive: the farm's passive check (resolved), whose backends the
	// program watches (passive.go), but its sorry server; nil: none.
	passive *model.PassiveCheck
	sorry   string
	// noLocal: intra-connect off, the socket programs leave the node's
	// own connections alone (xlb_svc_flags).
	noLocal bool
	// staticKeys, staticVals: the farm's static sessions in xlb_static
	// (static.go), parallel slices.
	staticKeys []xlbPersistKey
	staticVals []xlbPersistVal
}

func (g *generation) hasStl(k xlbStlKey) bool {
	for _, x := range g.stlKeys {
		if x == k {
			return true
		}
	}
	return false
}

// plan computes a farm's generation without ids; nil if the farm serves no
// service key (state down or off).
func (p *Plane) plan(f *model.Farm) (*generation, error) {
	if f.State != model.StateUp {
		return nil, nil
	}
	g := &generation{farm: f.Name, log: f.Log != 0, logPrefixes: plan.FarmLogPrefixes(f), noLocal: f.IntraConnectOff}
	if f.Check != nil && f.Check.Passive != nil {
		r := f.Check.Passive.Resolved()
		g.passive, g.sorry = &r, f.Check.SorryServer
	}
	proto := f.Protocol.Number()
	vip, fam := addrWords(f.VirtualAddr), familyOf(f.VirtualAddr)
	addKey := func(port uint16) {
		g.keys = append(g.keys, xlbSvcKey{Addr: vip, Port: ne16(port), Proto: proto, Family: fam})
	}
	if len(f.VirtualPorts) == 0 {
		addKey(0)
	}
	for _, r := range f.VirtualPorts {
		for port := uint32(r.First); port <= uint32(r.Last); port++ {
			addKey(uint16(port))
		}
	}
	p.tagKeys(f, g.keys) // a farm chosen by source table (sourcetable.go)
	switch f.Mode {
	case model.ModeSNAT:
		g.val.Mode = modeSNAT
	case model.ModeDSR:
		g.val.Mode = modeDSR
	case model.ModeLocal:
		// nftlb's local: the program passes the packets (after the
		// farm's policies) to the node's own sockets.
		g.val.Mode = modeLocal
	case model.ModeStlsDNAT:
		g.val.Mode = modeSTL
		// Replies of every backend (active or not: in-flight packets)
		// leave as the VIP; a backend port maps back to the farm's one
		// virtual port (check makes sure there is one), port 0 keeps it.
		seen := map[xlbStlKey]bool{}
		for _, b := range f.Backends {
			k := xlbStlKey{Addr: addrWords(b.Addr), Port: ne16(b.Port), Proto: proto, Family: familyOf(b.Addr)}
			if seen[k] {
				continue
			}
			seen[k] = true
			v := xlbStlVal{Addr: vip}
			if b.Port != 0 {
				v.Port = ne16(f.VirtualPorts[0].First)
			}
			g.stlKeys = append(g.stlKeys, k)
			g.stlVals = append(g.stlVals, v)
		}
	default:
		g.val.Mode = modeDNAT
	}
	switch f.Scheduler {
	case model.SchedWeight:
		g.val.Sched = schedWeight
	case model.SchedHash:
		// The program hashes these fields with plan.FlowSlot's hash
		// (xlb_flow_hash_keys), as the nft plane does.
		g.val.Sched = schedHash
		g.val.HashKeys = hashKeys(f.SchedParam)
	case model.SchedLC:
		g.val.Sched = schedLC
	case model.SchedWLC:
		g.val.Sched = schedWLC
	case model.SchedMaglev:
		// The program hashes the whole flow with plan.FlowSlot's hash
		// (xlb_flow_hash), as the nft plane does: no hash keys.
		g.val.Sched = schedMaglev
	case model.SchedSymhash:
		// Symmetric: any address key hashes both addresses, any port
		// key both ports.
		g.val.Sched = schedSymhash
		if f.SchedParam&(model.KeySrcIP|model.KeyDstIP) != 0 {
			g.val.HashKeys |= hashSrcIP
		}
		if f.SchedParam&(model.KeySrcPort|model.KeyDstPort) != 0 {
			g.val.HashKeys |= hashSrcPort
		}
	default:
		g.val.Sched = schedRR
	}
	g.val.NewIv, g.val.NewTol = clientRate(f.NewRTLimit, f.NewRTUnit, f.NewRTBurst)
	g.val.RstIv, g.val.RstTol = clientRate(f.RstRTLimit, f.RstRTUnit, f.RstRTBurst)
	if f.Persistence != 0 {
		g.val.Persist = hashKeys(f.Persistence)
		g.val.PersistTtl = f.PersistTTL
		g.planStatic(f) // static.go; after the service keys
	}
	active := f.ActiveBackends()
	entry := func(b model.Backend) (xlbBackend, error) {
		be := xlbBackend{Addr: addrWords(b.Addr), Port: ne16(b.Port), Family: familyOf(b.Addr), Mark: b.Mark}
		if f.Mode == model.ModeSNAT {
			src := f.SourceAddr
			if b.SourceAddr.IsValid() {
				src = b.SourceAddr // nftlb's backend source-addr
			}
			if !src.IsValid() {
				var err error
				if src, err = p.sourceFor(b.Addr); err != nil {
					// The request's value, not the kernel, is at fault:
					// a *model.FieldError, so the API answers 400.
					return be, &model.FieldError{Object: fmt.Sprintf("farm %q backend %q", f.Name, b.Name), Field: "ip-addr", Value: b.Addr.String(),
						Problem: fmt.Sprintf("mode snat needs a route to the backend to pick the source address, and there is none (%v); add a route or set the farm's source-addr", err)}
				}
			}
			be.Snat = addrWords(src)
		} else if src := p.hairpinSource(f, b.Addr, p.srcMemo); src.IsValid() {
			be.Snat = addrWords(src)
		}
		return be, nil
	}
	weights := make([]uint32, len(active))
	isActive := map[string]bool{}
	for i, b := range active {
		be, err := entry(b)
		if err != nil {
			return nil, err
		}
		g.bes = append(g.bes, be)
		g.names = append(g.names, b.Name)
		weights[i] = b.Weight
		isActive[b.Name] = true
	}
	g.active = len(g.bes)
	// The rest, up ones first (a backend listed twice counts as up).
	for _, up := range []bool{true, false} {
		for _, b := range f.Backends {
			if isActive[b.Name] || (b.State == model.StateUp) != up {
				continue
			}
			be, err := entry(b)
			if err != nil {
				return nil, err
			}
			if !up {
				be.Flags = beFlagGone
			}
			dup := false
			for _, x := range g.bes {
				dup = dup || sameBackend(x, be)
			}
			if !dup {
				g.bes = append(g.bes, be)
				g.names = append(g.names, b.Name)
			}
		}
	}
	if f.Scheduler == model.SchedRR {
		for i := range weights {
			weights[i] = 1
		}
	}
	switch f.Scheduler {
	case model.SchedMaglev:
		g.slots = plan.MaglevTable(f, active)
	case model.SchedHash:
		g.slots = plan.HashTable(active)
	case model.SchedLC, model.SchedWLC:
		// One slot per serving backend, in the farm's order: lc_pick
		// reads them all (ties go to the first).
		g.slots = make([]int, len(active))
		for i := range g.slots {
			g.slots[i] = i
		}
		if f.Scheduler == model.SchedWLC {
			g.lcWeights = weights
		}
	default:
		g.slots = plan.WeightedSlots(weights, plan.MaxWeightedSlots)
	}
	g.val.Slots = uint32(len(g.slots))
	return g, nil
}

// hashKeys is k as the program's XLB_HASH_* bits (check refuses srcmac,
// and dstip and dstport for persistence).
func hashKeys(k model.HashKey) uint8 {
	var out uint8
	for _, m := range []struct {
		k   model.HashKey
		bit uint8
	}{{model.KeySrcIP, hashSrcIP}, {model.KeySrcPort, hashSrcPort}, {model.KeyDstIP, hashDstIP}, {model.KeyDstPort, hashDstPort}} {
		if k&m.k != 0 {
			out |= m.bit
		}
	}
	return out
}

// indexKey is g's be_index key of backend i.
func (g *generation) indexKey(i int) xlbBeIndexKey {
	return xlbBeIndexKey{Svc: g.val.Id, Addr: g.bes[i].Addr, Port: g.bes[i].Port}
}

// sourceFor returns the address the LB's namespace uses towards dst (the
// snat source when the farm sets no source-addr).
func (p *Plane) sourceFor(dst netip.Addr) (netip.Addr, error) {
	routes, err := p.nl.RouteGet(dst.AsSlice())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("route to %s: %w", dst, err)
	}
	for _, r := range routes {
		if a, ok := netip.AddrFromSlice(r.Src); ok && a.Unmap().Is4() == dst.Is4() {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no source address towards %s", dst)
}

// sameBackend reports whether a and b are the same backend entry but for
// its flags.
func sameBackend(a, b xlbBackend) bool {
	a.Flags, b.Flags = 0, 0
	return a == b
}

func (g *generation) hasKey(k xlbSvcKey) bool {
	for _, x := range g.keys {
		if x == k {
			return true
		}
	}
	return false
}
