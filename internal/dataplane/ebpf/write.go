package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/model"
)

// writeStateless writes g's stlsdnat reply mappings, refusing a backend
// that another farm's mapping holds.
func (p *Plane) writeStateless(g *generation) error {
	for i, k := range g.stlKeys {
		if o, ok := p.stlOwner[k]; ok && o != g.farm && p.farms[o] != nil && p.farms[o].hasStl(k) {
			return &model.FieldError{Object: fmt.Sprintf("farm %q", g.farm), Field: "backends",
				Value:   fmt.Sprintf("%s port %d", wordsAddr(k.Addr, k.Family), be16(k.Port)),
				Problem: fmt.Sprintf("already serves stlsdnat farm %q: its replies could not be told apart", o)}
		}
		if err := p.objs.XlbStateless.Update(k, g.stlVals[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write stlsdnat mapping: %w", err)
		}
		p.stlOwner[k] = g.farm
	}
	return nil
}

// freeStateless removes g's stlsdnat mappings that no current generation
// of its farm holds (another farm's are left alone).
func (p *Plane) freeStateless(g *generation) {
	cur := p.farms[g.farm]
	for _, k := range g.stlKeys {
		if p.stlOwner[k] != g.farm || (cur != nil && cur.hasStl(k)) {
			continue
		}
		_ = p.objs.XlbStateless.Delete(k)
		delete(p.stlOwner, k)
	}
}

// writeIndex writes g's backend index (address -> id), used by persistence.
func (p *Plane) writeIndex(g *generation) error {
	if len(g.ids) == 0 {
		return nil
	}
	if g.active == 0 {
		return nil
	}
	keys := make([]xlbBeIndexKey, g.active)
	for i := range keys {
		keys[i] = g.indexKey(i)
	}
	if _, err := p.objs.XlbBeIndex.BatchUpdate(keys, g.ids[:g.active], nil); err != nil {
		return fmt.Errorf("write backend index: %w", err)
	}
	return nil
}

// write allocates ids for g and writes its backends, slots and round-robin
// counter. Nothing points at them yet.
//
// reuse (may be nil) returns the id of an existing entry to share for a
// backend, 0 for none.
func (p *Plane) write(g *generation, reuse func(xlbBackend) uint32) error {
	id, err := p.allocSvc()
	if err != nil {
		return err
	}
	g.val.Id = id
	g.ids = make([]uint32, len(g.bes))
	var newIDs []uint32
	var newBes []xlbBackend
	for i := range g.bes {
		if reuse != nil {
			if bid := reuse(g.bes[i]); bid != 0 {
				// Shared: its flags follow once g is in place
				// (syncFlags).
				p.usedBE[bid]++
				g.ids[i] = bid
				continue
			}
		}
		if g.ids[i], err = p.allocBackend(); err != nil {
			p.free(g)
			return err
		}
		newIDs = append(newIDs, g.ids[i])
		newBes = append(newBes, g.bes[i])
	}
	p.bySvc[id] = g
	if err := p.setSvcFlags(g); err != nil {
		p.free(g)
		return err
	}
	if len(newIDs) > 0 {
		if _, err := p.objs.XlbBackends.BatchUpdate(newIDs, newBes, nil); err != nil {
			p.free(g)
			return fmt.Errorf("write backends: %w", err)
		}
		for i, id := range newIDs {
			// A fresh id starts with no active connections.
			if id < maxBackends {
				if err := p.objs.XlbBeActive.Update(id, int64(0), ebpf.UpdateAny); err != nil {
					p.free(g)
					return fmt.Errorf("reset active connections: %w", err)
				}
			}
			if err := p.newBackendStats(id); err != nil {
				p.free(g)
				return err
			}
			if err := p.setFlags(id, newBes[i].Flags); err != nil {
				p.free(g)
				return err
			}
		}
	}
	if err := p.writeIndex(g); err != nil {
		p.free(g)
		return err
	}
	if err := p.writeStateless(g); err != nil {
		p.free(g)
		return err
	}
	if err := p.writeStatic(g); err != nil {
		p.free(g)
		return err
	}
	if len(g.slots) > 0 {
		keys := make([]xlbSlotKey, len(g.slots))
		vals := make([]uint32, len(g.slots))
		for i, b := range g.slots {
			keys[i] = xlbSlotKey{Svc: id, Idx: uint32(i)}
			vals[i] = g.ids[b]
		}
		for i, w := range g.lcWeights {
			keys = append(keys, xlbSlotKey{Svc: id, Idx: lcWeightIdx | uint32(i)})
			vals = append(vals, w)
		}
		if _, err := p.objs.XlbSlots.BatchUpdate(keys, vals, nil); err != nil {
			p.free(g)
			return fmt.Errorf("write slots: %w", err)
		}
	}
	if err := p.objs.XlbRr.Update(id, uint32(0), ebpf.UpdateAny); err != nil {
		p.free(g)
		return fmt.Errorf("reset round-robin counter: %w", err)
	}
	return nil
}

// free deletes g's slots and backends and releases its ids. g must no
// longer be referenced by any service key.
func (p *Plane) free(g *generation) {
	p.freeStateless(g)
	p.freeStatic(g)
	if g.val.Id != 0 {
		for i := range g.slots {
			_ = p.objs.XlbSlots.Delete(xlbSlotKey{Svc: g.val.Id, Idx: uint32(i)})
		}
		for i := range g.lcWeights {
			_ = p.objs.XlbSlots.Delete(xlbSlotKey{Svc: g.val.Id, Idx: lcWeightIdx | uint32(i)})
		}
		delete(p.used, g.val.Id)
		if p.bySvc[g.val.Id] == g {
			delete(p.bySvc, g.val.Id)
		}
	}
	for i, id := range g.ids {
		if id != 0 {
			if g.val.Id != 0 {
				_ = p.objs.XlbBeIndex.Delete(g.indexKey(i))
			}
			if p.unrefBackend(id) {
				_ = p.objs.XlbBackends.Delete(id)
				p.unwatch(id)
				p.dropBackendStats(g.farm, id)
				_ = p.setFlags(id, 0)
			}
		}
	}
}

// reuseFrom shares the ids of old's backends with its successor.
func reuseFrom(old *generation) func(xlbBackend) uint32 {
	if old == nil {
		return nil
	}
	return func(be xlbBackend) uint32 {
		for i, x := range old.bes {
			if sameBackend(x, be) && i < len(old.ids) {
				return old.ids[i]
			}
		}
		return 0
	}
}

// setFlags writes a backend id's flags to xlb_be_flags, with its counter
// slot (ids beyond the array, from an older daemon, have neither).
func (p *Plane) setFlags(id uint32, flags uint8) error {
	if id >= maxBackends {
		return nil
	}
	v := uint32(flags) | p.statSlot[id]<<beSlotShift
	if err := p.objs.XlbBeFlags.Update(id, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write backend flags: %w", err)
	}
	return nil
}

// syncFlags writes the flags of g's backends (a shared backend that went
// down or came back up), once g is the farm's current generation: the
// program then expires, or keeps, their tracked flows.
func (p *Plane) syncFlags(g *generation) {
	for i, id := range g.ids {
		if id == 0 {
			continue
		}
		var be xlbBackend
		if p.objs.XlbBackends.Lookup(id, &be) == nil && be.Flags != g.bes[i].Flags {
			if err := p.objs.XlbBackends.Update(id, g.bes[i], ebpf.UpdateExist); err != nil {
				p.log.Error("write ebpf backend", "farm", g.farm, "err", err)
			}
		}
		if err := p.setFlags(id, g.bes[i].Flags); err != nil {
			p.log.Error("write ebpf backend flags", "farm", g.farm, "err", err)
		}
	}
}

// flip points the service keys from old to cur (either may be nil). Keys of
// old that cur lacks are deleted, unless another farm's generation owns
// them by now. On error the keys are put back as they were.
func (p *Plane) flip(old, cur *generation) error {
	var done []xlbSvcKey
	undo := func() {
		for _, k := range done {
			if old != nil && old.hasKey(k) {
				_ = p.objs.XlbServices.Update(k, p.svcValue(old, k), ebpf.UpdateAny)
			} else {
				_ = p.objs.XlbServices.Delete(k)
			}
		}
	}
	if cur != nil {
		for _, k := range cur.keys {
			if err := p.objs.XlbServices.Update(k, p.svcValue(cur, k), ebpf.UpdateAny); err != nil {
				undo()
				return fmt.Errorf("write service: %w", err)
			}
			done = append(done, k)
		}
	}
	if old != nil {
		for _, k := range old.keys {
			if cur != nil && cur.hasKey(k) {
				continue
			}
			var v xlbSvcVal
			if err := p.objs.XlbServices.Lookup(k, &v); err != nil || v.Id != old.val.Id {
				continue
			}
			if err := p.objs.XlbServices.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				undo()
				return fmt.Errorf("delete service: %w", err)
			}
		}
	}
	return nil
}

func (p *Plane) freePending() {
	for _, g := range p.pending {
		p.free(g)
	}
	p.pending = nil
}
