package engine

import (
	"slices"
	"strings"

	"github.com/xlb-lb/xlb/internal/model"
)

// Farms returns every farm as the transaction leaves them so far, ordered
// by name (changed farms included, deleted ones left out).
func (tx *Txn) Farms() []*model.Farm {
	var out []*model.Farm
	if !tx.replace {
		for _, f := range tx.base.Farms() {
			if _, changed := tx.farms[f.Name]; !changed {
				out = append(out, f)
			}
		}
	}
	for _, f := range tx.farms {
		if f != nil {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b *model.Farm) int { return strings.Compare(a.Name, b.Name) })
	return out
}
