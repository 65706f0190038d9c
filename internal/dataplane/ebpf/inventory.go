package ebpf

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

var _ dataplane.KernelInventory = (*Plane)(nil)

// KernelObjects implements dataplane.KernelInventory: the services
// pinned under the pin path (xlb_services, adopted at start), one key
// per VIP, protocol and port of a farm.
func (p *Plane) KernelObjects(ctx context.Context) ([]string, error) {
	n, err := countKeys(p.objs.XlbServices)
	if err != nil {
		return nil, fmt.Errorf("count the services pinned in %s: %w", p.opts.PinPath, err)
	}
	if n == 0 {
		return nil, nil
	}
	return []string{fmt.Sprintf("map xlb_services pinned in %s: %d services (VIP, protocol, port)", p.opts.PinPath, n)}, nil
}

func countKeys(m *ebpf.Map) (int, error) {
	var (
		key  = make([]byte, m.KeySize())
		next = make([]byte, m.KeySize())
		n    int
	)
	k := any(nil)
	for {
		if err := m.NextKey(k, next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return n, nil
			}
			return n, err
		}
		n++
		copy(key, next)
		k = key
	}
}
