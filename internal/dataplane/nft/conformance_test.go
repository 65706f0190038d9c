package nft

import (
	"context"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// nftRefuses is what the nft plane refuses; keep it in step with Check and
// docs/dataplane-nft.md.
var nftRefuses = map[string]string{
	"limit-backend-est-connlimit": `backend "b0": field "est-connlimit" value "2"`,
	"family-dual":                 `"family" value "dual"`,
	"mode-dsr":                    `"mode" value "dsr"`,
	"mode-stlsdnat":               `"mode" value "stlsdnat"`,
}

// TestConformance runs the data-plane conformance suite against nft.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Plane{
		Name: PlaneName,
		Open: func(t testing.TB, path string) dataplane.Dataplane {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				t.Fatalf("open namespace %s: %v", path, err)
			}
			t.Cleanup(func() { ns.Close() })
			p, err := New(context.Background(), testLogger(), Options{NetNS: ns, LogGroup: conformance.LogGroup})
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
