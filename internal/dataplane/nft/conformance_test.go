package nft

import (
	"context"
	"fmt"
	"regexp"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// nftRefuses is what the nft plane refuses; keep it in step with Check and
// docs/dataplane-nft.md.
var nftRefuses = map[string]string{
	"sched-lc": `"scheduler" value "lc"`,
	// Policies are checked at prerouting, which stlsdnat bypasses.
	"policy-blacklist-stlsdnat": `mode stlsdnat bypasses`,
}

// TestConformance runs the data-plane conformance suite against nft, in
// one table and spread over 3 tables (the daemon's default is sharded).
func TestConformance(t *testing.T) {
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("tables=%d", shards), func(t *testing.T) {
			t.Parallel()
			conformanceRun(t, shards)
		})
	}
}

func conformanceRun(t *testing.T, shards int) {
	conformance.Run(t, conformance.Plane{
		Name: PlaneName,
		Open: func(t testing.TB, path string) dataplane.Dataplane {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				t.Fatalf("open namespace %s: %v", path, err)
			}
			t.Cleanup(func() { ns.Close() })
			p, err := New(context.Background(), testLogger(), Options{NetNS: ns, LogGroup: conformance.LogGroup, Shards: shards})
			if err != nil {
				t.Fatalf("new nft plane: %v", err)
			}
			return p
		},
		Snapshot: func(t testing.TB, path string) string {
			// Counter values and timers move with the baseline farm's
			// own traffic (a late FIN or retransmission between the two
			// snapshots), not with a change: they are left out.
			rs := testutil.Run(t, path[len("/run/netns/"):], "nft", "list", "ruleset")
			return volatileRuleset.ReplaceAllString(rs, "")
		},
		Refuses: nftRefuses,
	})
}

// volatileRuleset matches what a ruleset listing changes without a change
// of the ruleset: counters' values and elements' remaining time.
var volatileRuleset = regexp.MustCompile(` packets \d+ bytes \d+| expires [0-9hms.]+`)
