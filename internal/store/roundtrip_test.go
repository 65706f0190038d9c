package store_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/model/modeltest"
	"github.com/xlb-lb/xlb/internal/store"
)

// Every farm the API accepts survives save -> restart -> load unchanged,
// validates again, and the daemon starts on it without a problem. Before,
// a log-prefix of invalid UTF-8 was accepted, saved as U+FFFD characters,
// and refused at the next start.
func TestAcceptedFarmsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(15, 1))
	want := map[string]string{}
	var current map[string]*model.Farm = map[string]*model.Farm{}
	accepted := 0
	for i := range 4000 {
		body := modeltest.FarmJSON(r, fmt.Sprintf("f%03d", i%300))
		fs, err := model.DecodeFarms([]byte(body), func(string) (*model.Farm, bool) { return nil, false })
		if err != nil {
			continue
		}
		accepted++
		f := fs[0]
		f.Seal()
		// Saved as the engine saves a change: the journal, one record a
		// change, the farm replacing its earlier version.
		if err := st.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: current[f.Name], New: &f}}}); err != nil {
			t.Fatal(err)
		}
		current[f.Name] = &f
		want[f.Name] = string(f.AppendJSON(nil))
	}
	if accepted < 200 {
		t.Fatalf("only %d of 4000 random farms accepted: the generator is too strict to test much", accepted)
	}
	st.Close()

	st, err = store.OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	saved, err := st.LoadSaved(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(saved) != len(want) {
		t.Fatalf("%d farms saved, %d loaded", len(want), len(saved))
	}
	for _, sf := range saved {
		if sf.Err != nil {
			t.Errorf("saved farm %s cannot be read: %v", sf.Name, sf.Err)
			continue
		}
		if got := string(sf.Farm.AppendJSON(nil)); got != want[sf.Name] {
			t.Errorf("farm %s changed across the restart:\nsaved  %s\nloaded %s", sf.Name, want[sf.Name], got)
		}
		if err := sf.Farm.Validate(); err != nil {
			t.Errorf("farm %s was accepted but its saved form is refused: %v", sf.Name, err)
		}
	}
	// The daemon's start-up takes it all, without a problem (farms that
	// clash with another on one listener aside: the generator reuses VIPs,
	// and the engine, not the codec, refuses those).
	e, err := engine.New(ctx, slog.New(slog.DiscardHandler), fake.New(), st)
	if err != nil {
		t.Fatalf("start on the saved state: %v", err)
	}
	for _, p := range e.Problems() {
		if p.Loaded {
			t.Errorf("start-up found a saved farm invalid: %+v", p)
		}
	}
	t.Logf("%d random farms accepted, %d distinct saved and loaded unchanged", accepted, len(want))
}
