package health

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// fakeCounts is a dataplane.PassiveReader whose counts a test sets.
type fakeCounts struct {
	mu     sync.Mutex
	counts map[string]*dataplane.PassiveCount
	resets []string
}

func (f *fakeCounts) PassiveCounts(context.Context) ([]dataplane.PassiveCount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []dataplane.PassiveCount
	for _, c := range f.counts {
		out = append(out, *c)
	}
	return out, nil
}

func (f *fakeCounts) ResetPassive(_ context.Context, farm, backend string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resets = append(f.resets, backend)
	f.counts[backend].Consecutive = 0
	return nil
}

func (f *fakeCounts) fail(backend string, n uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.counts[backend]
	c.Consecutive += n
	c.Resets += uint64(n)
}

type recordSink struct {
	mu      sync.Mutex
	updates []engine.HealthUpdate
}

func (s *recordSink) SetHealth(_ context.Context, us []engine.HealthUpdate) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updates = append(s.updates, us...)
	return nil
}

func (s *recordSink) take() map[string]engine.HealthUpdate {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]engine.HealthUpdate{}
	for _, u := range s.updates {
		out[u.Backend] = u
	}
	s.updates = nil
	return out
}

func passiveFarm(t *testing.T, n int, passive string) *model.Farm {
	t.Helper()
	var bes []string
	for i := range n {
		bes = append(bes, fmt.Sprintf(`{"name":"b%d","ip-addr":"10.1.0.%d","port":"80"}`, i+1, i+1))
	}
	fs, err := model.DecodeFarms([]byte(`{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","check":{"passive":`+passive+`},"backends":[`+strings.Join(bes, ",")+`]}`),
		func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	return &fs[0]
}

// Consecutive failures eject, no more than max-ejected at once, for
// ejection-time × ejections in a row; a return frees a place and starts the
// plane's count afresh.
func TestEjectorConsecutive(t *testing.T) {
	f := passiveFarm(t, 4, `{"failures":"3","ejection-time":"1s","max-ejection-time":"3s","max-ejected":"50%"}`)
	r := &fakeCounts{counts: map[string]*dataplane.PassiveCount{}}
	for _, b := range f.Backends {
		r.counts[b.Name] = &dataplane.PassiveCount{Farm: "web", Backend: b.Name}
	}
	sink := &recordSink{}
	x := NewEjector(quiet, sink, r, time.Second)
	now := time.Unix(1000, 0)
	x.now = func() time.Time { return now }
	x.Sync([]*model.Farm{f})
	ctx := context.Background()
	step := func() map[string]engine.HealthUpdate {
		t.Helper()
		if err := x.Step(ctx); err != nil {
			t.Fatal(err)
		}
		return sink.take()
	}
	r.fail("b1", 2)
	if u := step(); len(u) != 0 {
		t.Fatalf("2 failures of 3: %v", u)
	}
	r.fail("b1", 1)
	r.fail("b2", 5)
	r.fail("b3", 4)
	u := step()
	// Two of four may be out: b1 and b2 (in the farm's order), not b3.
	if len(u) != 2 || !u["b1"].Ejected || !u["b2"].Ejected || !u["b1"].Passive || u["b1"].Key != f.PassiveKey(0) {
		t.Fatalf("ejections: %+v", u)
	}
	if want := "3 consecutive connection failures (3 reset by the backend); ejected for 1s"; u["b1"].Reason != want {
		t.Errorf("reason %q, want %q", u["b1"].Reason, want)
	}
	if u := step(); len(u) != 0 {
		t.Fatalf("nothing new: %v", u)
	}
	// A second later both return (and their counts are reset); b3 takes
	// a freed place.
	now = now.Add(time.Second)
	u = step()
	if len(u) != 3 || u["b1"].Ejected || u["b2"].Ejected || !u["b3"].Ejected {
		t.Fatalf("after 1s: %+v", u)
	}
	if u := step(); len(u) != 0 || len(r.resets) != 2 {
		t.Fatalf("after the returns: %v, resets %v", u, r.resets)
	}
	// b1 fails again at once: its second ejection in a row lasts 2s.
	r.fail("b1", 3)
	u = step()
	if !u["b1"].Ejected || !strings.HasSuffix(u["b1"].Reason, "ejected for 2s") {
		t.Fatalf("second ejection: %+v", u)
	}
	now = now.Add(1500 * time.Millisecond)
	if u := step(); u["b1"].Backend != "" {
		t.Fatalf("b1 back after 1.5s of 2s: %+v", u)
	}
	now = now.Add(500 * time.Millisecond)
	if u := step(); u["b1"].Ejected || u["b1"].Backend == "" {
		t.Fatalf("b1 not back after 2s: %+v", u)
	}
	step() // the reset
	// After staying in for 2 × ejection-time its multiplier is back to 0.
	now = now.Add(time.Second)
	step()
	now = now.Add(time.Second)
	step()
	r.fail("b1", 3)
	if u := step(); !strings.HasSuffix(u["b1"].Reason, "ejected for 1s") {
		t.Fatalf("after a quiet spell: %+v", u)
	}
	if st, ok := x.PassiveStatus("web", "b1"); !ok || !st.Ejected || st.InARow != 1 {
		t.Errorf("status %+v %v", st, ok)
	}
}

// One backend may always be ejected, whatever the percentage (Envoy).
func TestEjectorAtLeastOne(t *testing.T) {
	f := passiveFarm(t, 3, `{"failures":"1","max-ejected":"0"}`)
	r := &fakeCounts{counts: map[string]*dataplane.PassiveCount{}}
	for _, b := range f.Backends {
		r.counts[b.Name] = &dataplane.PassiveCount{Farm: "web", Backend: b.Name, Consecutive: 1, Timeouts: 1}
	}
	sink := &recordSink{}
	x := NewEjector(quiet, sink, r, time.Second)
	x.Sync([]*model.Farm{f})
	if err := x.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	u := sink.take()
	if len(u) != 1 || !u["b1"].Ejected || !strings.Contains(u["b1"].Reason, "1 no answer to the SYN") {
		t.Fatalf("%+v", u)
	}
}

// init-state down: a new check starts down (the engine takes the backend
// out at once) and comes up after rise passes.
func TestInitStateDown(t *testing.T) {
	ln := lineServer(t, "hi\n", false)
	fs, err := model.DecodeFarms([]byte(fmt.Sprintf(`{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80",
		"check":{"type":"tcp","inter":"50ms","rise":"2","init-state":"down"},
		"backends":[{"name":"b1","ip-addr":"%s","port":"%d"}]}`, ln.Addr(), ln.Port())), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	sink := &recordSink{}
	m := New(quiet, sink, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.Sync([]*model.Farm{&fs[0]})
	go m.Run(ctx)
	var seen []string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && len(seen) < 2 {
		sink.mu.Lock()
		for _, u := range sink.updates {
			seen = append(seen, fmt.Sprintf("down=%v %s", u.Down, u.Reason))
		}
		sink.updates = nil
		sink.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	if len(seen) != 2 || seen[0] != "down=true init-state down: not checked yet" || seen[1] != "down=false connected" {
		t.Errorf("updates %q", seen)
	}
}
