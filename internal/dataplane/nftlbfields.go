package dataplane

import "github.com/xlb-lb/xlb/internal/model"

// CheckNftlbFields refuses the nftlb 1.0 fields and values that no data
// plane implements yet (model.Farm.NftlbFieldInUse): a farm that uses one
// gets an error naming the field, its value and the plane. Each plane's
// Check calls it first; a plane that implements one of them checks that
// field itself instead.
func CheckNftlbFields(plane string, f *model.Farm) error {
	if field, value, ok := f.NftlbFieldInUse(); ok {
		return Unsupported(plane, f, field, value)
	}
	return nil
}
