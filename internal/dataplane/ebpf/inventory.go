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
// per VIP, protocol and port of a farm; the named tables' slots in
// xlb_tbl_addr4/6 (two LPM tries each, xt4_<slot> and xt6_<slot>, held by
// those maps only; table ids bound to them in xlb_tbl_meta), those of
// number, mac and flow tables in xlb_tbl_hash, and the farms' policy keys
// in xlb_tbl_policy.
func (p *Plane) KernelObjects(ctx context.Context) ([]string, error) {
	var out []string
	n, err := countKeys(p.objs.XlbServices)
	if err != nil {
		return nil, fmt.Errorf("count the services pinned in %s: %w", p.opts.PinPath, err)
	}
	if n > 0 {
		out = append(out, fmt.Sprintf("map xlb_services pinned in %s: %d services (VIP, protocol, port)", p.opts.PinPath, n))
	}
	idxs, err := placedIndices(p.objs.XlbTblAddr4)
	if err != nil {
		return nil, fmt.Errorf("count the tables pinned in %s: %w", p.opts.PinPath, err)
	}
	if len(idxs) > 0 {
		out = append(out, fmt.Sprintf("maps xlb_tbl_addr4/6 pinned in %s: %d named tables' slots (LPM tries xt4_<slot>, xt6_<slot>; bound to table ids in xlb_tbl_meta)", p.opts.PinPath, len(idxs)))
	}
	if idxs, err = placedIndices(p.objs.XlbTblHash); err != nil {
		return nil, fmt.Errorf("count the tables pinned in %s: %w", p.opts.PinPath, err)
	}
	if len(idxs) > 0 {
		out = append(out, fmt.Sprintf("map xlb_tbl_hash pinned in %s: %d named tables' slots (hashes xh_<slot> of number, mac and flow tables; bound to table ids in xlb_tbl_meta)", p.opts.PinPath, len(idxs)))
	}
	n, err = countKeys(p.objs.XlbTblPolicy)
	if err != nil {
		return nil, fmt.Errorf("count the policies pinned in %s: %w", p.opts.PinPath, err)
	}
	if n > 0 {
		out = append(out, fmt.Sprintf("map xlb_tbl_policy pinned in %s: %d farm keys with policies", p.opts.PinPath, n))
	}
	return out, nil
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
