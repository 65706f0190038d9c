package ebpf

import (
	"context"
	"fmt"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
)

// Apply applies the diff: for each changed farm a new generation is
// written, then its service keys flip to it. If any step fails, the farms
// already changed by this diff are flipped back, so either all of the diff
// takes effect or none of it does.
func (p *Plane) Apply(ctx context.Context, d plan.Diff) error {
	d = plan.SplitDiff(d) // a dual farm is its two halves
	p.mu.Lock()
	defer p.mu.Unlock()
	p.srcMemo = sourceCache{}
	defer func() { p.srcMemo = nil }()
	p.freePending()
	type step struct {
		oldName  string
		old, cur *generation
		newName  string
	}
	var steps []step
	rollback := func() {
		for i := len(steps) - 1; i >= 0; i-- {
			s := steps[i]
			if err := p.flip(s.cur, s.old); err != nil {
				p.log.Error("roll back ebpf service flip", "farm", s.newName, "err", err)
			}
			if s.newName != "" {
				p.dropFarm(s.newName)
			}
			if s.old != nil {
				p.setFarm(s.oldName, s.old)
				// Its static sessions, which s.cur's may have
				// overwritten (the same keys).
				if err := p.writeStatic(s.old); err != nil {
					p.log.Error("roll back ebpf static sessions", "farm", s.oldName, "err", err)
				}
			}
			if s.cur != nil {
				p.pending = append(p.pending, s.cur)
			}
		}
	}
	for _, c := range d.Changes {
		if err := ctx.Err(); err != nil {
			rollback()
			return err
		}
		var s step
		if c.Old != nil {
			s.oldName = c.Old.Name
			s.old = p.farms[c.Old.Name]
		}
		if c.New != nil {
			s.newName = c.New.Name
			g, err := p.plan(c.New)
			if err != nil {
				rollback()
				return err
			}
			if g != nil {
				if err := p.write(g, reuseFrom(s.old)); err != nil {
					rollback()
					return fmt.Errorf("farm %q: %w", c.New.Name, err)
				}
			}
			s.cur = g
		}
		if err := p.flip(s.old, s.cur); err != nil {
			if s.cur != nil {
				p.free(s.cur)
			}
			rollback()
			return fmt.Errorf("farm %q: %w", s.newName+s.oldName, err)
		}
		if s.oldName != "" {
			p.dropFarm(s.oldName)
		}
		if s.cur != nil {
			p.setFarm(s.newName, s.cur)
		}
		steps = append(steps, s)
	}
	for _, s := range steps {
		if s.cur != nil {
			p.syncFlags(s.cur)
		}
		if s.old != nil || s.cur != nil {
			p.syncPassive(s.old, s.cur)
		}
		if s.old != nil {
			p.pending = append(p.pending, s.old)
		}
		if s.oldName != "" && s.oldName != s.newName {
			delete(p.carry, s.oldName) // deleted (or renamed): its counts go
			p.farmIDs.freeFarmID(s.oldName)
		}
	}
	return nil
}
