package nft

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// The drift watch sees what others do to xlb's tables, and nothing of
// what xlb does itself or of other tables; DriftSeen has seen every
// change committed before it was called.
func TestWatchDrift(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	name, ns := testutil.NewNetNS(t)
	p, err := New(t.Context(), testLogger(), Options{NetNS: ns, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var mu sync.Mutex
	var whats []string
	if err := p.WatchDrift(t.Context(), func(what string) {
		mu.Lock()
		whats = append(whats, what)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	seen := func() uint64 {
		t.Helper()
		n, err := p.DriftSeen(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	nft := func(args ...string) { testutil.Run(t, name, append([]string{"nft"}, args...)...) }

	// xlb's own changes: a farm, a reconcile, a named table.
	f := model.NewFarm("web")
	f.VirtualAddr = testutil.VIP4(1)
	f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
	b := model.NewBackend("b1")
	b.Addr = testutil.VIP4(200)
	f.Backends = []model.Backend{b}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: &f}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(context.Background(), []*model.Farm{&f}); err != nil {
		t.Fatal(err)
	}
	bl := addrTable(t, "bl", 1, model.ListDeny, "10.0.0.0/8")
	err = p.ApplyTables(context.Background(), plan.TableDiff{
		Tables: []plan.TableChange{{New: bl}},
		Slots:  []plan.SlotChange{{Slot: 1, New: bl}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := seen(); n != 0 {
		t.Fatalf("xlb's own changes seen as %d drifts: %v", n, whats)
	}
	// Another table: not xlb's business.
	nft("add", "table", "inet", "firewalld")
	nft("add", "chain", "inet", "firewalld", "c")
	nft("add", "table", "inet", "xlb-kube")
	if n := seen(); n != 0 {
		t.Fatalf("other tables' changes seen as %d drifts: %v", n, whats)
	}
	// Others' changes to xlb's tables: each transaction is one drift.
	listing := testutil.Run(t, name, "nft", "list", "ruleset")
	table := "xlb-00"
	if !strings.Contains(listing, "table inet xlb-00") || !strings.Contains(listing, "chain prerouting") {
		t.Fatalf("unexpected listing:\n%s", listing)
	}
	nft("flush", "chain", "inet", table, "prerouting")
	if n := seen(); n != 1 {
		t.Fatalf("a chain flushed by hand: %d drifts, want 1: %v", n, whats)
	}
	nft("delete", "table", "inet", "xlb-tables")
	nft("flush", "ruleset")
	if n := seen(); n != 3 {
		t.Fatalf("a table deleted and the ruleset flushed: %d drifts, want 3: %v", n, whats)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, want := range []string{"delete rule inet xlb-00 prerouting (", "delete table inet xlb-tables", "delete table inet xlb-01"} {
		if i >= len(whats) || !strings.Contains(whats[i], want) {
			t.Errorf("drift %d: %q, want it to say %q", i, whats, want)
		}
	}
}
