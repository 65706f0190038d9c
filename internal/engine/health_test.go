package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

func checkedFarm(t testing.TB, check string, more ...string) model.Farm {
	extra := ""
	for _, m := range more {
		extra += "," + m
	}
	return farm(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","scheduler":"weight","check":`+check+`,
		"backends":[{"name":"b1","ip-addr":"10.1.0.1","weight":"10"},{"name":"b2","ip-addr":"10.1.0.2","weight":"10"},
		{"name":"b3","ip-addr":"10.1.0.3","weight":"10"}`+extra+`]}`)
}

// down returns the update of backend b of the current farm "web" going down.
func down(t *testing.T, e *Engine, b, reason string) HealthUpdate {
	u := Up("web", b, key(t, e, b), reason)
	u.Down = true
	return u
}

func key(t *testing.T, e *Engine, b string) string {
	t.Helper()
	f, _ := e.Snapshot().Farm("web")
	_, i := f.Backend(b)
	c, ok := f.Resolve(i)
	if !ok {
		t.Fatalf("backend %s not checked", b)
	}
	return f.CheckKey(i, &c)
}

func planeWeights(dp *fake.Plane) string {
	f := dp.Farms()["web"]
	s := ""
	for _, b := range f.Backends {
		s += fmt.Sprintf("%s:%d:%s ", b.Name, b.Weight, b.State)
	}
	return s
}

type recordFlusher struct{ flushed []string }

func (r *recordFlusher) FlushBackend(_ context.Context, f *model.Farm, b *model.Backend) (int, error) {
	r.flushed = append(r.flushed, f.Name+"/"+b.Name)
	return 3, nil
}

// A backend down by health takes no new connections in the data plane,
// while the desired state, the store and the dump are untouched.
func TestHealthDownIsNotConfiguration(t *testing.T) {
	e, dp, st, _ := newEngine(t)
	b := events.NewBroker(16)
	e.SetEvents(b)
	sub := b.Subscribe(0, 16)
	if err := put(e, checkedFarm(t, `{"type":"tcp"}`)); err != nil {
		t.Fatal(err)
	}
	desired, _ := e.Snapshot().Farm("web")
	want := string(desired.AppendJSON(nil))
	version := e.Snapshot().Version()
	if err := e.SetHealth(context.Background(), []HealthUpdate{down(t, e, "b2", "connect refused")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:0:up b3:10:up " {
		t.Errorf("plane: %s", got)
	}
	now, _ := e.Snapshot().Farm("web")
	if string(now.AppendJSON(nil)) != want || e.Snapshot().Version() != version {
		t.Errorf("health changed the desired state")
	}
	saved, err := st.Load(context.Background())
	if err != nil || len(saved) != 1 || string(saved[0].AppendJSON(nil)) != want {
		t.Errorf("health reached the store: %v", err)
	}
	hs, _ := e.FarmHealth(now)
	if hs[1].State != HealthDown || hs[1].Reason != "connect refused" || hs[1].Weight != 0 || hs[1].Downs != 1 || hs[0].State != HealthUp {
		t.Errorf("health: %+v", hs)
	}
	if s := HealthSuffix(now, hs, 1); s != " health down weight 0 (connect refused)" {
		t.Errorf("listing suffix %q", s)
	}
	ev := <-sub.C
	if ev.Kind != events.KindHealth || ev.Backend != "b2" || ev.State != "down" || ev.Reason != "connect refused" {
		t.Errorf("event %+v", ev)
	}
	// A change of the farm's configuration keeps b2 out of the plane.
	g := desired.Clone()
	g.Backends[0].Weight = 20
	if err := put(e, g); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:20:up b2:0:up b3:10:up " {
		t.Errorf("plane after a change: %s", got)
	}
	// Back up.
	if err := e.SetHealth(context.Background(), []HealthUpdate{Up("web", "b2", key(t, e, "b2"), "HTTP 200")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:20:up b2:10:up b3:10:up " {
		t.Errorf("plane after coming back: %s", got)
	}
	// The same update again is no change: no kernel transaction.
	n := dp.Applies()
	if err := e.SetHealth(context.Background(), []HealthUpdate{Up("web", "b2", key(t, e, "b2"), "HTTP 200")}); err != nil {
		t.Fatal(err)
	}
	if dp.Applies() != n {
		t.Errorf("a repeated update was applied")
	}
}

// Results for a check that has changed since are ignored, and a change of
// a backend's check forgets its health.
func TestHealthStaleAndReset(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	if err := put(e, checkedFarm(t, `{"type":"tcp"}`)); err != nil {
		t.Fatal(err)
	}
	stale := down(t, e, "b1", "timeout after 1s")
	stale.Key = "10.1.0.1 {\"type\":\"tcp\",\"port\":\"81\"}"
	if err := e.SetHealth(context.Background(), []HealthUpdate{stale, {Farm: "nope", Backend: "b1", Down: true}}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up " {
		t.Errorf("stale update applied: %s", got)
	}
	if err := e.SetHealth(context.Background(), []HealthUpdate{down(t, e, "b1", "timeout after 1s")}); err != nil {
		t.Fatal(err)
	}
	f, _ := e.Snapshot().Farm("web")
	g := f.Clone()
	g.Check = &model.Check{Type: model.CheckHTTP}
	if err := put(e, g); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up " {
		t.Errorf("health kept across a change of check: %s", got)
	}
	// A farm whose checks are removed is served as configured.
	if err := e.SetHealth(context.Background(), []HealthUpdate{down(t, e, "b3", "HTTP 503")}); err != nil {
		t.Fatal(err)
	}
	f, _ = e.Snapshot().Farm("web")
	g = f.Clone()
	g.Check = nil
	if err := put(e, g); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up " {
		t.Errorf("health kept after the check was removed: %s", got)
	}
}

// on-down flush: the plane gets state down (the eBPF plane expires its
// flows) and the flusher cuts the rest.
func TestHealthFlush(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	fl := &recordFlusher{}
	e.SetFlowFlusher(fl)
	if err := put(e, checkedFarm(t, `{"type":"tcp","on-down":"flush"}`)); err != nil {
		t.Fatal(err)
	}
	if err := e.SetHealth(context.Background(), []HealthUpdate{down(t, e, "b1", "connect refused")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:down b2:10:up b3:10:up " {
		t.Errorf("plane: %s", got)
	}
	if len(fl.flushed) != 1 || fl.flushed[0] != "web/b1" {
		t.Errorf("flushed %v", fl.flushed)
	}
}

// The sorry server stands by while the quorum holds and serves alone when
// it is lost; hysteresis keeps it from flapping.
func TestHealthQuorumSorry(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	b := events.NewBroker(16)
	e.SetEvents(b)
	f := checkedFarm(t, `{"type":"tcp","quorum":"2","hysteresis":"1","sorry-server":"sorry"}`, `{"name":"sorry","ip-addr":"10.1.0.9","weight":"5"}`)
	if err := put(e, f); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up sorry:0:up " {
		t.Errorf("quorum held: %s", got)
	}
	ctx := context.Background()
	// 2 up: 2 >= quorum-hysteresis = 1, still held.
	if err := e.SetHealth(ctx, []HealthUpdate{down(t, e, "b1", "x")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:0:up b2:10:up b3:10:up sorry:0:up " {
		t.Errorf("one down: %s", got)
	}
	// 0 up: lost.
	if err := e.SetHealth(ctx, []HealthUpdate{down(t, e, "b2", "x"), down(t, e, "b3", "x")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:0:up b2:0:up b3:0:up sorry:5:up " {
		t.Errorf("quorum lost: %s", got)
	}
	// 2 up: below quorum+hysteresis = 3, still lost; the sorry server
	// still serves alone.
	if err := e.SetHealth(ctx, []HealthUpdate{Up("web", "b1", key(t, e, "b1"), ""), Up("web", "b2", key(t, e, "b2"), "")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:0:up b2:0:up b3:0:up sorry:5:up " {
		t.Errorf("two back, hysteresis: %s", got)
	}
	if _, lost := e.FarmHealth(dp.Farms()["web"]); !lost {
		t.Error("quorum not reported lost")
	}
	if err := e.SetHealth(ctx, []HealthUpdate{Up("web", "b3", key(t, e, "b3"), "")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up sorry:0:up " {
		t.Errorf("quorum regained: %s", got)
	}
	var kinds []string
	for _, ev := range b.Recent() {
		if ev.Kind == events.KindQuorum {
			kinds = append(kinds, ev.State)
		}
	}
	if fmt.Sprint(kinds) != "[lost regained]" {
		t.Errorf("quorum events %v", kinds)
	}
}

// Warm-up and agent percentages scale the weight; a weight above zero
// never rounds down to zero.
func TestHealthWeights(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	if err := put(e, checkedFarm(t, `{"type":"agent","port":"7777"}`)); err != nil {
		t.Fatal(err)
	}
	a := Up("web", "b1", key(t, e, "b1"), "agent 50%")
	a.Percent = 50
	r := Up("web", "b2", key(t, e, "b2"), "warm-up")
	r.Ramp = 10
	x := Up("web", "b3", key(t, e, "b3"), "weight 3")
	x.Weight = 3
	if err := e.SetHealth(context.Background(), []HealthUpdate{a, r, x}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:5:up b2:1:up b3:3:up " {
		t.Errorf("plane: %s", got)
	}
	d := Up("web", "b1", key(t, e, "b1"), "agent drain")
	d.Percent = 0
	if err := e.SetHealth(context.Background(), []HealthUpdate{d}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:0:up b2:1:up b3:3:up " {
		t.Errorf("plane after drain: %s", got)
	}
}

// A data plane that refuses a health change records nothing: the checker
// sends the update again.
func TestHealthApplyFails(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	if err := put(e, checkedFarm(t, `{"type":"tcp"}`)); err != nil {
		t.Fatal(err)
	}
	dp.FailApply = func(plan.Diff) error { return fake.ErrInjected }
	err := e.SetHealth(context.Background(), []HealthUpdate{down(t, e, "b1", "x")})
	if !errors.Is(err, fake.ErrInjected) {
		t.Fatalf("err %v", err)
	}
	f, _ := e.Snapshot().Farm("web")
	if hs, _ := e.FarmHealth(f); hs[0].State != HealthUp {
		t.Errorf("refused health recorded: %+v", hs[0])
	}
	dp.FailApply = nil
	if err := e.SetHealth(context.Background(), []HealthUpdate{down(t, e, "b1", "x")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:0:up b2:10:up b3:10:up " {
		t.Errorf("plane: %s", got)
	}
}

// At start-up, before any check, a sorry server stands by.
func TestHealthStartSorry(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dp := fake.New()
	e, err := New(context.Background(), quiet, dp, st)
	if err != nil {
		t.Fatal(err)
	}
	f := checkedFarm(t, `{"type":"tcp","sorry-server":"b3"}`)
	if err := put(e, f); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st2, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	dp2 := fake.New()
	if _, err := New(context.Background(), quiet, dp2, st2); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp2); got != "b1:10:up b2:10:up b3:0:up " {
		t.Errorf("plane at start: %s", got)
	}
}

// A passive check's ejection takes the backend out of the data plane like a
// down one, apart from its active check's health; an ejection under an old
// passive key is ignored; the return puts it back.
func TestPassiveEjection(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	b := events.NewBroker(16)
	e.SetEvents(b)
	sub := b.Subscribe(0, 16)
	if err := put(e, checkedFarm(t, `{"type":"tcp","passive":{"failures":"3"}}`)); err != nil {
		t.Fatal(err)
	}
	f, _ := e.Snapshot().Farm("web")
	pk := f.PassiveKey(1)
	ctx := context.Background()
	if err := e.SetHealth(ctx, []HealthUpdate{Ejection("web", "b2", "stale", true, "x")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up " {
		t.Errorf("a stale ejection reached the plane: %s", got)
	}
	if err := e.SetHealth(ctx, []HealthUpdate{Ejection("web", "b2", pk, true, "3 consecutive connection failures")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:0:up b3:10:up " {
		t.Errorf("plane: %s", got)
	}
	hs, _ := e.FarmHealth(f)
	if hs[1].State != HealthEjected || !hs[1].Ejected || hs[1].Ejections != 1 || !hs[1].Watched || hs[0].State != HealthUp {
		t.Errorf("health: %+v", hs)
	}
	if s := HealthSuffix(f, hs, 1); s != " health ejected weight 0 (3 consecutive connection failures)" {
		t.Errorf("listing suffix %q", s)
	}
	// Down by its active check too: still out; the active check's
	// return does not bring it back while ejected.
	if err := e.SetHealth(ctx, []HealthUpdate{down(t, e, "b2", "connect refused")}); err != nil {
		t.Fatal(err)
	}
	if err := e.SetHealth(ctx, []HealthUpdate{Up("web", "b2", key(t, e, "b2"), "ok")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:0:up b3:10:up " {
		t.Errorf("plane with b2 up by its check but ejected: %s", got)
	}
	if err := e.SetHealth(ctx, []HealthUpdate{Ejection("web", "b2", pk, false, "ejection of 30s over")}); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up " {
		t.Errorf("plane after the return: %s", got)
	}
	var states []string
	for len(sub.C) > 0 {
		ev := <-sub.C
		states = append(states, ev.State)
	}
	if got := strings.Join(states, ","); got != "ejected,down,up,returned" {
		t.Errorf("events %s", got)
	}
	// A change of the passive configuration forgets the ejection.
	if err := e.SetHealth(ctx, []HealthUpdate{Ejection("web", "b2", pk, true, "again")}); err != nil {
		t.Fatal(err)
	}
	if err := put(e, checkedFarm(t, `{"type":"tcp","passive":{"failures":"4"}}`)); err != nil {
		t.Fatal(err)
	}
	if got := planeWeights(dp); got != "b1:10:up b2:10:up b3:10:up " {
		t.Errorf("plane after a new passive configuration: %s", got)
	}
}
