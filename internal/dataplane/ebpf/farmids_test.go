package ebpf

import (
	"context"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestFarmIDs: a farm's id (xlb_svc_flags' bits 16-31, what its clients'
// rate state is keyed by) stays the same across a change of the farm (a
// new generation) and a restart (a new plane adopting the pinned maps,
// then changing the farm again); farms have ids of their own, and a
// deleted farm's id is not given to the next new farm.
func TestFarmIDs(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	ns := fixtureNS(t)
	pin := mountBPFFS(t)
	p := newPlane(t, ns, pin, []string{"front", "back"}, 1024)
	a := farm(t, "a", "10.100.0.10", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:80")
	b := farm(t, "b", "10.100.0.11", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:80")
	if err := p.Reconcile(ctx, []*model.Farm{a, b}); err != nil {
		t.Fatal(err)
	}
	idOf := func(p *Plane, name string) uint32 {
		t.Helper()
		g := p.farms[name]
		if g == nil {
			t.Fatalf("farm %s: no generation", name)
		}
		var fl uint32
		if err := p.objs.XlbSvcFlags.Lookup(g.val.Id, &fl); err != nil {
			t.Fatalf("farm %s: flags of generation %d: %v", name, g.val.Id, err)
		}
		return fl >> farmIDShift
	}
	ida, idb := idOf(p, "a"), idOf(p, "b")
	if ida == 0 || idb == 0 || ida == idb {
		t.Fatalf("farm ids a %d, b %d: want two different ones, not 0", ida, idb)
	}
	change := func(p *Plane, old *model.Farm) *model.Farm {
		t.Helper()
		n := old.Clone()
		n.Backends[0].Weight++
		gen := p.farms[old.Name].val.Id
		if err := p.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: old, New: &n}}}); err != nil {
			t.Fatal(err)
		}
		if p.farms[old.Name].val.Id == gen {
			t.Fatalf("farm %s: still generation %d after a change", old.Name, gen)
		}
		return &n
	}
	a = change(p, a)
	if got := idOf(p, "a"); got != ida {
		t.Errorf("after a change: farm a's id %d, want %d", got, ida)
	}
	p.Close()

	q := newPlane(t, ns, pin, []string{"front", "back"}, 1024)
	if err := q.Reconcile(ctx, []*model.Farm{a, b}); err != nil {
		t.Fatal(err)
	}
	if got, gotb := idOf(q, "a"), idOf(q, "b"); got != ida || gotb != idb {
		t.Errorf("after a restart: ids a %d, b %d, want %d, %d", got, gotb, ida, idb)
	}
	change(q, a)
	if got := idOf(q, "a"); got != ida {
		t.Errorf("after a restart and a change: farm a's id %d, want %d", got, ida)
	}
	if err := q.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: b}}}); err != nil {
		t.Fatal(err)
	}
	c := farm(t, "c", "10.100.0.12", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:80")
	if err := q.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{New: c}}}); err != nil {
		t.Fatal(err)
	}
	if idc := idOf(q, "c"); idc == 0 || idc == ida || idc == idb {
		t.Errorf("new farm c's id %d: want one of its own (a %d, deleted b %d)", idc, ida, idb)
	}
}
