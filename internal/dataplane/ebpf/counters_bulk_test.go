package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// TestAllCountersBatched: the batched read of every farm's counters
// (AllCounters, what the rate estimator and a scrape use) gives exactly
// what one farm's read gives, backend by backend, for more backends than
// one batch holds (5,000: two chunks of 4,096 slots), each slot's counters
// distinct on each CPU, and after backends were removed and others added
// (freed slots given again, the removed ones' counts in the farm's carry).
func TestAllCountersBatched(t *testing.T) {
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front", "back"}, 16384)
	ctx := context.Background()
	mk := func(name string, vip netip.Addr, first, n int) *model.Farm {
		f := farm(t, name, vip.String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedWeight)
		for i := range n {
			b := model.NewBackend(fmt.Sprintf("b%d", first+i))
			b.Addr = netip.AddrFrom4([4]byte{10, 200, byte((first + i) >> 8), byte(first + i)})
			b.Port = 8080
			f.Backends = append(f.Backends, b)
		}
		return f
	}
	f1 := mk("one", netip.MustParseAddr("10.100.1.1"), 0, 2500)
	f2 := mk("two", netip.MustParseAddr("10.100.1.2"), 2500, 2500)
	if err := p.Reconcile(ctx, []*model.Farm{f1, f2}); err != nil {
		t.Fatal(err)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	// Distinct counters in every slot given and on every CPU.
	fill := func(base uint64) {
		t.Helper()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, s := range p.statSlot {
			per := make([]xlbBeStats, cpus)
			for c := range per {
				v := base + uint64(s)*100 + uint64(c)
				per[c] = xlbBeStats{Conns: v, InPkts: 2 * v, InBytes: 3 * v, OutPkts: 4 * v, OutBytes: 5 * v}
			}
			if err := p.objs.XlbBeStats.Update(s, per, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
		}
	}
	compare := func(what string, farms ...*model.Farm) {
		t.Helper()
		all, err := p.AllCounters(ctx, farms)
		if err != nil {
			t.Fatalf("%s: all counters: %v", what, err)
		}
		for i, f := range farms {
			one, err := p.Counters(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if all[i].Counters != one.Counters || len(all[i].Backends) != len(one.Backends) {
				t.Fatalf("%s: farm %s: batched %+v (%d backends), one farm's read %+v (%d)", what, f.Name,
					all[i].Counters, len(all[i].Backends), one.Counters, len(one.Backends))
			}
			if one.Counters == (dataplane.Counters{}) {
				t.Fatalf("%s: farm %s counted nothing", what, f.Name)
			}
			for j := range one.Backends {
				if all[i].Backends[j] != one.Backends[j] {
					t.Fatalf("%s: farm %s backend %d: batched %+v, one farm's read %+v", what, f.Name, j, all[i].Backends[j], one.Backends[j])
				}
				if one.Backends[j].Counters == (dataplane.Counters{}) {
					t.Fatalf("%s: farm %s backend %s counted nothing", what, f.Name, one.Backends[j].Name)
				}
			}
		}
	}
	fill(1)
	compare("5,000 backends", f1, f2)
	// 100 backends of farm one go (their counts to its carry), 100 new
	// ones take their slots.
	f1b := mk("one", f1.VirtualAddr, 100, 2400)
	f1b.Backends = append(f1b.Backends, mk("x", f1.VirtualAddr, 6000, 100).Backends...)
	if err := p.Reconcile(ctx, []*model.Farm{f1b, f2}); err != nil {
		t.Fatal(err)
	}
	fill(7)
	compare("after a change", f1b, f2)
	// A farm the plane does not hold is zero, as the interface says.
	all, err := p.AllCounters(ctx, []*model.Farm{mk("none", netip.MustParseAddr("10.100.1.3"), 0, 1)})
	if err != nil || all[0].Counters != (dataplane.Counters{}) || len(all[0].Backends) != 1 {
		t.Fatalf("unknown farm: %+v, %v", all, err)
	}
}
