package plan

import (
	"slices"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestFarmLogPrefixes: nftlb 1.0.7's prefixes of a farm's log lines, as
// test/nftlb reads them in its ruleset: "IN-f " and "FWD-f " by default,
// "X-log-IN-f " for "X-KNAME-TYPE-FNAME ".
func TestFarmLogPrefixes(t *testing.T) {
	for _, c := range []struct {
		log    model.LogHook
		prefix string
		want   []string
	}{
		{model.LogInput, "", []string{"IN-f "}},
		{model.LogForward, "", []string{"FWD-f "}},
		{model.LogInput | model.LogForward | model.LogOutput, "", []string{"IN-f ", "FWD-f ", "OUT-f "}},
		{model.LogInput | model.LogForward, "X-KNAME-TYPE-FNAME ", []string{"X-log-IN-f ", "X-log-FWD-f "}},
		{model.LogInput, "plain", []string{"plain"}},
		{0, "", nil},
	} {
		f := &model.Farm{Name: "f", Log: c.log, LogPrefix: c.prefix}
		if got := FarmLogPrefixes(f); !slices.Equal(got, c.want) {
			t.Errorf("log %v prefix %q: %q, want %q", c.log, c.prefix, got, c.want)
		}
	}
	long := &model.Farm{Name: strings.Repeat("n", 64), Log: model.LogInput, LogPrefix: "FNAME-FNAME-FNAME"}
	if got := FarmLogPrefixes(long)[0]; len(got) != MaxLogPrefix {
		t.Errorf("a long expansion is %d bytes, want it cut to %d", len(got), MaxLogPrefix)
	}
}
