package plan

import "github.com/xlb-lb/xlb/internal/model"

// FarmChange is one farm's change. Old is nil for an added farm, New is nil
// for a deleted one; both set is an update. Farms are immutable.
type FarmChange struct {
	Old, New *model.Farm
}

// Name is the name of the farm the change is about (New's, else Old's).
func (c FarmChange) Name() string {
	switch {
	case c.New != nil:
		return c.New.Name
	case c.Old != nil:
		return c.Old.Name
	}
	return ""
}

// Diff is an ordered set of farm changes made together: the data plane
// applies it to the kernel as one transaction, the store commits it to
// disk as one record.
type Diff struct {
	Changes []FarmChange
}

// Empty reports whether the diff changes nothing.
func (d Diff) Empty() bool { return len(d.Changes) == 0 }

// Inverse returns the diff that undoes d (used to roll back).
func (d Diff) Inverse() Diff {
	inv := Diff{Changes: make([]FarmChange, len(d.Changes))}
	for i, c := range d.Changes {
		inv.Changes[len(d.Changes)-1-i] = FarmChange{Old: c.New, New: c.Old}
	}
	return inv
}

// NewFarms returns the farms the diff adds or updates, in its order.
func (d Diff) NewFarms() []*model.Farm {
	var out []*model.Farm
	for _, c := range d.Changes {
		if c.New != nil {
			out = append(out, c.New)
		}
	}
	return out
}
