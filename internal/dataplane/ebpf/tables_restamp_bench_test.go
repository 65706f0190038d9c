package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkTablesRestamp is the cost of a change of one farm's policies
// next to 16,000 farms (issue #17): "attach" is the ApplyTables that
// attaches a deny list to one farm, or detaches it (taking turns, both
// timed: each changes what xlb_tbl_policy answers); "add-farm" adds a
// farm with the policy (its Apply, then the ApplyTables that gives it
// the policy) and removes it untimed. Where a change of policies writes
// every service's value again (tables_svcrefs.go), both grow with the
// number of service keys.
func BenchmarkTablesRestamp(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	ns := fixtureNS(b)
	p := newPlane(b, ns, mountBPFFS(b), []string{"front"}, 4096)
	const n = 16_000
	farms := make([]*model.Farm, 0, n)
	for i := range n {
		farms = append(farms, farm(b, fmt.Sprintf("f%05d", i), fmt.Sprintf("10.98.%d.%d", i/250, i%250+1), 80,
			model.ProtoTCP, model.ModeDNAT, model.SchedRR, fmt.Sprintf("10.201.%d.%d:8080", i/250, i%250+1)))
	}
	if err := p.Reconcile(ctx, farms); err != nil {
		b.Fatalf("reconcile %d farms: %v", n, err)
	}
	bl := addrTable(b, "bl", model.ListDeny, 1, 1, "192.0.2.1")
	if err := p.ReconcileTables(ctx, []*model.Table{bl}, farms); err != nil { // as a daemon starts
		b.Fatal(err)
	}
	b.Run(fmt.Sprintf("attach/farms=%d", n), func(b *testing.B) {
		plain := farms[0]
		with := plain.Clone()
		with.Policies = []model.PolicyRef{{Name: "bl"}}
		on := false
		for b.Loop() {
			c := plan.FarmChange{Old: plain, New: &with}
			if on {
				c = plan.FarmChange{Old: &with, New: plain}
			}
			if err := p.ApplyTables(ctx, plan.TableDiff{Farms: []plan.FarmChange{c}}); err != nil {
				b.Fatal(err)
			}
			on = !on
		}
		if on {
			if err := p.ApplyTables(ctx, plan.TableDiff{Farms: []plan.FarmChange{{Old: &with, New: plain}}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("add-farm/farms=%d", n), func(b *testing.B) {
		nf := farm(b, "new", "10.97.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.202.0.1:8080")
		nf.Policies = []model.PolicyRef{{Name: "bl"}}
		vip := netip.MustParseAddr("10.97.0.1")
		key := xlbSvcKey{Addr: addrWords(vip), Port: ne16(80), Proto: protoTCP, Family: familyOf(vip)}
		for b.Loop() {
			if err := p.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{New: nf}}}); err != nil {
				b.Fatal(err)
			}
			if err := p.ApplyTables(ctx, plan.TableDiff{Farms: []plan.FarmChange{{New: nf}}}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			var pol xlbTblPolicy
			if err := p.objs.XlbTblPolicy.Lookup(key, &pol); err != nil {
				b.Fatalf("the new farm's policy: %v", err)
			}
			if err := p.ApplyTables(ctx, plan.TableDiff{Farms: []plan.FarmChange{{Old: nf}}}); err != nil {
				b.Fatal(err)
			}
			if err := p.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: nf}}}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}
