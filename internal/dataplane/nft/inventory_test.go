package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// KernelObjects sees the farms a plane left in the kernel, from a new
// plane (a restarted daemon) before its first Reconcile, in either table
// layout; it sees none in tables without farms.
func TestKernelObjects(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	_, ns := testutil.NewNetNS(t)
	for _, shards := range []int{1, 4} {
		p, err := New(ctx, testLogger(), Options{NetNS: ns, Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		var inv dataplane.KernelInventory = p
		if objs, err := inv.KernelObjects(ctx); err != nil || len(objs) != 0 {
			t.Fatalf("shards %d, no farm: %v %v", shards, objs, err)
		}
		f := model.NewFarm("web")
		f.VirtualAddr = netip.MustParseAddr("10.0.0.1")
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		b := model.NewBackend("b1")
		b.Addr = netip.MustParseAddr("10.1.0.1")
		f.Backends = []model.Backend{b}
		if err := p.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{New: &f}}}); err != nil {
			t.Fatal(err)
		}
		p.Close()
		// A new plane of the other layout sees them too: a daemon
		// restarted with another --nft-tables must not wipe them either.
		other := 5 - shards
		q, err := New(ctx, testLogger(), Options{NetNS: ns, Shards: other})
		if err != nil {
			t.Fatal(err)
		}
		objs, err := q.KernelObjects(ctx)
		if err != nil || len(objs) == 0 || !strings.Contains(objs[0], "table inet xlb") {
			t.Fatalf("shards %d then %d: %v %v", shards, other, objs, err)
		}
		if err := q.Reconcile(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if objs, err := q.KernelObjects(ctx); err != nil || len(objs) != 0 {
			t.Fatalf("after an empty Reconcile: %v %v", objs, err)
		}
		q.Close()
	}
}
