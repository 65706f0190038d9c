package fake

import (
	"context"
	"fmt"
	"maps"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// tableKernel is what the fake keeps of tables, as a kernel would: slots of
// entries, the slot each table is bound to, and the policies of farms.
type tableKernel struct {
	slots    map[uint32]map[model.TableKey]model.TableEntry
	bindings map[string]uint32 // table name -> slot
	policies map[string][]string
	// slotWrites counts entries written or removed, so tests can check a
	// change cost O(changed) (a swap writes none).
	slotWrites int
}

var _ dataplane.TablePlane = (*Plane)(nil)

func (p *Plane) tk() *tableKernel {
	if p.tables == nil {
		p.tables = &tableKernel{slots: map[uint32]map[model.TableKey]model.TableEntry{}, bindings: map[string]uint32{}, policies: map[string][]string{}}
	}
	return p.tables
}

// CheckTable implements dataplane.TablePlane.
func (p *Plane) CheckTable(t *model.Table) error { return nil }

// ApplyTables implements dataplane.TablePlane.
func (p *Plane) ApplyTables(ctx context.Context, d plan.TableDiff) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.FailTables != nil {
		if err := p.FailTables(d); err != nil {
			return err
		}
	}
	k := p.tk()
	// Check first, so a refused diff changes nothing (one transaction).
	for _, c := range d.Slots {
		_, exists := k.slots[c.Slot]
		if c.Old == nil && exists || c.Old != nil && !exists {
			return fmt.Errorf("fake: slot %d: exists %v, diff says %v", c.Slot, exists, c.Old != nil)
		}
	}
	for _, c := range d.Slots {
		switch {
		case c.New == nil:
			k.slotWrites += len(k.slots[c.Slot])
			delete(k.slots, c.Slot)
		case c.Old == nil:
			m := map[model.TableKey]model.TableEntry{}
			c.New.Entries("", func(e model.TableEntry) bool { m[e.Key] = e; return true })
			k.slots[c.Slot] = m
			k.slotWrites += len(m)
		default:
			m := k.slots[c.Slot]
			for _, e := range c.Del {
				delete(m, e.Key)
			}
			for _, e := range c.Put {
				m[e.Key] = e
			}
			k.slotWrites += len(c.Put) + len(c.Del)
		}
	}
	for _, c := range d.Tables {
		if c.Old != nil {
			delete(k.bindings, c.Old.Name)
		}
		if c.New != nil {
			k.bindings[c.New.Name] = c.New.Slot
		}
	}
	for _, c := range d.Farms {
		if c.Old != nil {
			delete(k.policies, c.Old.Name)
		}
		if c.New != nil && len(c.New.Policies) > 0 {
			k.policies[c.New.Name] = policyNames(c.New)
		}
	}
	return nil
}

func policyNames(f *model.Farm) []string {
	var out []string
	for _, p := range f.Policies {
		out = append(out, p.Name)
	}
	return out
}

// ReconcileTables implements dataplane.TablePlane.
func (p *Plane) ReconcileTables(ctx context.Context, tables []*model.Table, farms []*model.Farm) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tables = nil
	k := p.tk()
	for _, t := range tables {
		m := map[model.TableKey]model.TableEntry{}
		t.Entries("", func(e model.TableEntry) bool { m[e.Key] = e; return true })
		k.slots[t.Slot] = m
		k.bindings[t.Name] = t.Slot
	}
	for _, f := range farms {
		k.policies[f.Name] = policyNames(f)
	}
	return nil
}

// TableEntries returns the entries the table named name is bound to, by
// key as text, with their values as text.
func (p *Plane) TableEntries(t *model.Table) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.tk()
	slot, ok := k.bindings[t.Name]
	if !ok {
		return nil
	}
	out := map[string]string{}
	for key, e := range k.slots[slot] {
		out[t.FormatKey(key)] = t.FormatValue(e.Value)
	}
	return out
}

// TableSlot returns the slot a table is bound to.
func (p *Plane) TableSlot(name string) (uint32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.tk().bindings[name]
	return s, ok
}

// SlotWrites counts the entries written to or removed from slots.
func (p *Plane) SlotWrites() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tk().slotWrites
}

// Policies returns the farms' attached policies as the plane holds them.
func (p *Plane) Policies() map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.tk().policies)
}
