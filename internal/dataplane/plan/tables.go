package plan

import (
	"cmp"
	"slices"

	"github.com/xlb-lb/xlb/internal/model"
)

// PolicyOrder is a farm's policy tables in the order both planes check
// them: by the tables' priority, then name (policies naming no table of
// tables left out).
func PolicyOrder(f *model.Farm, tables map[string]*model.Table) []*model.Table {
	var out []*model.Table
	for _, p := range f.Policies {
		if tb, ok := tables[p.Name]; ok {
			out = append(out, tb)
		}
	}
	slices.SortStableFunc(out, func(x, y *model.Table) int {
		if c := cmp.Compare(x.Priority, y.Priority); c != 0 {
			return c
		}
		return cmp.Compare(x.Name, y.Name)
	})
	return out
}

// TableChange is one table's change. Old is nil for a created table, New is
// nil for a destroyed one. Old.Slot != New.Slot is a swap: the table is
// bound to another slot, whose entries do not change.
type TableChange struct {
	Old, New *model.Table
}

// SlotChange is a change of one slot's entries. Old is the table that held
// the slot before (nil: the slot is new and takes every entry of New), New
// the one that holds it after (nil: the slot is freed with its entries).
// When both are set, Put lists the entries added or whose value changed
// (their new versions), Replaced the old versions of those that existed,
// and Del the entries removed.
type SlotChange struct {
	Slot          uint32
	Old, New      *model.Table
	Put, Replaced []model.TableEntry
	Del           []model.TableEntry
}

// Entries reports how many entries the change writes or removes in the
// kernel.
func (c SlotChange) Entries() int {
	switch {
	case c.Old == nil && c.New != nil:
		return c.New.Len()
	case c.New == nil && c.Old != nil:
		return c.Old.Len()
	}
	return len(c.Put) + len(c.Del)
}

// Added lists the entries of Put that are new to the slot (not the new
// versions of replaced ones): what taking the change back removes.
func (c SlotChange) Added() []model.TableEntry {
	replaced := make(map[model.TableKey]bool, len(c.Replaced))
	for _, e := range c.Replaced {
		replaced[e.Key] = true
	}
	var added []model.TableEntry
	for _, e := range c.Put {
		if !replaced[e.Key] {
			added = append(added, e)
		}
	}
	return added
}

// TableDiff is what one engine change does to tables, and the farm changes
// of the same engine change that concern policies (Old or New attaches
// one), so a plane can update how farms use tables in the same kernel
// transaction.
type TableDiff struct {
	Tables []TableChange
	Slots  []SlotChange
	Farms  []FarmChange
	// Addresses are the address objects no farm uses (nftlb's POST
	// /addresses before a farm names one) that the change creates, changes
	// or removes. They program nothing in the kernel (nftlb programs
	// nothing for them either): only the store keeps them, with the
	// change's tables, so they are saved, journaled and undone alike.
	Addresses []AddressChange
}

// AddressChange is one unused address object's change: Old nil for a
// created one, New nil for a removed one (deleted, or now kept by the farm
// that names it).
type AddressChange struct {
	Old, New *model.Address
}

// Empty reports whether the diff changes nothing in the kernel (its
// Addresses are not there).
func (d TableDiff) Empty() bool {
	return len(d.Tables) == 0 && len(d.Slots) == 0 && len(d.Farms) == 0
}

// Inverse returns the diff that undoes d (used to roll back).
func (d TableDiff) Inverse() TableDiff {
	inv := TableDiff{
		Tables: make([]TableChange, len(d.Tables)),
		Slots:  make([]SlotChange, len(d.Slots)),
		Farms:  Diff{Changes: d.Farms}.Inverse().Changes,
	}
	for i := len(d.Addresses) - 1; i >= 0; i-- {
		inv.Addresses = append(inv.Addresses, AddressChange{Old: d.Addresses[i].New, New: d.Addresses[i].Old})
	}
	for i, c := range d.Tables {
		inv.Tables[len(d.Tables)-1-i] = TableChange{Old: c.New, New: c.Old}
	}
	for i, c := range d.Slots {
		ic := SlotChange{Slot: c.Slot, Old: c.New, New: c.Old}
		if c.Old != nil && c.New != nil {
			replaced := make(map[model.TableKey]bool, len(c.Replaced))
			for _, e := range c.Replaced {
				replaced[e.Key] = true
			}
			ic.Put = append(append([]model.TableEntry(nil), c.Del...), c.Replaced...)
			ic.Replaced = c.Put[:0:0]
			for _, e := range c.Put {
				if replaced[e.Key] {
					ic.Replaced = append(ic.Replaced, e)
				} else {
					ic.Del = append(ic.Del, e)
				}
			}
		}
		inv.Slots[len(d.Slots)-1-i] = ic
	}
	return inv
}
