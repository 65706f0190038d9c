package observe

import (
	"context"
	"math"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/engine"
	xmodel "github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// steppingPlane's counters are whatever the test last set.
type steppingPlane struct {
	*fake.Plane
	c *dataplane.Counters
}

func (p steppingPlane) Counters(ctx context.Context, f *xmodel.Farm) (dataplane.FarmCounters, error) {
	out := dataplane.FarmCounters{Counters: *p.c}
	for _, b := range f.Backends {
		out.Backends = append(out.Backends, dataplane.BackendCounters{Name: b.Name, Counters: *p.c})
	}
	return out, nil
}

// The estimate follows IPVS's: the first sample is the base, then every
// 2 s tick moves the estimate a quarter of the way to the tick's rate; a
// counter that goes backwards restarts from its new value.
func TestRateEstimator(t *testing.T) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var c dataplane.Counters
	eng, err := engine.New(context.Background(), discard(), steppingPlane{fake.New(), &c}, st)
	if err != nil {
		t.Fatal(err)
	}
	f := xmodel.NewFarm("web")
	f.VirtualAddr = netip.MustParseAddr("10.99.0.1")
	b := xmodel.NewBackend("b0")
	b.Addr = netip.MustParseAddr("10.200.0.11")
	f.Backends = []xmodel.Backend{b}
	if _, err := eng.Change(context.Background(), func(tx *engine.Txn) error { return tx.Put(f) }); err != nil {
		t.Fatal(err)
	}
	r := NewRates(eng, discard())
	ctx := context.Background()
	step := func() {
		// 100 connections, 1,000 packets in, 500 out, 1 MB in, 64 kB out
		// a second, over one 2 s tick.
		c.Connections += 200
		c.InPackets += 2000
		c.OutPackets += 1000
		c.InBytes += 2_000_000
		c.OutBytes += 128_000
		r.Sample(ctx)
	}
	r.Sample(ctx) // base
	want := Rates{}
	for n := 1; n <= 12; n++ {
		step()
		for _, x := range []struct {
			avg  *float64
			rate float64
		}{{&want.CPS, 100}, {&want.InPPS, 1000}, {&want.OutPPS, 500}, {&want.InBPS, 1e6}, {&want.OutBPS, 64000}} {
			*x.avg += (x.rate - *x.avg) / 4
		}
		got, err := r.FarmRates("web")
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range []Rates{got.Rates, got.Backends[0].Rates} {
			if math.Abs(g.CPS-want.CPS) > 1e-9 || math.Abs(g.InBPS-want.InBPS) > 1e-6 || math.Abs(g.OutPPS-want.OutPPS) > 1e-9 {
				t.Fatalf("tick %d: rates %+v, want %+v", n, g, want)
			}
		}
	}
	// After 12 ticks a steady rate is estimated within 3.2 % (0.75^12).
	if got, _ := r.FarmRates("web"); got.CPS < 96.8 || got.CPS > 100 {
		t.Errorf("steady 100 cps estimated as %v", got.CPS)
	}
	// Counters restart (smaller): the estimate is kept, the base reset.
	before, _ := r.FarmRates("web")
	c = dataplane.Counters{Connections: 5}
	r.Sample(ctx)
	if after, _ := r.FarmRates("web"); after.Rates != before.Rates {
		t.Errorf("a restarted counter changed the estimate: %+v -> %+v", before.Rates, after.Rates)
	}
	// No traffic: the estimate decays by a quarter a tick.
	r.Sample(ctx)
	if after, _ := r.FarmRates("web"); math.Abs(after.CPS-before.CPS*0.75) > 1e-9 {
		t.Errorf("idle tick: %v cps, want %v", after.CPS, before.CPS*0.75)
	}
	if _, err := r.FarmRates("nope"); !engine.IsNotFound(err) {
		t.Errorf("rates of a missing farm: %v, want not found", err)
	}
	// A backend replaced by another in one change: the gone one's
	// estimate goes, and it starts from nothing when it comes back.
	put := func(names ...string) {
		t.Helper()
		g := f.Clone()
		g.Backends = nil
		for i, n := range names {
			nb := xmodel.NewBackend(n)
			nb.Addr = netip.AddrFrom4([4]byte{10, 200, 0, byte(11 + i)})
			g.Backends = append(g.Backends, nb)
		}
		if _, err := eng.Change(ctx, func(tx *engine.Txn) error { return tx.Put(g) }); err != nil {
			t.Fatal(err)
		}
	}
	put("b1")
	step()
	r.mu.RLock()
	_, kept := r.farms["web"].backends["b0"]
	n := len(r.farms["web"].backends)
	r.mu.RUnlock()
	if kept || n != 1 {
		t.Errorf("after b0 was replaced by b1: b0's estimate kept %v, %d estimates, want 1", kept, n)
	}
	put("b0")
	step()
	if got, _ := r.FarmRates("web"); got.Backends[0].Rates != (Rates{}) {
		t.Errorf("b0 back: rates %+v, want none until its second sample", got.Backends[0].Rates)
	}
}

// A scrape serves the rate estimator's last read of the counters while it
// is recent, rather than read the plane again.
func TestScrapeUsesRateSample(t *testing.T) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var c dataplane.Counters
	eng, err := engine.New(context.Background(), discard(), steppingPlane{fake.New(), &c}, st)
	if err != nil {
		t.Fatal(err)
	}
	putFarms(t, eng, 1, 1)
	r := NewRates(eng, discard())
	m := New(Options{Engine: eng, NoRuntime: true, Rates: r})
	c.InPackets = 7
	r.Sample(context.Background())
	c.InPackets = 9 // the plane counts on; the scrape serves the sample
	body, err := m.Expose(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `xlb_backend_incoming_packets_total{farm="farm0",backend="b0"} 7`) {
		t.Errorf("scrape did not serve the estimator's sample (7):\n%s", body)
	}
}
