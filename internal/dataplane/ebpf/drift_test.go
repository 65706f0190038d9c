package ebpf

import (
	"context"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestDriftEntries: the poll's look at map entries finds nothing in an
// untouched plane, and names a backend entry changed by hand and a service
// entry deleted by hand.
func TestDriftEntries(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	f := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.20.0.1:8080", "10.20.0.2:8080")
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	check := func() string {
		p.mu.Lock()
		defer p.mu.Unlock()
		return strings.Join(p.checkEntries(), "; ")
	}
	if got := check(); got != "" {
		t.Fatalf("untouched plane: %s", got)
	}
	g := p.farms["web"]
	var be xlbBackend
	if err := p.objs.XlbBackends.Lookup(g.ids[1], &be); err != nil {
		t.Fatal(err)
	}
	be.Port++
	if err := p.objs.XlbBackends.Put(g.ids[1], &be); err != nil {
		t.Fatal(err)
	}
	if got := check(); !strings.Contains(got, `farm "web": backend b2 changed`) {
		t.Errorf("backend entry changed by hand: %q", got)
	}
	be.Port--
	if err := p.objs.XlbBackends.Put(g.ids[1], &be); err != nil {
		t.Fatal(err)
	}
	if err := p.objs.XlbServices.Delete(g.keys[0]); err != nil {
		t.Fatal(err)
	}
	if got := check(); !strings.Contains(got, `farm "web": service entry deleted`) {
		t.Errorf("service entry deleted by hand: %q", got)
	}
}
