package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Drift: the kernel changed by anything but xlb (`nft flush ruleset`,
// firewalld, an iptables-nft restore, a map entry deleted with bpftool).
// The engine's view of the kernel holds only while nothing else touches
// it, so:
//
//   - WatchDrift has the data plane watch its kernel objects
//     (dataplane.DriftWatcher) and reconciles the kernel with the state
//     once the changes settle (driftQuiet after the last, at most
//     driftMaxWait after the first): traffic is back within a second.
//   - Change asks the plane, after applying, whether the kernel drifted
//     since the last reconcile (the plane's DriftSeen has read every
//     change committed before it). If it did, the change landed on a
//     kernel that differs from the engine's view: the kernel is
//     reconciled with the new state before the change is acknowledged.
//     If the change failed and the kernel drifted (a batch naming a table
//     someone deleted), the kernel is reconciled with the old state and
//     the change applied again.
//   - Reconcile (POST /reconcile, `xlb reconcile`, SIGHUP) does it on
//     demand.
//
// Each repair is counted (DriftStats) and logged with what changed.

// Settling of the watch's repairs.
const (
	driftQuiet   = 100 * time.Millisecond
	driftMaxWait = 500 * time.Millisecond
	// driftRetry: a failed repair is tried again after this, doubling
	// up to driftRetryMax.
	driftRetry    = time.Second
	driftRetryMax = 30 * time.Second
)

// DriftStats are the engine's counters of drift and its repairs.
type DriftStats struct {
	// Watching: the data plane watches its kernel objects.
	Watching bool
	// Seen counts the changes by others the data plane saw (a
	// transaction, or a poll that found differences, counts once).
	Seen uint64
	// Repairs counts the reconciles that repaired drift, by the watch
	// or before a change was acknowledged; Failed the repairs that
	// failed (tried again).
	Repairs uint64
	Failed  uint64
	// Reconciles counts the reconciles asked for (Reconcile).
	Reconciles uint64
}

type driftState struct {
	w        dataplane.DriftWatcher // nil: not watching
	done     uint64                 // (e.mu) what w had seen at the last reconcile
	watching atomic.Bool
	seen     atomic.Uint64
	repairs  atomic.Uint64
	failed   atomic.Uint64
	asked    atomic.Uint64

	mu    sync.Mutex
	whats []string // what changed, since the last repair
}

// DriftStats returns the drift counters.
func (e *Engine) DriftStats() DriftStats {
	return DriftStats{
		Watching:   e.drift.watching.Load(),
		Seen:       e.drift.seen.Load(),
		Repairs:    e.drift.repairs.Load(),
		Failed:     e.drift.failed.Load(),
		Reconciles: e.drift.asked.Load(),
	}
}

// WatchDrift starts the data plane's watch and the repairs it triggers,
// until ctx ends. A plane that cannot watch (not a DriftWatcher) is not
// an error: it returns false.
func (e *Engine) WatchDrift(ctx context.Context) (bool, error) {
	w, ok := e.dp.(dataplane.DriftWatcher)
	if !ok {
		return false, nil
	}
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	err := w.WatchDrift(ctx, func(what string) {
		e.drift.seen.Add(1)
		e.drift.mu.Lock()
		if len(e.drift.whats) < 8 {
			e.drift.whats = append(e.drift.whats, what)
		}
		e.drift.mu.Unlock()
		e.log.Warn("kernel drift: xlb's kernel objects changed by another program", "dataplane", e.dp.Name(), "change", what)
		poke()
	})
	if err != nil {
		return false, fmt.Errorf("watch the %s data plane for drift: %w", e.dp.Name(), err)
	}
	e.mu.Lock()
	e.drift.w = w
	// Whatever happened before the watch ran is repaired by the start-up
	// reconcile or the next one: count from here.
	if n, err := w.DriftSeen(ctx); err == nil {
		e.drift.done = n
	}
	e.mu.Unlock()
	e.drift.watching.Store(true)
	go e.repairLoop(ctx, kick, poke)
	return true, nil
}

// repairLoop repairs drift once its changes settle.
func (e *Engine) repairLoop(ctx context.Context, kick <-chan struct{}, poke func()) {
	defer e.drift.watching.Store(false)
	retry := driftRetry
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		// Let a burst of changes (firewalld rewriting its ruleset, a
		// script deleting rules one by one) settle into one repair.
		deadline := time.NewTimer(driftMaxWait)
		quiet := time.NewTimer(driftQuiet)
	settle:
		for {
			select {
			case <-ctx.Done():
				deadline.Stop()
				quiet.Stop()
				return
			case <-kick:
				quiet.Reset(driftQuiet)
			case <-quiet.C:
				break settle
			case <-deadline.C:
				break settle
			}
		}
		deadline.Stop()
		quiet.Stop()
		if err := e.repairDrift(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			// Try again later (the kernel may refuse while another
			// program holds it, say): the drift is still there.
			time.AfterFunc(retry, poke)
			retry = min(2*retry, driftRetryMax)
			continue
		}
		retry = driftRetry
	}
}

