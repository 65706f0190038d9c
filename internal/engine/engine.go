// Package engine is xlb's one writer. Every change, from the API (which the
// CLI uses) or from Kubernetes, goes through Engine.Change, which serializes
// it: validate -> diff against the current state -> the data plane applies
// the diff to the kernel as one transaction while the store commits it to
// disk -> publish the new immutable state. If the kernel or the disk fails,
// both are returned to the old state and the caller gets the error.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	iradix "github.com/hashicorp/go-immutable-radix/v2"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// NotFoundError says a named object does not exist (HTTP 404).
type NotFoundError struct{ What string }

func (e *NotFoundError) Error() string { return e.What + " does not exist" }

// ConflictError says a change clashes with another object (HTTP 409).
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

// Engine owns the desired state.
type Engine struct {
	log   *slog.Logger
	dp    dataplane.Dataplane
	store store.Store

	mu  sync.Mutex // serializes writers; readers use cur
	cur atomic.Pointer[State]
	// problems of the saved state found at start (load.go).
	problems atomic.Pointer[[]Problem]

	// now is the clock table entries' timeouts count on (tests set it).
	now func() time.Time

	subMu sync.Mutex
	subs  []chan<- *State

	// health: backends' health and the effective farms the data plane
	// holds (health.go).
	health healthTable
	// hooks: the change observer and the connection table (conns.go).
	hooks observeHooks

	// drift: changes to the kernel by others, and their repairs
	// (drift.go).
	drift driftState

	// owners: the connection owners of the last state they were asked
	// for (conns.go).
	owners atomic.Pointer[ownersMemo]
}

