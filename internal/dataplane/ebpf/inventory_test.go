package ebpf

import (
	"context"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// KernelObjects sees the services pinned by an earlier plane, from a new
// plane (a restarted daemon) before its first Reconcile.
func TestKernelObjects(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	ns := fixtureNS(t)
	pin := mountBPFFS(t)
	p := newPlane(t, ns, pin, []string{"front", "back"}, 1024)
	if objs, err := p.KernelObjects(ctx); err != nil || len(objs) != 0 {
		t.Fatalf("no farm: %v %v", objs, err)
	}
	f := farm(t, "web", "10.100.0.10", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:80")
	if err := p.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{New: f}}}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	q := newPlane(t, ns, pin, []string{"front", "back"}, 1024)
	objs, err := q.KernelObjects(ctx)
	if err != nil || len(objs) != 1 || !strings.Contains(objs[0], "1 services") {
		t.Fatalf("after a restart: %v %v", objs, err)
	}
	if err := q.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if objs, err := q.KernelObjects(ctx); err != nil || len(objs) != 0 {
		t.Fatalf("after an empty Reconcile: %v %v", objs, err)
	}
}
