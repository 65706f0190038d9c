package fake

import (
	"context"
	"slices"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

var _ dataplane.KernelInventory = (*Plane)(nil)

// KernelObjects implements dataplane.KernelInventory: the farms the fake
// kernel holds, one line each.
func (p *Plane) KernelObjects(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for name := range p.farms {
		out = append(out, "farm "+name)
	}
	slices.Sort(out)
	return out, nil
}
