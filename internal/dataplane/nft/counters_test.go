package nft

import (
	"context"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
)

// TestCounters: exactly n datagrams through a farm raise its and its
// backend's counters by exactly n, across a restart of the plane; in one
// table and spread over 3.
func TestCounters(t *testing.T) {
	for _, shards := range []int{1, 3} {
		open := func(t testing.TB, path string) dataplane.Dataplane {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				t.Fatalf("open namespace %s: %v", path, err)
			}
			t.Cleanup(func() { ns.Close() })
			p, err := New(context.Background(), testLogger(), Options{NetNS: ns, Shards: shards})
			if err != nil {
				t.Fatalf("new nft plane: %v", err)
			}
			t.Cleanup(func() { p.Close() })
			return p
		}
		conformance.RunCounters(t, conformance.Plane{Name: PlaneName, Open: open},
			func(t testing.TB, dp dataplane.Dataplane, path string) dataplane.Dataplane {
				dp.Close()
				return open(t, path)
			})
	}
}
