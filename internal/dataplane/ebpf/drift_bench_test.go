package ebpf

import (
	"context"
	"fmt"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkDriftEntries is one drift poll's look at the farms' map entries
// (checkEntries, its budget of driftBudget lookups spent) over 1,000 farms
// of 9 backends: what an idle daemon pays four times a second whenever
// the farms hold more than the budget. ns/lookup is the cost of one of
// the budget's lookups.
func BenchmarkDriftEntries(b *testing.B) {
	testutil.RequireRoot(b)
	ns := fixtureNS(b)
	p := newPlane(b, ns, mountBPFFS(b), []string{"front"}, 4096)
	var farms []*model.Farm
	for i := range 1000 {
		var be []string
		for j := range 9 {
			be = append(be, fmt.Sprintf("10.%d.%d.%d:8080", 20+i/250, i%250, j+1))
		}
		farms = append(farms, farm(b, fmt.Sprintf("f%04d", i), fmt.Sprintf("10.99.%d.%d", i/250, i%250+1), 80,
			model.ProtoTCP, model.ModeDNAT, model.SchedRR, be...))
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	lookups := 0
	for b.Loop() {
		p.mu.Lock()
		before := p.drift.cursor
		if what := p.checkEntries(); len(what) > 0 {
			b.Fatalf("drift in an untouched plane: %v", what)
		}
		seen := p.drift.cursor - before
		if seen <= 0 {
			seen += len(p.farms)
		}
		p.mu.Unlock()
		lookups += seen * (1 + 9 + 2) // service entry, backends, first and last slot
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(lookups), "ns/lookup")
}
