package engine

import (
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// A farm that listens nowhere (no virtual address and no mark; nftlb keeps
// such farms, e.g. when a farm's backends arrive before its address, or
// after its address was deleted) is kept in the state and on disk, but the
// data plane never sees it: it has nothing to program.

// inKernel returns f if the data plane programs it, else nil.
func inKernel(f *model.Farm) *model.Farm {
	if f == nil || !f.Listens() {
		return nil
	}
	return f
}

// kernelDiff is d as the data plane takes it: farms that listen nowhere
// are absent.
func kernelDiff(d plan.Diff) plan.Diff {
	skip := false
	for _, c := range d.Changes {
		if inKernel(c.Old) != c.Old || inKernel(c.New) != c.New {
			skip = true
			break
		}
	}
	if !skip {
		return d
	}
	out := plan.Diff{Changes: make([]plan.FarmChange, 0, len(d.Changes))}
	for _, c := range d.Changes {
		if k := (plan.FarmChange{Old: inKernel(c.Old), New: inKernel(c.New)}); k.Old != nil || k.New != nil {
			out.Changes = append(out.Changes, k)
		}
	}
	return out
}

// kernelFarms returns the farms the data plane programs.
func kernelFarms(farms []*model.Farm) []*model.Farm {
	out := farms[:0:0]
	for _, f := range farms {
		if f.Listens() {
			out = append(out, f)
		}
	}
	return out
}
