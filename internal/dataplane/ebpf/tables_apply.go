package ebpf

import (
	"context"
	"fmt"
	"maps"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// ApplyTables implements dataplane.TablePlane. The order keeps every
// packet's view whole: new slots are filled before anything is bound to
// them, tables are bound before farms use them, farms let go of tables
// before they are unbound, and slots are freed last. If a step fails, the
// steps before it are taken back.
func (p *Plane) ApplyTables(ctx context.Context, d plan.TableDiff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &p.tbls
	var undo []func()
	refs := false // services' values lost their stamp: written again at the end
	fail := func(err error) error {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		if gerr := p.bumpGen(); gerr != nil {
			p.log.Error("move the policy generation on after a failed change", "err", gerr)
		}
		if refs {
			if rerr := p.restampServices(); rerr != nil {
				p.log.Error("write services' policies after a failed change", "err", rerr)
			}
		}
		return err
	}
	tables := maps.Clone(t.tables)
	for _, c := range d.Tables {
		if c.Old != nil {
			delete(tables, c.Old.Name)
		}
		if c.New != nil {
			tables[c.New.Name] = c.New
		}
	}
	// 0. Farms' uses of tables the program cannot honour: refused before
	// anything changes.
	for _, c := range d.Farms {
		if c.New == nil {
			continue
		}
		for _, ref := range c.New.Policies {
			if tb, ok := tables[ref.Name]; ok {
				if err := checkTableUse(c.New, tb); err != nil {
					return err
				}
			}
		}
	}
	tables = maps.Clone(t.tables)
	// 1. Slots: new ones made and filled, changed ones given the
	// difference.
	for _, c := range d.Slots {
		switch {
		case c.Old == nil && c.New != nil:
			if hasHash(c.New) {
				hs, err := p.fillHashSlot(c.New)
				if err != nil {
					return fail(err)
				}
				slot := c.Slot
				t.hslots[slot] = hs
				undo = append(undo, func() { p.freeHashSlot(hs); delete(t.hslots, slot) })
				continue
			}
			if c.New.Type != model.TableAddr {
				continue
			}
			s, err := p.newSlot(c.Slot)
			if err != nil {
				return fail(err)
			}
			if err := p.putEntries(s, func(fn func(model.TableEntry) bool) { c.New.Entries("", fn) }, false); err != nil {
				p.freeSlot(s)
				return fail(fmt.Errorf("table %q: %w", c.New.Name, err))
			}
			slot := c.Slot
			t.slots[slot] = s
			undo = append(undo, func() { p.freeSlot(s); delete(t.slots, slot) })
		case c.New == nil:
		default:
			if hs := t.hslots[c.Slot]; hs != nil {
				if err := p.changeHash(hs, c); err != nil {
					p.undoHash(hs, c)
					return fail(fmt.Errorf("table %q: %w", c.New.Name, err))
				}
				undo = append(undo, func() { p.undoHash(hs, c) })
				continue
			}
			s := t.slots[c.Slot]
			if s == nil {
				continue
			}
			if err := p.changeEntries(s, c); err != nil {
				p.undoEntries(s, c)
				return fail(fmt.Errorf("table %q: %w", c.New.Name, err))
			}
			undo = append(undo, func() { p.undoEntries(s, c) })
		}
	}
	// 2. Tables created, changed or swapped: bound to their slot, all in
	// one batch (a swap's two tables at once).
	var ids []uint32
	var binds, prev []xlbTblBind
	for _, c := range d.Tables {
		if c.Old != nil {
			delete(tables, c.Old.Name)
		}
		if c.New == nil {
			continue
		}
		tables[c.New.Name] = c.New
		if !p.bound(c.New) {
			return fail(fmt.Errorf("table %q: slot %d has no kernel map", c.New.Name, c.New.Slot))
		}
		ids = append(ids, uint32(c.New.ID))
		binds = append(binds, p.binding(c.New))
		if c.Old != nil && c.Old.ID == c.New.ID {
			prev = append(prev, p.binding(c.Old))
		} else {
			prev = append(prev, xlbTblBind{})
		}
	}
	if err := p.bind(ids, binds); err != nil {
		_ = p.bind(ids, prev)
		return fail(err)
	}
	undo = append(undo, func() { _ = p.bind(ids, prev) })
	// 3. Farms: their policy keys, and those of farms whose tables'
	// order changed.
	farms := maps.Clone(t.farms)
	rewrite := map[string]bool{}
	for _, c := range d.Tables {
		if c.Old != nil && c.New != nil && c.Old.Priority != c.New.Priority {
			for name, f := range farms {
				if f.UsesPolicy(c.New.Name) {
					rewrite[name] = true
				}
			}
		}
	}
	for _, c := range d.Farms {
		if c.Old != nil && len(c.Old.Policies) > 0 {
			delete(farms, c.Old.Name)
			delete(rewrite, c.Old.Name)
		}
		if c.New != nil && len(c.New.Policies) > 0 {
			farms[c.New.Name] = c.New
			rewrite[c.New.Name] = true
		}
	}
	oldFarms, oldTables := t.farms, t.tables
	var touched []svcRef // the services whose stamp this change took
	all := false         // or every service's
	if p.refsMoved(d, tables) {
		// The policy ids of the services these farms' keys answer for
		// are not trusted while the farms' policies change
		// (tables_svcrefs.go); every other service's stay true.
		pks := map[xlbSvcKey]bool{}
		add := func(f *model.Farm) {
			if f != nil && len(f.Policies) > 0 {
				for _, k := range policyKeys(f) {
					pks[k] = true
				}
			}
		}
		for _, c := range d.Farms {
			add(c.Old)
			add(c.New)
		}
		for name := range rewrite {
			add(farms[name])
			add(t.farms[name])
		}
		refs = true
		if t.refs == 0 {
			// No refs generation yet (ReconcileTables not run): every
			// service's value is written without a stamp, then again
			// under the first generation at the end.
			if err := p.startRefs(); err != nil {
				return fail(err)
			}
			all = true
		} else {
			touched = p.refsTouched(pks)
			if err := p.unstampServices(touched); err != nil {
				return fail(err)
			}
		}
	}
	restoreFarms := func() {
		for _, c := range d.Farms {
			if c.New != nil && len(c.New.Policies) > 0 {
				_ = p.writeFarmPolicies(c.New, tables, true)
			}
		}
		for _, f := range oldFarms {
			_ = p.writeFarmPolicies(f, oldTables, false)
		}
		t.farms = oldFarms
		_ = p.writeConf()
	}
	for _, c := range d.Farms {
		if c.Old != nil && len(c.Old.Policies) > 0 {
			if err := p.writeFarmPolicies(c.Old, t.tables, true); err != nil {
				restoreFarms()
				return fail(err)
			}
		}
	}
	for name := range rewrite {
		if err := p.writeFarmPolicies(farms[name], tables, false); err != nil {
			restoreFarms()
			return fail(err)
		}
	}
	t.farms = farms
	undoSources, err := p.applySources(d.Farms, tables)
	if err != nil {
		restoreFarms()
		return fail(err)
	}
	if err := p.writeConf(); err != nil {
		undoSources()
		restoreFarms()
		return fail(err)
	}
	// 4. Tables destroyed: unbound. 5. Slots freed.
	ids, binds = nil, nil
	for _, c := range d.Tables {
		if c.New == nil {
			ids = append(ids, uint32(c.Old.ID))
			binds = append(binds, xlbTblBind{})
		}
	}
	if err := p.bind(ids, binds); err != nil {
		p.log.Error("unbind destroyed tables", "err", err)
	}
	for _, c := range d.Slots {
		if c.New == nil {
			if s := t.slots[c.Slot]; s != nil {
				p.freeSlot(s)
				delete(t.slots, c.Slot)
			}
			if hs := t.hslots[c.Slot]; hs != nil {
				p.freeHashSlot(hs)
				delete(t.hslots, c.Slot)
			}
		}
	}
	t.tables = tables
	if err := p.bumpGen(); err != nil {
		return err
	}
	if all {
		if err := p.restampServices(); err != nil {
			return err
		}
	} else if refs {
		if err := p.stampServices(touched); err != nil {
			return err
		}
	}
	for _, c := range d.Tables {
		if c.Old != nil && t.byID[c.Old.ID] == c.Old {
			delete(t.byID, c.Old.ID)
		}
	}
	for _, c := range d.Tables {
		if c.New != nil {
			t.byID[c.New.ID] = c.New
		}
	}
	return nil
}

// changeEntries applies a slot change's entries: values replaced (counters
// kept), entries added, entries removed.
func (p *Plane) changeEntries(s *tblSlot, c plan.SlotChange) error {
	replaced := make(map[model.TableKey]bool, len(c.Replaced))
	for _, e := range c.Replaced {
		replaced[e.Key] = true
	}
	for _, keep := range []bool{false, true} {
		if err := p.putEntries(s, func(fn func(model.TableEntry) bool) {
			for _, e := range c.Put {
				if replaced[e.Key] == keep && !fn(e) {
					return
				}
			}
		}, keep); err != nil {
			return err
		}
	}
	return p.delEntries(s, c.Del)
}

// undoEntries takes back changeEntries (as far as it went): added entries
// removed, removed and replaced ones written back.
func (p *Plane) undoEntries(s *tblSlot, c plan.SlotChange) {
	added := c.Added()
	_ = p.delEntries(s, added)
	back := append(append([]model.TableEntry(nil), c.Del...), c.Replaced...)
	if err := p.putEntries(s, func(fn func(model.TableEntry) bool) {
		for _, e := range back {
			if !fn(e) {
				return
			}
		}
	}, true); err != nil {
		p.log.Error("taking back table entries failed", "err", err)
	}
}

// changeHash applies a slot change's entries to a hash: values replaced
// (counters kept), entries added, entries removed.
func (p *Plane) changeHash(s *hSlot, c plan.SlotChange) error {
	if c.New.Type == model.TableIface {
		return p.syncIfaceNow(s, c.New)
	}
	replaced := make(map[model.TableKey]bool, len(c.Replaced))
	for _, e := range c.Replaced {
		replaced[e.Key] = true
	}
	var added, changed []model.TableEntry
	for _, e := range c.Put {
		if replaced[e.Key] {
			changed = append(changed, e)
		} else {
			added = append(added, e)
		}
	}
	if err := p.putHash(s, c.New, added, false); err != nil {
		return err
	}
	if err := p.putHash(s, c.New, changed, true); err != nil {
		return err
	}
	return p.delHash(s, c.New, c.Del)
}

// undoHash takes back changeHash (as far as it went).
func (p *Plane) undoHash(s *hSlot, c plan.SlotChange) {
	if c.Old.Type == model.TableIface {
		if err := p.syncIfaceNow(s, c.Old); err != nil {
			p.log.Error("taking back table entries failed", "err", err)
		}
		return
	}
	added := c.Added()
	_ = p.delHash(s, c.Old, added)
	back := append(append([]model.TableEntry(nil), c.Del...), c.Replaced...)
	if err := p.putHash(s, c.Old, back, true); err != nil {
		p.log.Error("taking back table entries failed", "err", err)
	}
}
