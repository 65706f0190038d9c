package nft

import (
	"context"
	"fmt"
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
			return testutil.Run(t, path[len("/run/netns/"):], "nft", "list", "ruleset")
		},
		Refuses: nftRefuses,
	})
}
