package nft

import (
	"context"
	"fmt"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

var _ dataplane.DriftRepairer = (*Plane)(nil)

// RepairDrift implements dataplane.DriftRepairer: only the tables the
// watch saw others change (inet or netdev of the same name) are
// reconciled (the counter table too), and a table whose farms are not
// those the plane holds;
// with events lost, or no watch, every table. Reconciling all 32 tables
// of the default layout takes most of a second on a busy machine; one
// table, a few milliseconds.
func (s *Plane) RepairDrift(ctx context.Context, farms []*model.Farm) error {
	byVIP := farms             // as Reconcile
	farms = asMarkFarms(farms) // farms chosen by source table, as Reconcile (sourcetable.go)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return errClosed
	}
	dirty, all := s.watch.takeDirty()
	for i, part := range s.split(farms) {
		p := s.shards[i]
		if !all && !dirty[p.opts.Table] && p.holds(part) {
			continue
		}
		if err := p.reconcile(ctx, part); err != nil {
			// Not repaired: the next repair looks at it again.
			s.watch.markDirty(map[string]bool{p.opts.Table: true}, false)
			return fmt.Errorf("table inet %s: %w", p.opts.Table, err)
		}
	}
	// The counter table: a change's batch adds its elements, so a
	// counter table deleted by others fails every change until it is
	// back (nft flush ruleset takes it with the farms' tables).
	if s.ctr != nil && (all || dirty[s.ctr.table.Name]) {
		if err := s.reconcileCounters(byVIP); err != nil {
			s.watch.markDirty(map[string]bool{s.ctr.table.Name: true}, false)
			return err
		}
	}
	return nil
}

// holds reports whether the shard holds farms of these names (what Apply
// and Reconcile gave it), and no other.
func (p *shard) holds(farms []*model.Farm) bool {
	if len(farms) != len(p.farms) {
		return false
	}
	for _, f := range farms {
		if _, ok := p.farms[f.Name]; !ok {
			return false
		}
	}
	return true
}
