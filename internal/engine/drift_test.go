package engine

import (
	"context"
	"testing"
	"time"
)

// waitFor polls cond every 10 ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// A farm deleted from the kernel by another program comes back within a
// second, without a restart, and the repair is counted.
func TestDriftRepairedByWatch(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	if err := put(e, webFarm(t, "web", "10.0.0.1", "80"), webFarm(t, "api", "10.0.0.2", "80")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if ok, err := e.WatchDrift(ctx); !ok || err != nil {
		t.Fatalf("WatchDrift: %v %v", ok, err)
	}
	dp.Tamper("web")
	start := time.Now()
	if !waitFor(time.Second, func() bool { _, ok := dp.Farms()["web"]; return ok }) {
		t.Fatal("the farm deleted by hand is not back within a second")
	}
	t.Logf("repaired after %s", time.Since(start))
	st := e.DriftStats()
	if !st.Watching || st.Seen != 1 || st.Repairs != 1 || st.Failed != 0 {
		t.Errorf("stats %+v, want watching, 1 seen, 1 repair", st)
	}
	// xlb's own changes are no drift: nothing more is repaired.
	if err := put(e, webFarm(t, "db", "10.0.0.3", "80")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(driftMaxWait + 100*time.Millisecond)
	if st := e.DriftStats(); st.Repairs != 1 {
		t.Errorf("repairs after an own change: %+v", st)
	}
}

// A change made right after another program changed the kernel, before
// the watch repaired it, is acknowledged only once the kernel holds the
// whole new state; a change that fails because of the drift (its table
// deleted) is applied after a repair instead of failing.
func TestChangeAfterDrift(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	if err := put(e, webFarm(t, "web", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := e.WatchDrift(ctx); err != nil {
		t.Fatal(err)
	}
	dp.Tamper("web")
	if err := put(e, webFarm(t, "api", "10.0.0.2", "80")); err != nil {
		t.Fatal(err)
	}
	if got := dp.Farms(); len(got) != 2 || got["web"] == nil {
		t.Fatalf("acknowledged on top of a drifted kernel: it holds %v", keys(got))
	}
	// The table deleted: Apply fails until a reconcile.
	dp.Tamper("")
	if err := put(e, webFarm(t, "db", "10.0.0.3", "80")); err != nil {
		t.Fatalf("a change after the table was deleted: %v", err)
	}
	if got := dp.Farms(); len(got) != 3 {
		t.Fatalf("the kernel holds %v, want web, api, db", keys(got))
	}
	if st := e.DriftStats(); st.Repairs != 2 {
		t.Errorf("stats %+v, want 2 repairs", st)
	}
}

// Reconcile on demand (POST /reconcile, SIGHUP) repairs without a watch.
func TestReconcileOnDemand(t *testing.T) {
	e, dp, _, _ := newEngine(t)
	if err := put(e, webFarm(t, "web", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	dp.Tamper("")
	n, err := e.Reconcile(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("Reconcile: %d %v", n, err)
	}
	if dp.Farms()["web"] == nil {
		t.Fatal("not repaired")
	}
	if st := e.DriftStats(); st.Reconciles != 1 || st.Watching {
		t.Errorf("stats %+v", st)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