// New loads the saved state, checks it, and reconciles the kernel with it
// (without flushing anything, so traffic through existing farms never stops).
//
// If the kernel refuses the saved state and the store remembers its last
// change, that change is taken back and the rest started: Change writes the
// disk while the kernel applies, so a crash can leave a last change on disk
// that the kernel never took (and whose caller never got an answer).
func New(ctx context.Context, log *slog.Logger, dp dataplane.Dataplane, st store.Store) (*Engine, error) {
	e := &Engine{log: log, dp: dp, store: st, health: newHealthTable(), now: time.Now}
	l, err := e.loadSaved(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := e.reconcileTables(ctx, l.state); err != nil {
		// As below for farms: the last saved change may be a table change
		// the kernel never took.
		u, ok := st.(store.Undoer)
		if !ok {
			return nil, err
		}
		names, uerr := u.UndoLast(ctx)
		if uerr != nil || len(names) == 0 {
			return nil, errors.Join(err, uerr)
		}
		log.Warn("the kernel refused the saved tables; taking back the last saved change, which a crash left unconfirmed",
			"changes", names, "err", err)
		if l, err = e.loadSaved(ctx); err != nil {
			return nil, err
		}
		if err := e.reconcileTables(ctx, l.state); err != nil {
			return nil, err
		}
	}
	if err := dp.Reconcile(ctx, kernelFarms(e.startFarms(l.state))); err != nil {
		err = fmt.Errorf("reconcile %s data plane with saved state: %w", dp.Name(), err)
		if len(l.invalid) > 0 {
			// Saved farms that no longer validate may be what the kernel
			// refuses: serve the others, set those aside (their saved
			// JSON goes to a file, nothing is lost).
			log.Warn("the kernel refused the saved state; trying again without the saved farms that no longer validate", "err", err)
			l.withoutInvalid(e, err)
			if rerr := dp.Reconcile(ctx, kernelFarms(e.startFarms(l.state))); rerr != nil {
				err = fmt.Errorf("reconcile %s data plane with saved state (without the farms that no longer validate): %w", dp.Name(), rerr)
			} else {
				err = nil
			}
		}
		if u, ok := st.(store.Undoer); ok && err != nil {
			names, uerr := u.UndoLast(ctx)
			if uerr != nil || len(names) == 0 {
				return nil, errors.Join(err, uerr)
			}
			log.Warn("the kernel refused the saved state; taking back the last saved change, which a crash left unconfirmed",
				"changes", names, "err", err)
			aside := l
			if l, err = e.loadSaved(ctx); err != nil {
				return nil, err
			}
			l.keepAside(e, aside)
			if err := e.reconcileTables(ctx, l.state); err != nil {
				return nil, err
			}
			if err := dp.Reconcile(ctx, kernelFarms(e.startFarms(l.state))); err != nil {
				return nil, fmt.Errorf("reconcile %s data plane with saved state (without its last change): %w", dp.Name(), err)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	e.report(ctx, l)
	s := l.state
	s.version = 1 // the load is the first version, however many builds it took
	log.Info("state loaded", "farms", s.Len(), "tables", s.ts.tables.Len(), "problems", len(e.Problems()), "dataplane", dp.Name(), "reconcile", time.Since(start))
	e.cur.Store(s)
	return e, nil
}

// load reads and checks the saved state.
func (e *Engine) load(ctx context.Context) (*State, error) {
	farms, err := e.store.Load(ctx)
	if err != nil {
		return nil, err
	}
	tx := e.begin(emptyState())
	if err := e.loadTables(ctx, tx); err != nil {
		return nil, err
	}
	if err := e.loadAddresses(ctx, tx); err != nil {
		return nil, err
	}
	for i := range farms {
		if err := tx.Put(farms[i]); err != nil {
			return nil, fmt.Errorf("saved state: %w", err)
		}
	}
	if err := tx.validate(); err != nil {
		return nil, fmt.Errorf("saved state: %w", err)
	}
	if err := tx.validateTables(); err != nil {
		return nil, fmt.Errorf("saved state: %w", err)
	}
	return tx.build(tx.diff()), nil
}

// Snapshot returns the current state. It never blocks.
func (e *Engine) Snapshot() *State { return e.cur.Load() }

// Subscribe registers a channel that receives each newly published state.
// Sends never block: a slow subscriber misses intermediate versions but
// always sees a later one.
func (e *Engine) Subscribe(ch chan<- *State) {
	e.subMu.Lock()
	defer e.subMu.Unlock()
	e.subs = append(e.subs, ch)
}

// Change runs fn on a transaction over the current state and commits what fn
// did as one unit. If fn returns an error nothing changes.
func (e *Engine) Change(ctx context.Context, fn func(tx *Txn) error) (*State, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	base := e.cur.Load()
	tx := e.begin(base)
	tStart := time.Now()
	if err := fn(tx); err != nil {
		return base, err
	}
	tFn := time.Now()
	tx.settleAddresses()
	if err := tx.validate(); err != nil {
		return base, err
	}
	if err := tx.validateTables(); err != nil {
		return base, err
	}
	diff := tx.diff()
	// The tables' plane gets the farms the kernel gets (kernelDiff).
	tdiff := tx.tableDiff(kernelDiff(diff))
	tdiff.Addresses = tx.addressDiff()
	if diff.Empty() && tdiff.Empty() && len(tdiff.Addresses) == 0 {
		return base, nil
	}
	// A store that cannot take the change (read-only, or its directory
	// gone) refuses it before the kernel sees it.
	if g, ok := e.store.(store.Guard); ok {
		if err := g.Writable(); err != nil {
			return base, err
		}
	}
	// The disk and the kernel take the change at the same time: the commit
	// costs the slower of the two, not their sum. Whichever fails, the other
	// is taken back, so the caller's error means nothing changed.
	t0 := time.Now()
	saved := make(chan error, 1)
	var diskTime time.Duration
	go func() {
		err := e.save(ctx, diff, tdiff)
		diskTime = time.Since(t0)
		saved <- err
	}()
	// The data plane takes the effective farms (health.go), without
	// those that listen nowhere (listen.go), tables first (tables_apply.go).
	pdiff, effs, lost := e.planeDiff(diff)
	kdiff := kernelDiff(pdiff)
	kerr := e.applyKernel(ctx, kdiff, tdiff)
	// Never on top of a kernel that others changed (drift.go).
	var next *State
	kerr = e.settleDrift(ctx, kerr, base, func() (*State, []*model.Farm) {
		next = tx.build(diff)
		return next, e.nextFarms(next, pdiff)
	}, kdiff, tdiff)
	t1 := time.Now()
	derr := <-saved
	if kerr != nil || derr != nil {
		e.observe(ChangeStats{Farms: len(diff.Changes), Kernel: t1.Sub(t0), Disk: diskTime, Err: errors.Join(kerr, derr)})
	}
	switch {
	case kerr != nil && derr != nil:
		return base, fmt.Errorf("apply to %s data plane: %w", e.dp.Name(), kerr)
	case kerr != nil:
		e.revertDisk(ctx, diff, tdiff)
		return base, fmt.Errorf("apply to %s data plane: %w", e.dp.Name(), kerr)
	case derr != nil:
		// The kernel has the change but the disk does not: undo the kernel
		// side so both agree with what the caller is told (nothing changed).
		if rerr := e.unapplyKernel(context.WithoutCancel(ctx), kdiff, tdiff); rerr != nil {
			e.log.Error("rollback failed; reconciling the whole data plane", "err", rerr)
			if rerr := e.reconcileTables(context.WithoutCancel(ctx), base); rerr != nil {
				e.log.Error("reconcile of tables after failed rollback failed", "err", rerr)
			}
			if rerr := e.dp.Reconcile(context.WithoutCancel(ctx), kernelFarms(e.effectiveFarms(base))); rerr != nil {
				e.log.Error("reconcile after failed rollback failed", "err", rerr)
			}
		}
		return base, derr
	}
	t2 := time.Now()
	e.commitHealth(diff, effs, lost)
	if next == nil {
		next = tx.build(diff)
	}
	e.cur.Store(next)
	e.publish(next)
	e.clearProblems(tx.order)
	e.observe(ChangeStats{Farms: len(diff.Changes), Kernel: t1.Sub(t0), Disk: diskTime, Total: time.Since(tStart)})
	// Phase timings at debug level: where a slow change spends its time
	// (kernel transaction, fsync, snapshot build) without a profiler.
	e.log.Debug("change committed", "farms_changed", len(diff.Changes),
		"decode", tFn.Sub(tStart), "validate", t0.Sub(tFn),
		"kernel", t1.Sub(t0), "disk", diskTime, "commit", t2.Sub(t0), "publish", time.Since(t2))
	return next, nil
}

// revertDisk takes back a diff the disk saved but the kernel refused.
func (e *Engine) revertDisk(ctx context.Context, diff plan.Diff, tdiff plan.TableDiff) {
	ctx = context.WithoutCancel(ctx)
	if cs, ok := e.store.(store.ChangeStore); ok && !noTables(tdiff) {
		if err := cs.RevertChange(ctx, diff, tdiff); err != nil {
			e.log.Error("taking back a change the kernel refused from the saved state failed", "err", err)
		}
		return
	}
	var err error
	switch u, ok := e.store.(store.Undoer); {
	case diff.Empty():
	case ok:
		err = u.Revert(ctx, diff)
	default:
		err = e.store.Commit(ctx, diff.Inverse())
	}
	if terr := e.revertTablesOnDisk(ctx, tdiff); terr != nil {
		err = errors.Join(err, terr)
	}
	if err != nil {
		// The disk keeps a change the kernel refused; a restart tries it
		// again, and if the kernel refuses it then, takes it back (New).
		e.log.Error("taking back a change the kernel refused from the saved state failed", "err", err)
	}
}

func (e *Engine) publish(s *State) {
	e.subMu.Lock()
	defer e.subMu.Unlock()
	for _, ch := range e.subs {
		select {
		case ch <- s:
		default:
		}
	}
}

// Reconcile re-applies the whole current state to the kernel, repairing
// drift (rules changed or deleted by hand), and returns the number of
// farms the state holds. POST /reconcile, `xlb reconcile` and SIGHUP
// call it.
func (e *Engine) Reconcile(ctx context.Context) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drift.asked.Add(1)
	var seen uint64
	var serr error = errors.New("not watched")
	if e.drift.w != nil {
		seen, serr = e.drift.w.DriftSeen(ctx)
	}
	s := e.cur.Load()
	if err := e.reconcileTables(ctx, s); err != nil {
		return 0, err
	}
	if err := e.dp.Reconcile(ctx, kernelFarms(e.effectiveFarms(s))); err != nil {
		return 0, err
	}
	if serr == nil {
		e.drift.done = seen
	}
	return s.Len(), nil
}

// Txn is a working copy of the state inside Engine.Change.
type Txn struct {
	e       *Engine
	base    *State
	farms   map[string]*model.Farm // changed farms: nil value = deleted
	order   []string               // change order, for a deterministic diff
	replace bool                   // every farm not Put is deleted
	tt      *tableTxn              // tables touched (tables.go); nil: none
	at      *addrTxn               // unused addresses touched (addresses.go); nil: none
}

func (e *Engine) begin(base *State) *Txn {
	return &Txn{e: e, base: base, farms: map[string]*model.Farm{}}
}

// Get returns the farm as it stands in this transaction.
func (tx *Txn) Get(name string) (*model.Farm, bool) {
	if f, changed := tx.farms[name]; changed {
		return f, f != nil
	}
	if tx.replace {
		return nil, false
	}
	return tx.base.Farm(name)
}

// Put adds or replaces a farm. The farm is validated on its own here and
// against the other farms at commit.
func (tx *Txn) Put(f model.Farm) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if f.Listens() {
		if err := tx.e.dp.Check(&f); err != nil {
			return err
		}
	}
	nf := f.Clone()
	nf.Seal()
	tx.mark(nf.Name)
	tx.farms[nf.Name] = &nf
	return nil
}

// Delete removes a farm; it is an error if it does not exist.
func (tx *Txn) Delete(name string) error {
	if _, ok := tx.Get(name); !ok {
		return &NotFoundError{What: fmt.Sprintf("farm %q", name)}
	}
	tx.mark(name)
	tx.farms[name] = nil
	return nil
}

// ReplaceAll makes the transaction start from an empty state: farms not Put
// afterwards are deleted (restore).
func (tx *Txn) ReplaceAll() {
	tx.replaceAllTables()
	tx.replace = true
	for _, f := range tx.base.Farms() {
		if _, changed := tx.farms[f.Name]; !changed {
			tx.mark(f.Name)
			tx.farms[f.Name] = nil
		}
	}
}

func (tx *Txn) mark(name string) {
	if _, seen := tx.farms[name]; !seen {
		tx.order = append(tx.order, name)
	}
}

// validate checks the changed farms against every other farm: no two farms
// may claim the same VIP, protocol and port (or the same mark).
func (tx *Txn) validate() error {
	// Farms this transaction puts, by listener key: built once, so a bulk
	// change of n farms costs O(n), not O(n^2).
	changedByKey := make(map[string][]string)
	for _, name := range tx.order {
		if f := tx.farms[name]; f != nil {
			for _, k := range listenerKeys(f) {
				changedByKey[string(k)] = append(changedByKey[string(k)], name)
			}
		}
	}
	for _, name := range tx.order {
		f := tx.farms[name]
		if f == nil || f.State == model.StateOff {
			continue
		}
		for _, key := range listenerKeys(f) {
			// Farms on this listener as this transaction leaves them: those
			// already there (unless changed away) and those put here.
			others, _ := tx.base.listeners.Get(key)
			for i, list := range [][]string{others, changedByKey[string(key)]} {
				for _, other := range list {
					if other == name {
						continue
					}
					g, ok := tx.Get(other)
					if !ok || g.State == model.StateOff {
						continue
					}
					// Those put here are on key (changedByKey), and so
					// are those already there that this transaction did
					// not change (the index). Only a changed one may have
					// moved away: listensOn builds its keys (two
					// allocations), and was called for every farm on the
					// VIP, O(n^2) in a bulk change of n farms on one VIP.
					if i == 0 {
						if _, changed := tx.farms[other]; changed && !listensOn(g, key) {
							continue
						}
					}
					if clash, proto, where := overlap(f, g, key); clash {
						if err := shareBySource(f, g, key, proto, where); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// diff lists what the transaction changed, skipping puts equal to the base.
func (tx *Txn) diff() plan.Diff {
	var d plan.Diff
	for _, name := range tx.order {
		old, _ := tx.base.Farm(name)
		nf := tx.farms[name]
		if old == nil && nf == nil {
			continue
		}
		if old != nil && nf != nil && farmsEqual(old, nf) {
			continue
		}
		d.Changes = append(d.Changes, plan.FarmChange{Old: old, New: nf})
	}
	return d
}

// build returns the new published state; diff is tx.diff().
func (tx *Txn) build(diff plan.Diff) *State {
	farms := tx.base.farms.Txn()
	listeners := tx.base.listeners.Txn()
	for _, name := range tx.order {
		nf := tx.farms[name]
		if old, ok := tx.base.Farm(name); ok {
			if nf != nil && farmsEqual(old, nf) {
				continue
			}
			farms.Delete([]byte(name))
			for _, k := range listenerKeys(old) {
				removeListener(listeners, k, name)
			}
		}
		if nf != nil {
			farms.Insert([]byte(name), nf)
			for _, k := range listenerKeys(nf) {
				cur, _ := listeners.Get(k)
				listeners.Insert(k, append(slices.Clone(cur), name))
			}
		}
	}
	return &State{farms: farms.Commit(), listeners: listeners.Commit(), version: tx.base.version + 1, ts: tx.buildTables(diff), addrs: tx.buildAddresses()}
}

func removeListener(t *iradix.Txn[[]string], key []byte, name string) {
	cur, _ := t.Get(key)
	next := slices.DeleteFunc(slices.Clone(cur), func(n string) bool { return n == name })
	if len(next) == 0 {
		t.Delete(key)
		return
	}
	t.Insert(key, next)
}

// farmsEqual compares two farms by their canonical encoding.
func farmsEqual(a, b *model.Farm) bool { return model.SameJSON(a, b) }

// IsNotFound reports whether err is a NotFoundError.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}
