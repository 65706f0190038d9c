package nft

import (
	"fmt"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestSourceMarks: a farm's tag is in xlb's mark range; two farms whose
// names give the same tag are refused with an error naming both; firewall-
// mark farms may not use the range.
func TestSourceMarks(t *testing.T) {
	seen := map[uint32]string{}
	var a, b string
	for i := 0; a == ""; i++ {
		name := fmt.Sprintf("f%d", i)
		m := sourceMark(name)
		if m&sourceMarkMask != sourceMarkBase {
			t.Fatalf("tag 0x%x of %q outside 0x786d0000-0x786dffff", m, name)
		}
		if o, ok := seen[m]; ok {
			a, b = o, name
		}
		seen[m] = name
	}
	farms := map[string]*model.Farm{}
	for _, n := range []string{a, b} {
		f := model.NewFarm(n)
		f.SourceTable = "src"
		farms[n] = &f
	}
	err := sourceMarksFree(farms)
	if err == nil || !strings.Contains(err.Error(), "rename one of them") || !strings.Contains(err.Error(), a) {
		t.Errorf("colliding tags of %q and %q: %v", a, b, err)
	}
	delete(farms, b)
	if err := sourceMarksFree(farms); err != nil {
		t.Errorf("one farm: %v", err)
	}
	fw := model.NewFarm("fw")
	fw.Mark = sourceMarkBase | 7
	if err := checkSource(&fw); err == nil || !strings.Contains(err.Error(), "0x786d0007") {
		t.Errorf("firewall-mark farm in xlb's range: %v", err)
	}
}
