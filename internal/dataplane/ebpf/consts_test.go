package ebpf

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
)

// TestConsts: the program's constants come from bpf2go (consts.go); what is
// still written twice is checked here. statNames must follow enum xlb_stat
// of the object's BTF, and the maglev flow hash's seed must be plan's, or
// the two planes would disagree (plan.FlowSlot).
func TestConsts(t *testing.T) {
	spec, err := loadXlb()
	if err != nil {
		t.Fatal(err)
	}
	var stat *btf.Enum
	if err := spec.Types.TypeByName("xlb_stat", &stat); err != nil {
		t.Fatalf("enum xlb_stat in the object's BTF: %v", err)
	}
	var names []string
	for _, v := range stat.Values {
		if n := strings.TrimPrefix(v.Name, "XLB_STAT_"); n != "MAX" {
			names = append(names, strings.ToLower(n))
		}
	}
	if strings.Join(names, ",") != strings.Join(statNames, ",") {
		t.Errorf("enum xlb_stat %v, statNames %v", names, statNames)
	}
	if hashSeed != plan.FlowSeed {
		t.Errorf("XLB_HASH_SEED %#x, plan.FlowSeed %#x", hashSeed, plan.FlowSeed)
	}
}
