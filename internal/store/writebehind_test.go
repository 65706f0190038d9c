package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

func wbFarm(name string, backends int) *model.Farm {
	f := model.NewFarm(name)
	f.VirtualAddr = netip.MustParseAddr("10.96.0.1")
	for i := range backends {
		b := model.NewBackend(fmt.Sprintf("10.0.0.%d-80", i+1))
		b.Addr = netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})
		f.Backends = append(f.Backends, b)
	}
	f.Seal()
	return &f
}

type flakyStore struct {
	Store
	fail atomic.Int32
}

func (s *flakyStore) Commit(ctx context.Context, d plan.Diff) error {
	if s.fail.Load() > 0 {
		s.fail.Add(-1)
		return errors.New("disk full")
	}
	return s.Store.Commit(ctx, d)
}

// TestWriteBehind: changes are saved in the background, merged per farm,
// kept and retried when a write fails, and all saved by Close.
func TestWriteBehind(t *testing.T) {
	dir := t.TempDir()
	bolt, err := OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	inner := &flakyStore{Store: bolt}
	inner.fail.Store(2)
	w := NewWriteBehind(inner, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	a1, a2, b, c := wbFarm("a", 1), wbFarm("a", 2), wbFarm("b", 1), wbFarm("c", 1)
	for _, d := range []plan.Diff{
		{Changes: []plan.FarmChange{{New: a1}, {New: b}}},
		{Changes: []plan.FarmChange{{Old: a1, New: a2}, {New: c}}},
		{Changes: []plan.FarmChange{{Old: b}}},
	} {
		if err := w.Commit(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	// The first two background writes fail; a retry a second later saves.
	deadline := time.Now().Add(10 * time.Second)
	for inner.fail.Load() > 0 || w.pendingLen() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("pending changes not saved after 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := w.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: c}}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: c}}}); err == nil {
		t.Error("Commit after Close succeeded")
	}
	bolt, err = OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	farms, err := bolt.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range farms {
		names = append(names, f.Name)
	}
	if !slices.Equal(names, []string{"a"}) || len(farms[0].Backends) != 2 {
		t.Errorf("saved farms %v, want only a with 2 backends", names)
	}
}
