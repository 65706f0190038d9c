package dataplane

import "github.com/xlb-lb/xlb/internal/model"

// CheckNftlbFields refuses the nftlb 1.0 fields and values that the plane
// does not implement (model.Farm.NftlbFieldInUse): a farm that uses one
// gets an error naming the field, its value and the plane. Each plane's
// Check calls it first, naming the fields it implements (and checks
// itself) in implemented.
func CheckNftlbFields(plane string, f *model.Farm, implemented ...string) error {
	if field, value, ok := f.NftlbFieldInUse(implemented...); ok {
		return Unsupported(plane, f, field, value)
	}
	return nil
}
