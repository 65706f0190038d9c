package nft

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

var _ dataplane.KernelInventory = (*Plane)(nil)

// KernelObjects implements dataplane.KernelInventory: xlb's tables (of
// any --nft-tables layout) whose sets and maps hold elements. Every farm
// puts elements into them (service and backend maps); a table without
// farms holds none.
func (s *Plane) KernelObjects(ctx context.Context) ([]string, error) {
	return kernelObjects(s.opts.NetNS, s.opts.Table)
}

func kernelObjects(ns netns.NsHandle, prefix string) ([]string, error) {
	opts := []nftables.ConnOption{}
	if ns.IsOpen() {
		opts = append(opts, nftables.WithNetNSFd(int(ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nftables: %w", err)
	}
	defer c.CloseLasting()
	var out []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyNetdev} {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		for _, t := range tables {
			if !isLayoutTable(prefix, t.Name) {
				continue
			}
			sets, err := c.GetSets(t)
			if err != nil {
				return nil, fmt.Errorf("list sets of table %s %s: %w", familyName(fam), t.Name, err)
			}
			n := 0
			for _, s := range sets {
				elems, err := c.GetSetElements(s)
				if err != nil {
					return nil, fmt.Errorf("list elements of %s in table %s %s: %w", s.Name, familyName(fam), t.Name, err)
				}
				n += len(elems)
			}
			if n > 0 {
				out = append(out, fmt.Sprintf("table %s %s: %d set and map elements", familyName(fam), t.Name, n))
			}
		}
	}
	return out, nil
}
