package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// How a change with tables reaches the kernel and the disk. Tables go first
// in the kernel (a farm never serves without a policy it is given), and on
// disk what creates goes before the farms and what destroys after (a crash
// between the two writes never leaves a saved farm naming a table that is
// not saved).

func (e *Engine) tablePlane() (dataplane.TablePlane, error) {
	tp, ok := e.dp.(dataplane.TablePlane)
	if !ok {
		return nil, &NotSupportedError{Msg: fmt.Sprintf("the %s data plane does not keep named tables", e.dp.Name())}
	}
	return tp, nil
}

// applyKernel applies a change's tables and farms, tables first; if the
// farms fail the tables are taken back.
func (e *Engine) applyKernel(ctx context.Context, diff plan.Diff, tdiff plan.TableDiff) error {
	var tp dataplane.TablePlane
	if !tdiff.Empty() {
		var err error
		if tp, err = e.tablePlane(); err != nil {
			return err
		}
		if err := tp.ApplyTables(ctx, tdiff); err != nil {
			return fmt.Errorf("tables: %w", err)
		}
	}
	if diff.Empty() {
		return nil
	}
	if err := e.dp.Apply(ctx, diff); err != nil {
		if tp != nil {
			if rerr := tp.ApplyTables(context.WithoutCancel(ctx), tdiff.Inverse()); rerr != nil {
				e.log.Error("taking back the tables of a change the kernel refused failed", "err", rerr)
			}
		}
		return err
	}
	return nil
}

// unapplyKernel takes back a change applyKernel applied.
func (e *Engine) unapplyKernel(ctx context.Context, diff plan.Diff, tdiff plan.TableDiff) error {
	var err error
	if !diff.Empty() {
		err = e.dp.Apply(ctx, diff.Inverse())
	}
	if !tdiff.Empty() {
		if tp, ok := e.dp.(dataplane.TablePlane); ok {
			err = errors.Join(err, tp.ApplyTables(ctx, tdiff.Inverse()))
		}
	}
	return err
}

// splitTableDiff separates what a diff destroys (saved after the farms)
// from the rest (saved before).
func splitTableDiff(d plan.TableDiff) (first, last plan.TableDiff) {
	first.Addresses = d.Addresses
	for _, c := range d.Tables {
		if c.New == nil {
			last.Tables = append(last.Tables, c)
		} else {
			first.Tables = append(first.Tables, c)
		}
	}
	for _, c := range d.Slots {
		if c.New == nil {
			last.Slots = append(last.Slots, c)
		} else {
			first.Slots = append(first.Slots, c)
		}
	}
	return first, last
}

// noTables reports whether d saves nothing of tables (its Farms are saved
// with the farms).
func noTables(d plan.TableDiff) bool { return len(d.Tables)+len(d.Slots)+len(d.Addresses) == 0 }

// save writes a change to disk. A store that saves farms and tables as one
// unit (store.ChangeStore: the daemon's journal) takes it in one commit, with
// one undo for both; otherwise tables that are created or changed go first,
// the farms, then tables that are destroyed, and if a step fails, the steps
// before it are taken back.
func (e *Engine) save(ctx context.Context, diff plan.Diff, tdiff plan.TableDiff) error {
	if cs, ok := e.store.(store.ChangeStore); ok && !noTables(tdiff) {
		return cs.CommitChange(ctx, diff, tdiff)
	}
	first, last := splitTableDiff(tdiff)
	var ts store.TableStore
	if !noTables(first) || !noTables(last) {
		var ok bool
		if ts, ok = e.store.(store.TableStore); !ok {
			return errors.New("save state: this store does not keep tables")
		}
	}
	if !noTables(first) {
		if err := ts.CommitTables(ctx, first); err != nil {
			return err
		}
	}
	undoFirst := func() {
		if !noTables(first) {
			if err := ts.CommitTables(context.WithoutCancel(ctx), first.Inverse()); err != nil {
				e.log.Error("taking back saved tables failed", "err", err)
			}
		}
	}
	if !diff.Empty() {
		if err := e.store.Commit(ctx, diff); err != nil {
			undoFirst()
			return err
		}
	}
	if !noTables(last) {
		if err := ts.CommitTables(ctx, last); err != nil {
			if !diff.Empty() {
				e.revertDisk(ctx, diff, plan.TableDiff{})
			}
			undoFirst()
			return err
		}
	}
	return nil
}

// revertTablesOnDisk takes back the tables of a change save wrote.
func (e *Engine) revertTablesOnDisk(ctx context.Context, tdiff plan.TableDiff) error {
	if noTables(tdiff) {
		return nil
	}
	ts, ok := e.store.(store.TableStore)
	if !ok {
		return nil
	}
	return ts.CommitTables(ctx, tdiff.Inverse())
}

// loadTables puts the saved tables into the load transaction.
func (e *Engine) loadTables(ctx context.Context, tx *Txn) error {
	ts, ok := e.store.(store.TableStore)
	if !ok {
		return nil
	}
	tables, err := ts.LoadTables(ctx)
	if err != nil {
		return err
	}
	if err := tx.loadTables(tables); err != nil {
		return fmt.Errorf("saved state: %w", err)
	}
	return nil
}

// reconcileTables makes the kernel hold the state's tables and policies.
func (e *Engine) reconcileTables(ctx context.Context, s *State) error {
	tp, ok := e.dp.(dataplane.TablePlane)
	if !ok {
		if s.ts.tables.Len() > 0 {
			return fmt.Errorf("the saved state has %d tables but the %s data plane does not keep named tables", s.ts.tables.Len(), e.dp.Name())
		}
		return nil
	}
	var users []*model.Farm
	for _, f := range s.Farms() {
		if usesTables(f) {
			users = append(users, f)
		}
	}
	if err := tp.ReconcileTables(ctx, s.Tables(), users); err != nil {
		return fmt.Errorf("reconcile %s data plane's tables with saved state: %w", e.dp.Name(), err)
	}
	return nil
}

// ExpireEntries removes the table entries whose timeout has passed, in one
// change; the daemon calls it every second. It returns how many it removed.
func (e *Engine) ExpireEntries(ctx context.Context) (int, error) {
	if !e.hasExpiring() {
		return 0, nil
	}
	n := 0
	_, err := e.Change(ctx, func(tx *Txn) error {
		n = tx.expireEntries(e.now().Unix())
		return nil
	})
	return n, err
}

// RunExpiry removes expired entries every interval until ctx ends.
func (e *Engine) RunExpiry(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := e.ExpireEntries(ctx); err != nil {
			e.log.Error("removing expired table entries failed", "err", err)
		} else if n > 0 {
			e.log.Debug("expired table entries removed", "entries", n)
		}
	}
}

func (e *Engine) hasExpiring() bool {
	s := e.cur.Load()
	it := s.ts.tables.Root().Iterator()
	for _, t, ok := it.Next(); ok; _, t, ok = it.Next() {
		if t.Expiring() > 0 {
			return true
		}
	}
	return false
}

// TableAlgorithm says how the data plane holds the table in the kernel.
func (e *Engine) TableAlgorithm(t *model.Table) string {
	if d, ok := e.dp.(dataplane.TableDescriber); ok {
		return d.TableAlgorithm(t)
	}
	return e.dp.Name()
}
