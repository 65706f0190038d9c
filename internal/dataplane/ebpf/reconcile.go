package ebpf

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Reconcile makes the maps hold exactly the given farms. A farm whose
// entries already match (a restarted daemon adopting pinned maps) is kept
// as it is, round-robin position included; any other is written as a new
// generation and flipped to. Service keys of no farm are deleted, then
// slots and backends no service references.
func (p *Plane) Reconcile(ctx context.Context, farms []*model.Farm) error {
	farms = plan.SplitFarms(farms) // a dual farm is its two halves
	p.mu.Lock()
	defer p.mu.Unlock()
	p.srcMemo = sourceCache{}
	defer func() { p.srcMemo = nil }()
	// Pins removed and programs detached by others (drift.go).
	if err := p.repairPins(); err != nil {
		return err
	}
	p.freePending()

	svcs := map[xlbSvcKey]xlbSvcVal{}
	{
		var k xlbSvcKey
		var v xlbSvcVal
		it := p.objs.XlbServices.Iterate()
		for it.Next(&k, &v) {
			svcs[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read services: %w", err)
		}
	}
	slots := map[xlbSlotKey]uint32{}
	{
		var k xlbSlotKey
		var v uint32
		it := p.objs.XlbSlots.Iterate()
		for it.Next(&k, &v) {
			slots[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read slots: %w", err)
		}
	}
	bes := map[uint32]xlbBackend{}
	{
		var k uint32
		var v xlbBackend
		it := p.objs.XlbBackends.Iterate()
		for it.Next(&k, &v) {
			bes[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read backends: %w", err)
		}
	}

	// Counter slots of the backends in the maps (a restarted daemon's).
	if err := p.adoptStatSlots(bes); err != nil {
		return err
	}
	// Everything in the maps counts as used until the sweep below.
	p.svcIDs.init()
	p.backendIDs.init()
	for _, v := range svcs {
		p.used[v.Id] = true
	}
	for k := range slots {
		p.used[k.Svc] = true
	}
	for id := range bes {
		p.usedBE[id] = 1
	}
	// A farm written anew shares the entries of its backends that are
	// already in the maps (and not gone), so their tracked flows continue.
	byEntry := map[xlbBackend][]uint32{}
	for id, be := range bes {
		be.Flags = 0
		byEntry[be] = append(byEntry[be], id)
	}
	// The backends a service generation's slots name: a farm's own
	// entries are preferred over another farm's identical ones.
	slotIDs := map[uint32]map[uint32]bool{}
	for k, id := range slots {
		if k.Idx&lcWeightIdx != 0 {
			continue // a wlc weight, not a backend id
		}
		if slotIDs[k.Svc] == nil {
			slotIDs[k.Svc] = map[uint32]bool{}
		}
		slotIDs[k.Svc][id] = true
	}
	taken := map[uint32]bool{}
	reuseFor := func(g *generation) func(xlbBackend) uint32 {
		own := slotIDs[svcs[g.keys[0]].Id]
		return func(be xlbBackend) uint32 {
			be.Flags = 0
			for _, pass := range []bool{true, false} {
				for _, id := range byEntry[be] {
					if !taken[id] && own[id] == pass {
						taken[id] = true
						return id
					}
				}
			}
			return 0
		}
	}

	p.farms, p.svcIdx = map[string]*generation{}, svcIndex{}
	p.bySvc = map[uint32]*generation{}
	// Each farm keeps the id its generation in the maps carries.
	p.farmIDs.initFarmIDs()
	farmIDOf := p.recoverFarmIDs()
	p.stlOwner = map[xlbStlKey]string{}
	adopted := map[uint32]bool{}
	// Farms already in the maps are adopted first, so that a farm
	// written anew cannot share an entry an adopted farm holds.
	var rewrite []*generation
	for _, f := range farms {
		if err := ctx.Err(); err != nil {
			return err
		}
		g, err := p.plan(f)
		if err != nil {
			return err
		}
		if g == nil {
			continue
		}
		p.bindFarmID(f.Name, svcs[g.keys[0]].Id, farmIDOf)
		if !adopt(g, svcs, slots, bes) || adopted[g.val.Id] {
			rewrite = append(rewrite, g)
			continue
		}
		adopted[g.val.Id] = true
		for _, id := range g.ids {
			taken[id] = true
		}
		p.setFarm(f.Name, g)
		p.bySvc[g.val.Id] = g
		if err := p.setSvcFlags(g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
		// The index and the stlsdnat mappings may predate this
		// version: write them again.
		if err := p.writeIndex(g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
		if err := p.writeStateless(g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
		if err := p.writeStatic(g); err != nil {
			return err
		}
	}
	for _, g := range rewrite {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.write(g, reuseFor(g)); err != nil {
			return fmt.Errorf("farm %q: %w", g.farm, err)
		}
		if err := p.flip(nil, g); err != nil {
			return fmt.Errorf("farm %q: %w", g.farm, err)
		}
		p.syncFlags(g)
		p.setFarm(g.farm, g)
	}

	// Sweep: service keys, slots and backends that no farm owns.
	owned := map[xlbSvcKey]bool{}
	liveSvc := map[uint32]bool{}
	liveBE := map[uint32]bool{}
	for _, g := range p.farms {
		for _, k := range g.keys {
			owned[k] = true
		}
		liveSvc[g.val.Id] = true
		for _, id := range g.ids {
			liveBE[id] = true
		}
	}
	for k := range svcs {
		if !owned[k] {
			if err := p.objs.XlbServices.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete stray service: %w", err)
			}
		}
	}
	for k := range slots {
		if !liveSvc[k.Svc] {
			_ = p.objs.XlbSlots.Delete(k)
		}
	}
	for id := range bes {
		if !liveBE[id] {
			_ = p.objs.XlbBackends.Delete(id)
		}
	}
	if err := p.dropStaleStatic(); err != nil {
		return err
	}
	{
		var k xlbStlKey
		var v xlbStlVal
		var stale []xlbStlKey
		it := p.objs.XlbStateless.Iterate()
		for it.Next(&k, &v) {
			if _, ok := p.stlOwner[k]; !ok {
				stale = append(stale, k)
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read stlsdnat mappings: %w", err)
		}
		for _, k := range stale {
			_ = p.objs.XlbStateless.Delete(k)
		}
	}
	{
		var k xlbBeIndexKey
		var v uint32
		var stale []xlbBeIndexKey
		it := p.objs.XlbBeIndex.Iterate()
		for it.Next(&k, &v) {
			if !liveSvc[k.Svc] || !liveBE[v] {
				stale = append(stale, k)
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read backend index: %w", err)
		}
		for _, k := range stale {
			_ = p.objs.XlbBeIndex.Delete(k)
		}
	}
	if err := p.syncBackendStats(liveBE); err != nil {
		return err
	}
	if err := p.reconcilePassive(); err != nil {
		return err
	}
	known := map[string]bool{}
	for _, f := range farms {
		known[f.Name] = true
	}
	for name := range p.carry {
		if !known[name] {
			delete(p.carry, name)
		}
	}
	p.dropUnbound()
	p.svcIDs.init()
	p.backendIDs.init()
	for id := range liveSvc {
		p.used[id] = true
	}
	for _, g := range p.farms {
		for _, id := range g.ids {
			p.usedBE[id]++
		}
	}
	// Adopted services carry the policy ids an earlier daemon wrote.
	return p.restampServices()
}

// adopt reports whether the maps already hold generation g (same keys, same
// service value, same slots and backends); if so it fills in g's ids.
func adopt(g *generation, svcs map[xlbSvcKey]xlbSvcVal, slots map[xlbSlotKey]uint32, bes map[uint32]xlbBackend) bool {
	var id uint32
	for i, k := range g.keys {
		v, ok := svcs[k]
		if !ok {
			return false
		}
		if i == 0 {
			id = v.Id
		}
		want := g.val
		want.Id = id
		if !sameService(v, want) { // the policy ids: restampServices
			return false
		}
	}
	ids := make([]uint32, len(g.bes))
	for i, b := range g.slots {
		bid, ok := slots[xlbSlotKey{Svc: id, Idx: uint32(i)}]
		if !ok {
			return false
		}
		if be, ok := bes[bid]; !ok || be != g.bes[b] {
			return false
		}
		if ids[b] != 0 && ids[b] != bid {
			return false
		}
		ids[b] = bid
	}
	if _, extra := slots[xlbSlotKey{Svc: id, Idx: uint32(len(g.slots))}]; extra {
		return false
	}
	// wlc's weights (bpf/xlb_lc.h): the same ones, and no more.
	for i, w := range g.lcWeights {
		if v, ok := slots[xlbSlotKey{Svc: id, Idx: lcWeightIdx | uint32(i)}]; !ok || v != w {
			return false
		}
	}
	if _, extra := slots[xlbSlotKey{Svc: id, Idx: lcWeightIdx | uint32(len(g.lcWeights))}]; extra {
		return false
	}
	for _, bid := range ids {
		if bid == 0 { // a backend without slots (drained, down): written anew
			return false
		}
	}
	g.val.Id = id
	g.ids = ids
	return true
}
