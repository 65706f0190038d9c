package nft

import (
	"context"
	"log/slog"
	"sync"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// The nft plane offers dataplane.TablePlane through a Tables of its own,
// opened on first use: its nft table is apart from the farms', so the farm
// code needs no change for it.

var (
	_ dataplane.TablePlane         = (*Plane)(nil)
	_ dataplane.TableDescriber     = (*Plane)(nil)
	_ dataplane.TableCounterReader = (*Plane)(nil)
)

// lazyTables opens a plane's Tables when first needed.
type lazyTables struct {
	mu sync.Mutex
	t  *Tables
}

func (l *lazyTables) get(ctx context.Context, log *slog.Logger, opts Options) (*Tables, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.t == nil {
		t, err := OpenTables(ctx, log, opts)
		if err != nil {
			return nil, err
		}
		l.t = t
	}
	return l.t, nil
}

func (l *lazyTables) describe(tb *model.Table) string {
	l.mu.Lock()
	t := l.t
	l.mu.Unlock()
	if t == nil {
		return "nftables (not opened yet)"
	}
	return t.TableAlgorithm(tb)
}

func (l *lazyTables) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.t != nil {
		l.t.Close()
		l.t = nil
	}
}

// CheckTable implements dataplane.TablePlane.
func (s *Plane) CheckTable(t *model.Table) error { return nil }

// ApplyTables implements dataplane.TablePlane.
func (s *Plane) ApplyTables(ctx context.Context, d plan.TableDiff) error {
	t, err := s.tables.get(ctx, s.log, s.opts)
	if err != nil {
		return err
	}
	return t.ApplyTables(ctx, d)
}

// ReconcileTables implements dataplane.TablePlane.
func (s *Plane) ReconcileTables(ctx context.Context, tables []*model.Table, farms []*model.Farm) error {
	t, err := s.tables.get(ctx, s.log, s.opts)
	if err != nil {
		return err
	}
	return t.ReconcileTables(ctx, tables, farms)
}

// TableAlgorithm implements dataplane.TableDescriber.
func (s *Plane) TableAlgorithm(tb *model.Table) string { return s.tables.describe(tb) }

// TableCounters implements dataplane.TableCounterReader.
func (s *Plane) TableCounters(ctx context.Context, tb *model.Table) (dataplane.TableCounters, error) {
	t, err := s.tables.get(ctx, s.log, s.opts)
	if err != nil {
		return nil, err
	}
	return t.TableCounters(ctx, tb)
}
