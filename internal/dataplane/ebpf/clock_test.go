package ebpf

import (
	"context"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestConntrackClock: the loader calibrates the program's clock, and the
// program's xlb_now() is the kernel's coarse monotonic clock to within two
// ticks (the offset is calibrated to within a tick, and the sample reads
// jiffies and the coarse clock a few ns apart, across which a tick may land:
// CI once saw one tick and 2 ns), so conntrack timestamps of another load (a
// restart, an upgrade) and the timeouts, exact to a second, keep their
// meaning.
func TestConntrackClock(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(t), ConnTableSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var tick uint64
	if err := p.objs.XlbClockTickNs.Get(&tick); err != nil {
		t.Fatal(err)
	}
	if _, ok := nearestHZ(float64(tick)); !ok || tick == 0 {
		t.Fatalf("xlb_clock_tick_ns = %d: not calibrated to a kernel tick", tick)
	}
	for range 20 {
		if _, err := p.objs.XlbClock.Run(&ebpf.RunOptions{Data: make([]byte, 14)}); err != nil {
			t.Fatal(err)
		}
		var s [4]uint64
		if err := p.objs.XlbClockSample.Get(&s); err != nil {
			t.Fatal(err)
		}
		if d := int64(s[3] - s[1]); d < -2*int64(tick) || d > 2*int64(tick) {
			t.Fatalf("xlb_now() %d differs from the coarse clock %d by %v (tick %v)", s[3], s[1], time.Duration(d), time.Duration(tick))
		}
		time.Sleep(3 * time.Millisecond)
	}
}

func TestNearestHZ(t *testing.T) {
	for _, c := range []struct {
		tick float64
		hz   uint64
		ok   bool
	}{
		{4e6, 250, true}, {4.1e6, 250, true}, {1e6, 1000, true}, {10e6, 100, true},
		{3333333, 300, true}, {3.7e6, 0, false}, {0, 0, false},
	} {
		hz, ok := nearestHZ(c.tick)
		if ok != c.ok || (ok && hz != c.hz) {
			t.Errorf("nearestHZ(%.0f) = %d, %v; want %d, %v", c.tick, hz, ok, c.hz, c.ok)
		}
	}
}
