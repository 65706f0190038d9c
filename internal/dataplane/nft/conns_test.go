package nft

import (
	"context"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
)

// TestConnections lists, counts and deletes the nft plane's connections
// in netfilter's conntrack over netlink (conns.go, internal/conntrack),
// with real traffic.
func TestConnections(t *testing.T) {
	conformance.RunConnections(t, connPlane(), connTable)
}

// TestSourceTableConnections: two farms on one key, one chosen by source
// table, with the same backends: each lists, counts and deletes its own
// clients' connections only (plan.ConnOwners).
func TestSourceTableConnections(t *testing.T) {
	conformance.RunSourceTableConnections(t, connPlane(), connTable)
}

func connPlane() conformance.Plane {
	return conformance.Plane{
		Name: PlaneName,
		Open: func(t testing.TB, path string) dataplane.Dataplane {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				t.Fatalf("open namespace %s: %v", path, err)
			}
			t.Cleanup(func() { ns.Close() })
			p, err := New(context.Background(), testLogger(), Options{NetNS: ns, Shards: 1})
			if err != nil {
				t.Fatalf("new nft plane: %v", err)
			}
			return p
		},
	}
}

func connTable(t testing.TB, dp dataplane.Dataplane, _ string) dataplane.ConnLister {
	return dp.(*Plane)
}
