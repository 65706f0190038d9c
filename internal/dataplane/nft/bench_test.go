package nft

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// benchFarm returns farm i on VIP 10.<i>, port 80, with n backends.
func benchFarm(i, n int) *model.Farm {
	f := model.NewFarm(fmt.Sprintf("farm-%d", i))
	f.VirtualAddr = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
	for j := range n {
		b := model.NewBackend(fmt.Sprintf("b%d", j))
		b.Addr = netip.AddrFrom4([4]byte{172, 16, byte(j >> 8), byte(j)})
		b.Port = 8080
		f.Backends = append(f.Backends, b)
	}
	f.Seal()
	return &f
}

// BenchmarkApplyAddFarm100Backends times one Apply that adds a farm with
// 100 backends to a table that already holds 0, 1,000 or 10,000 farms (1-2
// backends each). The farm is deleted again outside the timer, so every
// iteration sees the same table size.
func BenchmarkApplyAddFarm100Backends(b *testing.B) {
	testutil.RequireRoot(b)
	for _, shards := range []int{1, DefaultShards} {
		for _, existing := range []int{0, 1000, 10000} {
			b.Run(fmt.Sprintf("tables=%d/existing=%d", shards, existing), func(b *testing.B) {
				benchAddFarm(b, shards, existing)
			})
		}
	}
}

// benchPlane opens a plane over shards tables in a new namespace holding
// existing farms, farm j with backends(j) backends.
func benchPlane(b *testing.B, shards, existing int, backends func(j int) int) dataplane.Dataplane {
	_, ns := testutil.NewNetNS(b)
	p, err := New(context.Background(), testLogger(), Options{NetNS: ns, Shards: shards})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	const chunk = 500
	for i := 0; i < existing; i += chunk {
		var d plan.Diff
		for j := i; j < min(i+chunk, existing); j++ {
			d.Changes = append(d.Changes, plan.FarmChange{New: benchFarm(j, backends(j))})
		}
		if err := p.Apply(context.Background(), d); err != nil {
			b.Fatalf("setup: %v", err)
		}
	}
	return p
}

func benchAddFarm(b *testing.B, shards, existing int) {
	p := benchPlane(b, shards, existing, func(j int) int { return 1 + j%2 })
	timeAdds(b, p, existing, 0)
}

// timeAdds times b.N Applies that each add a farm of 100 backends to p
// (which holds existing farms), each after a pause outside the timer; the
// farm is deleted again outside the timer.
func timeAdds(b *testing.B, p dataplane.Dataplane, existing int, pause time.Duration) {
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		time.Sleep(pause)
		f := benchFarm(existing+1+i%1000, 100)
		b.StartTimer()
		if err := p.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{New: f}}}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: f}}}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkApplyAddFarmCold times one Apply that adds a farm with 100
// backends next to 10,000 farms of 4 backends, over 1 to 32 tables, each
// after a 100 ms pause (outside the timer), as a single API call finds the
// caches: cold. Farms of several backends used to have a chain each, and
// every commit walks every chain; now they share group chains (group.go).
func BenchmarkApplyAddFarmCold(b *testing.B) {
	testutil.RequireRoot(b)
	for _, shards := range []int{1, 4, 8, DefaultShards} {
		b.Run(fmt.Sprintf("tables=%d", shards), func(b *testing.B) { benchAddFarmCold(b, shards) })
	}
}

func benchAddFarmCold(b *testing.B, shards int) {
	const existing = 10000
	timeAdds(b, benchPlane(b, shards, existing, func(int) int { return 4 }), existing, 100*time.Millisecond)
}
