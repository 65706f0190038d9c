package nft

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestBulkElementsShareMessages: a bulk change sends the service, dst and
// masquerade elements of many farms in a few messages (batch.runs), and
// what it leaves in the kernel is what a fresh Reconcile builds, also when
// one batch deletes farms (a farm with its own chain among them) and adds
// others on the same keys.
func TestBulkElementsShareMessages(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	nameA, nsA := testutil.NewNetNS(t)
	nameB, nsB := testutil.NewNetNS(t)
	pa := newPlane(t, nsA)
	const direct = 450 // more than two messages' worth of elements (elemChunk)
	farm := func(name string, vip netip.Addr, backends ...string) *model.Farm {
		f := model.NewFarm(name)
		f.VirtualAddr = vip
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		for i, a := range backends {
			b := model.NewBackend(fmt.Sprintf("b%d", i))
			b.Addr = netip.MustParseAddr(a)
			b.Port = 8080
			f.Backends = append(f.Backends, b)
		}
		return mustValid(t, pa, &f)
	}
	vip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 98, byte(i >> 8), byte(i)}) }
	// generation g of the farms: names and backends change with g, the
	// VIPs stay, so generation 2 takes generation 1's keys.
	gen := func(g int) []*model.Farm {
		var fs []*model.Farm
		for i := range direct {
			fs = append(fs, farm(fmt.Sprintf("d%d-%03d", g, i), vip(i), fmt.Sprintf("10.200.%d.%d", g, i%250+1)))
		}
		own := farm(fmt.Sprintf("own%d", g), netip.MustParseAddr("10.99.0.1"), "10.200.0.11", "10.200.0.12")
		own.Persistence = model.KeySrcIP // a chain of its own
		fs = append(fs, mustValid(t, pa, own))
		fs = append(fs, farm(fmt.Sprintf("grp%d", g), netip.MustParseAddr("10.99.0.2"), "10.200.0.13", "10.200.0.14"))
		return fs
	}
	same := func(step string, farms []*model.Farm) {
		t.Helper()
		pb := newPlane(t, nsB)
		if err := pb.Reconcile(context.Background(), farms); err != nil {
			t.Fatalf("%s: reconcile: %v", step, err)
		}
		list := func(ns string) string {
			return strings.Join(normalize(testutil.Run(t, ns, "nft", "list", "table", "inet", "xlb")), "\n")
		}
		if a, b := list(nameA), list(nameB); a != b {
			t.Fatalf("%s: Apply and Reconcile differ\napply:\n%s\nreconcile:\n%s", step, a, b)
		}
	}

	g1 := gen(1)
	var d plan.Diff
	for _, f := range g1 {
		d.Changes = append(d.Changes, plan.FarmChange{New: f})
	}
	if err := pa.Apply(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	// Three static sets take the direct farms' elements (svcx4, dstx4,
	// masqx4): 3 x 3 messages of 200, plus the other farms' few. One
	// message per farm and set would be more than 3 x direct.
	if pa.lastElemMsgs > 20 {
		t.Errorf("adding %d farms sent %d element messages, want them shared (<= 20)", len(g1), pa.lastElemMsgs)
	}
	t.Logf("adding %d farms: %d element messages", len(g1), pa.lastElemMsgs)
	same("add", g1)

	// Generation 2 replaces generation 1 in one batch, deletes first (as
	// the engine orders a restore): the same keys are deleted and added
	// again, and farm own1's chain is deleted after its elements.
	g2 := gen(2)
	d = plan.Diff{}
	for _, f := range g1 {
		d.Changes = append(d.Changes, plan.FarmChange{Old: f})
	}
	for _, f := range g2 {
		d.Changes = append(d.Changes, plan.FarmChange{New: f})
	}
	if err := pa.Apply(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if pa.lastElemMsgs > 40 {
		t.Errorf("replacing %d farms sent %d element messages, want them shared (<= 40)", len(g1), pa.lastElemMsgs)
	}
	t.Logf("replacing %d farms: %d element messages", len(g1), pa.lastElemMsgs)
	same("replace", g2)
}