// repairDrift reconciles the kernel with the current state if the plane
// saw changes by others since the last reconcile.
func (e *Engine) repairDrift(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	seen, serr := e.drift.w.DriftSeen(ctx)
	if serr == nil && seen <= e.drift.done {
		return nil // a change repaired it already
	}
	s := e.cur.Load()
	return e.repairLocked(ctx, seen, serr, s, e.effectiveFarms(s), "watch")
}

// drifted reports whether the plane saw changes by others since the last
// reconcile (or cannot tell). Callers hold e.mu.
func (e *Engine) drifted(ctx context.Context) (bool, uint64, error) {
	if e.drift.w == nil {
		return false, 0, nil
	}
	seen, err := e.drift.w.DriftSeen(ctx)
	if err != nil {
		return true, 0, err
	}
	return seen > e.drift.done, seen, nil
}

// repairLocked reconciles the kernel with state s, whose effective farms
// are farms, counts and logs the repair; seen (and serr) are what the
// plane's DriftSeen said before. Callers hold e.mu.
func (e *Engine) repairLocked(ctx context.Context, seen uint64, serr error, s *State, farms []*model.Farm, trigger string) error {
	start := time.Now()
	err := e.reconcileTables(ctx, s)
	if err == nil {
		if r, ok := e.dp.(dataplane.DriftRepairer); ok {
			err = r.RepairDrift(ctx, kernelFarms(farms))
		} else {
			err = e.dp.Reconcile(ctx, kernelFarms(farms))
		}
	}
	e.drift.mu.Lock()
	whats := e.drift.whats
	if err == nil {
		e.drift.whats = nil
	}
	e.drift.mu.Unlock()
	changes := strings.Join(whats, " | ")
	if serr != nil {
		changes = strings.TrimPrefix(changes+" | whether the kernel drifted cannot be told: "+serr.Error(), " | ")
	}
	if err != nil {
		e.drift.failed.Add(1)
		e.log.Error("kernel drift: repair failed; trying again", "dataplane", e.dp.Name(), "trigger", trigger, "changes", changes, "err", err)
		return fmt.Errorf("repair the %s data plane after changes by others: %w", e.dp.Name(), err)
	}
	if serr == nil {
		e.drift.done = seen
	}
	n := e.drift.repairs.Add(1)
	e.log.Warn("kernel drift repaired: the kernel holds xlb's state again", "dataplane", e.dp.Name(), "trigger", trigger,
		"farms", s.Len(), "took", time.Since(start), "repairs", n, "changes", changes)
	return nil
}

// settleDrift is called by Change once the change was applied to the
// kernel (kerr nil) or refused (kerr): a change is never acknowledged on
// top of a kernel that differs from the engine's view. base is the state
// before the change; next builds the state after and its effective farms;
// kdiff and tdiff are what was applied. It returns the change's kernel
// error: nil if the kernel now holds the new state.
func (e *Engine) settleDrift(ctx context.Context, kerr error, base *State, next func() (*State, []*model.Farm), kdiff plan.Diff, tdiff plan.TableDiff) error {
	for round := 0; ; round++ {
		drift, seen, serr := e.drifted(ctx)
		if !drift {
			return kerr
		}
		if kerr == nil {
			// The change went in, but on a kernel others changed: make
			// the kernel hold the new state as a whole.
			s, farms := next()
			err := e.repairLocked(ctx, seen, serr, s, farms, "change")
			if err == nil {
				return nil
			}
			// Neither state is known to be in the kernel: go back to
			// the old one, which the caller keeps.
			if rerr := e.repairLocked(context.WithoutCancel(ctx), seen, serr, base, e.effectiveFarms(base), "change refused"); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return err
		}
		if round > 0 {
			return kerr
		}
		// The change failed on a kernel others changed (a batch naming a
		// table that was deleted): repair, then try the change again.
		if err := e.repairLocked(ctx, seen, serr, base, e.effectiveFarms(base), "change"); err != nil {
			return errors.Join(kerr, err)
		}
		kerr = e.applyKernel(ctx, kdiff, tdiff)
	}
}

// nextFarms returns the effective farms of next, the state a change
// builds, whose changed farms' effective versions are in pdiff.
func (e *Engine) nextFarms(next *State, pdiff plan.Diff) []*model.Farm {
	changed := make(map[string]*model.Farm, len(pdiff.Changes))
	for _, c := range pdiff.Changes {
		if c.New != nil {
			changed[c.New.Name] = c.New
		}
	}
	farms := next.Farms()
	for i, f := range farms {
		if ef, ok := changed[f.Name]; ok {
			farms[i] = ef
		} else {
			farms[i] = e.effectiveFarm(f)
		}
	}
	return farms
}
