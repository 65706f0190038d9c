package observe

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/engine"
	xmodel "github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// slowCounting counts walks; each walk takes 50 ms and reports the walk's
// number as every backend's active connections.
type slowCounting struct {
	*fake.Plane
	walks *atomic.Int64
}

func (p slowCounting) CountConns(ctx context.Context, farms []*xmodel.Farm, _ *plan.ConnOwners) (dataplane.ConnTable, error) {
	n := p.walks.Add(1)
	time.Sleep(50 * time.Millisecond)
	t := dataplane.ConnTable{Backends: map[string][]dataplane.ConnCounts{}}
	for _, f := range farms {
		cs := make([]dataplane.ConnCounts, len(f.Backends))
		for i := range cs {
			cs[i].Active = uint64(n)
		}
		t.Backends[f.Name] = cs
	}
	return t, nil
}

// The first scrape waits for a walk; later ones serve the last walk and
// start the next in the background once it is ConnWalkEvery old.
func TestConnWalkInBackground(t *testing.T) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var walks atomic.Int64
	eng, err := engine.New(context.Background(), discard(), slowCounting{fake.New(), &walks}, st)
	if err != nil {
		t.Fatal(err)
	}
	putFarms(t, eng, 1, 1)
	m := New(Options{Engine: eng, NoRuntime: true, ConnWalkEvery: 200 * time.Millisecond})
	active := func() string {
		body, err := m.Expose(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "xlb_backend_connections_active{") {
				return l[strings.LastIndexByte(l, ' ')+1:]
			}
		}
		return ""
	}
	if got := active(); got != "1" || walks.Load() != 1 {
		t.Fatalf("first scrape: active %q after %d walks, want 1 after 1", got, walks.Load())
	}
	if got := active(); got != "1" || walks.Load() != 1 {
		t.Errorf("scrape within ConnWalkEvery: active %q after %d walks, want the same walk", got, walks.Load())
	}
	time.Sleep(250 * time.Millisecond)
	start := time.Now()
	if got := active(); got != "1" {
		t.Errorf("stale scrape served %q, want the last walk's 1 (the next runs in the background)", got)
	}
	if took := time.Since(start); took > 40*time.Millisecond {
		t.Logf("note: the stale scrape took %v", took) // a loaded machine; the value above is what matters
	}
	// The background walk (50 ms) is served once it ends: poll for it,
	// as a loaded machine may take longer.
	got := ""
	for deadline := time.Now().Add(5 * time.Second); got != "2" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got = active()
	}
	if got != "2" {
		t.Errorf("after the background walk: active %q, want 2", got)
	}
}
