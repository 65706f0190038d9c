package ebpf

import (
	"context"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
)

// TestConnections lists, counts and deletes connections of the plane's own
// conntrack table with real traffic (batched map walks).
func TestConnections(t *testing.T) {
	conformance.RunConnections(t, conformance.Plane{
		Name: "ebpf",
		Open: func(t testing.TB, path string) dataplane.Dataplane {
			ns, err := netns.GetFromPath(path)
			if err != nil {
				t.Fatalf("open namespace %s: %v", path, err)
			}
			t.Cleanup(func() { ns.Close() })
			p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, PinPath: mountBPFFS(t), ConnTableSize: 16384})
			if err != nil {
				t.Fatalf("new ebpf plane: %v", err)
			}
			t.Cleanup(func() { p.Close() })
			return p
		},
	}, func(t testing.TB, dp dataplane.Dataplane, _ string) dataplane.ConnLister {
		return dp.(*Plane)
	})
}
