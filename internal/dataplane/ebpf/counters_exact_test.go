package ebpf

import (
	"context"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/conformance"
)

// TestCountersExact: exactly n datagrams through a farm raise its and its
// backend's counters by exactly n, across a hitless restart (the pinned
// maps adopted).
func TestCountersExact(t *testing.T) {
	var pin string
	open := func(t testing.TB, path string) dataplane.Dataplane {
		ns, err := netns.GetFromPath(path)
		if err != nil {
			t.Fatalf("open namespace %s: %v", path, err)
		}
		t.Cleanup(func() { ns.Close() })
		if pin == "" {
			pin = mountBPFFS(t)
		}
		p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, PinPath: pin, ConnTableSize: 16384})
		if err != nil {
			t.Fatalf("new ebpf plane: %v", err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	conformance.RunCounters(t, conformance.Plane{Name: "ebpf", Open: open},
		func(t testing.TB, dp dataplane.Dataplane, path string) dataplane.Dataplane {
			dp.Close()
			return open(t, path)
		})
}
