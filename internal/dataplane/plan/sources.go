package plan

import (
	"cmp"
	"slices"

	"github.com/xlb-lb/xlb/internal/model"
)

// SourceOrder sorts farms chosen by source table (model.Farm.SourceTable)
// that share a VIP, protocol and port into the order a data plane tries
// their tables: the tables' priority, then the farms' names. The first
// whose table holds the client serves it; the key's farm without a source
// table (the default) serves the rest. Farms whose table is not in tables
// are left out. One order for both planes (docs/tables.md).
func SourceOrder(farms []*model.Farm, tables map[string]*model.Table) []*model.Farm {
	out := make([]*model.Farm, 0, len(farms))
	for _, f := range farms {
		if t, ok := tables[f.SourceTable]; ok && f.SourceTable != "" && t.Type == model.TableAddr {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b *model.Farm) int {
		if c := cmp.Compare(tables[a.SourceTable].Priority, tables[b.SourceTable].Priority); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}
