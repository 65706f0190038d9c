package health

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newTarget(c model.Check) *target {
	return &target{check: c, up: true, percent: -1, weight: -1, ramp: 1000, connFD: -1}
}

// rise and fall count consecutive results: failures between passes never
// add up (loxilb's users filed exactly that bug).
func TestObserveConsecutive(t *testing.T) {
	c := model.Check{Type: model.CheckTCP, Rise: 2, Fall: 3, Inter: 4 * time.Second, FastInter: time.Second, DownInter: 8 * time.Second}
	tg := newTarget(c)
	now := time.Now()
	steps := []struct {
		ok       bool
		changed  bool
		up       bool
		interval time.Duration
	}{
		{false, false, true, time.Second}, // 1 failure: changing, fastinter
		{false, false, true, time.Second}, // 2
		{true, false, true, 4 * time.Second},
		{false, false, true, time.Second},     // 1 again
		{false, false, true, time.Second},     // 2
		{false, true, false, 8 * time.Second}, // 3 in a row: down, downinter
		{true, false, false, time.Second},     // 1 pass: changing
		{false, false, false, 8 * time.Second},
		{true, false, false, time.Second},
		{true, true, true, 4 * time.Second}, // 2 in a row: up
	}
	for i, s := range steps {
		r := fail("x")
		if s.ok {
			r = pass("y")
		}
		changed, _ := tg.observe(r, now)
		if changed != s.changed || tg.up != s.up || tg.interval() != s.interval {
			t.Fatalf("step %d: changed %v up %v interval %v, want %v %v %v", i, changed, tg.up, tg.interval(), s.changed, s.up, s.interval)
		}
	}
	if tg.checks != uint64(len(steps)) || tg.fails != 6 {
		t.Errorf("counts %d %d", tg.checks, tg.fails)
	}
}

// An agent's "down" or "maint" takes the backend down at once; its
// percentages and an exec check's weight are weight changes.
func TestObserveAgentAndWeights(t *testing.T) {
	tg := newTarget(model.Check{Type: model.CheckAgent, Rise: 2, Fall: 3, Inter: time.Second, FastInter: time.Second, DownInter: time.Second})
	if changed, _ := tg.observe(parseAgent("maint\n"), time.Now()); !changed || tg.up {
		t.Fatalf("maint: changed %v up %v", changed, tg.up)
	}
	tg.up = true
	if changed, weights := tg.observe(parseAgent("75%\n"), time.Now()); changed || !weights || tg.percent != 75 {
		t.Errorf("75%%: %v %v %d", changed, weights, tg.percent)
	}
	if _, weights := tg.observe(parseAgent("up\n"), time.Now()); weights || tg.percent != 75 {
		t.Errorf("up keeps the percentage: %d", tg.percent)
	}
	ex := newTarget(model.Check{Type: model.CheckExec, Rise: 1, Fall: 1, Inter: time.Second})
	r := pass("exit 0")
	r.Weight = 4
	if _, weights := ex.observe(r, time.Now()); !weights || ex.weight != 4 {
		t.Errorf("exec weight: %d", ex.weight)
	}
	if _, weights := ex.observe(pass("exit 0"), time.Now()); !weights || ex.weight != -1 {
		t.Errorf("exec without weight: %d", ex.weight)
	}
}

func TestRamp(t *testing.T) {
	w := 10 * time.Second
	for el, want := range map[time.Duration]uint32{0: 100, 999 * time.Millisecond: 100, time.Second: 200, 9500 * time.Millisecond: 1000, time.Minute: 1000} {
		if got := rampAt(el, w); got != want {
			t.Errorf("rampAt(%v) = %d, want %d", el, got, want)
		}
	}
}

// sinkRecorder is the engine's side of the monitor in tests.
type sinkRecorder struct {
	mu      sync.Mutex
	updates []engine.HealthUpdate
	got     chan struct{}
}

func (s *sinkRecorder) SetHealth(_ context.Context, u []engine.HealthUpdate) error {
	s.mu.Lock()
	s.updates = append(s.updates, u...)
	s.mu.Unlock()
	select {
	case s.got <- struct{}{}:
	default:
	}
	return nil
}

// wait returns the first update that matches, waiting at most d (a bound
// against a hang, not a timing assertion).
func (s *sinkRecorder) wait(t *testing.T, d time.Duration, match func(engine.HealthUpdate) bool) engine.HealthUpdate {
	t.Helper()
	deadline := time.After(d)
	for {
		s.mu.Lock()
		for _, u := range s.updates {
			if match(u) {
				s.mu.Unlock()
				return u
			}
		}
		s.mu.Unlock()
		select {
		case <-s.got:
		case <-deadline:
			t.Fatalf("no matching update in %v; got %+v", d, s.updates)
		}
	}
}

// The monitor finds a listener that goes away and comes back, and stops
// checking a backend whose check is removed; over IPv4 and IPv6 (plain
// tcp checks are the scheduler's own connects: connprobe.go).
func TestMonitorTransitions(t *testing.T) {
	t.Run("ipv4", func(t *testing.T) { monitorTransitions(t, "127.0.0.1", "10.0.0.1", "ipv4") })
	t.Run("ipv6", func(t *testing.T) { monitorTransitions(t, "::1", "fd00::1", "ipv6") })
}

func monitorTransitions(t *testing.T, addr, vip, family string) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddrPort(ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	fs, err := model.DecodeFarms([]byte(`{"name":"web","family":"`+family+`","virtual-addr":"`+vip+`","virtual-ports":"80",
		"check":{"type":"tcp","inter":"20ms","timeout":"500ms","rise":"2","fall":"2"},
		"backends":[{"name":"b1","ip-addr":"`+addr+`","port":"`+itoa(dst.Port())+`"}]}`), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	f := &fs[0]
	sink := &sinkRecorder{got: make(chan struct{}, 1)}
	m := New(quiet, sink, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	m.Sync([]*model.Farm{f})
	ln.Close()
	u := sink.wait(t, 10*time.Second, func(u engine.HealthUpdate) bool { return u.Down })
	if u.Farm != "web" || u.Backend != "b1" || u.Reason != "connect refused" {
		t.Errorf("down update %+v", u)
	}
	c, _ := f.Resolve(0)
	if u.Key != f.CheckKey(0, &c) {
		t.Errorf("key %q", u.Key)
	}
	if st, ok := m.Status("web", "b1"); !ok || st.Up || !st.Checked || st.Last.Detail != "connect refused" {
		t.Errorf("status %+v", st)
	}
	ln2, err := net.Listen("tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	u = sink.wait(t, 10*time.Second, func(u engine.HealthUpdate) bool { return !u.Down })
	if u.Reason != "connected" || u.Percent != 100 || u.Ramp != 1000 || u.Weight != -1 {
		t.Errorf("up update %+v", u)
	}
	g := f.Clone()
	g.Check = nil
	m.Sync([]*model.Farm{&g})
	if n, _, _ := m.Totals(); n != 0 {
		t.Errorf("%d targets after the check was removed", n)
	}
	m.Sync(nil)
}

func itoa(p uint16) string { return netip.AddrPortFrom(netip.IPv4Unspecified(), p).String()[8:] }
