package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// Start-up never refuses the daemon's own saved state. Before, one saved
// farm that no longer validated (a log-prefix of 24 invalid UTF-8 bytes,
// saved as 72 bytes) stopped the daemon from starting at all.
func TestStartNeverRefusesSavedState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := webFarm(t, "oldprefix", "10.0.0.2", "80")
	old.LogPrefix = strings.Repeat("\xff", 24) // what the API let through
	for _, f := range []model.Farm{
		webFarm(t, "good", "10.0.0.1", "80"),
		old,
		webFarm(t, "zclash", "10.0.0.1", "80"), // the same listener as good
		webFarm(t, "refused", "10.0.0.3", "80"),
	} {
		if err := st.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: &f}}}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	// A farm that does not decode at all (a mode this version does not know).
	broken := []byte(`{"name":"broken","virtual-addr":"10.0.0.9","mode":"teleport"}`)
	db, err := bolt.Open(filepath.Join(dir, store.FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("farms")).Put([]byte("broken"), broken) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	start := func(dp *fake.Plane) (*Engine, *store.Journal) {
		t.Helper()
		st, err := store.OpenJournal(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		dp.Refuse = func(f *model.Farm) error {
			if f.Name == "refused" {
				return dataplane.Unsupported("fake", f, "mode", "snat")
			}
			return nil
		}
		e, err := New(ctx, quiet, dp, st)
		if err != nil {
			t.Fatalf("start refused its own saved state: %v", err)
		}
		return e, st
	}
	dp := fake.New()
	e, st2 := start(dp)
	var got []string
	for _, p := range e.Problems() {
		got = append(got, p.Farm)
		if p.Loaded != (p.Farm == "oldprefix") {
			t.Errorf("problem %+v: loaded %v", p, p.Loaded)
		}
		if !p.Loaded {
			raw, err := os.ReadFile(p.File)
			if err != nil {
				t.Errorf("farm %s set aside to %q: %v", p.Farm, p.File, err)
			} else if p.Farm == "broken" && string(raw) != string(broken) {
				t.Errorf("set-aside file holds %q, want the saved bytes %q", raw, broken)
			}
		}
	}
	if !slices.Equal(got, []string{"broken", "oldprefix", "refused", "zclash"}) {
		t.Fatalf("problems %v", e.Problems())
	}
	for _, p := range e.Problems() {
		if p.Farm == "oldprefix" && !strings.Contains(p.Problem, "log-prefix") {
			t.Errorf("problem of oldprefix: %q", p.Problem)
		}
	}
	// The loaded state, the kernel and the disk agree: good and oldprefix.
	if n := e.Snapshot().Len(); n != 2 || len(dp.Farms()) != 2 || savedNames(t, st2) != "good,oldprefix" {
		t.Fatalf("state %d farms, kernel %v, saved %s", n, dp.Farms(), savedNames(t, st2))
	}
	// Fixing the farm through a change clears its problem.
	fixed := webFarm(t, "oldprefix", "10.0.0.2", "80")
	if err := put(e, fixed); err != nil {
		t.Fatal(err)
	}
	for _, p := range e.Problems() {
		if p.Farm == "oldprefix" {
			t.Errorf("problem kept after the fix: %+v", p)
		}
	}
}

// If the kernel refuses the saved state with a farm that no longer
// validates, the daemon serves the others and sets that one aside.
func TestStartSetsAsideWhatTheKernelRefuses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	bad := webFarm(t, "bad", "10.0.0.2", "80")
	bad.LogPrefix = strings.Repeat("\xff", 24)
	good := webFarm(t, "good", "10.0.0.1", "80")
	for _, f := range []model.Farm{good, bad} {
		if err := st.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: &f}}}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	st, err = store.OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dp := fake.New()
	dp.FailReconcile = func(farms []*model.Farm) error {
		for _, f := range farms {
			if f.Name == "bad" {
				return errors.New("prefix too long")
			}
		}
		return nil
	}
	e, err := New(ctx, quiet, dp, st)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if ps := e.Problems(); len(ps) != 1 || ps[0].Farm != "bad" || ps[0].Loaded || !strings.Contains(ps[0].Problem, "kernel refused") {
		t.Fatalf("problems %+v", ps)
	}
	if savedNames(t, st) != "good" || len(dp.Farms()) != 1 {
		t.Fatalf("saved %s, kernel %v", savedNames(t, st), dp.Farms())
	}
}
