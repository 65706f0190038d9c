package store

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// WriteBehind is the store of the Kubernetes proxy: it writes changes to an
// inner store (bbolt) in the background, after Commit has returned,
// merging changes that pile up into one write.
//
// For `xlb daemon` the store is the source of truth and every change is
// fsynced before it is acknowledged. For the Kubernetes proxy the API server
// is the source of truth: the saved state only lets a restarted proxy keep
// the kernel's rules in place until its first full reconcile, which
// rewrites them from the API server anyway. Saving behind the kernel takes
// the disk out of the time from an EndpointSlice change to traffic (the
// fsync of one bbolt transaction costs ~2 ms at 1,000 farms and ~5 ms at
// 10,000 here). A write that fails is retried with the next changes and
// logged; losing the last changes in a crash costs nothing but a slightly
// older state at the next start.
type WriteBehind struct {
	inner Store
	log   *slog.Logger

	mu      sync.Mutex
	pending map[string]*merged
	order   []string
	closed  bool

	kick chan struct{}
	done chan struct{}
}

type merged struct{ old, new *model.Farm }

// NewWriteBehind starts saving to inner in the background. Close flushes
// what is pending and closes inner.
func NewWriteBehind(inner Store, log *slog.Logger) *WriteBehind {
	w := &WriteBehind{inner: inner, log: log, pending: map[string]*merged{},
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	go w.loop()
	return w
}

var _ Store = (*WriteBehind)(nil)

// Load implements Store.
func (w *WriteBehind) Load(ctx context.Context) ([]model.Farm, error) { return w.inner.Load(ctx) }

// Commit implements Store: it queues the diff and returns.
func (w *WriteBehind) Commit(ctx context.Context, d plan.Diff) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return errors.New("save state: store closed")
	}
	for _, c := range d.Changes {
		name := ""
		if c.New != nil {
			name = c.New.Name
		} else if c.Old != nil {
			name = c.Old.Name
		}
		if c.Old != nil && c.New != nil && c.Old.Name != c.New.Name {
			w.add(c.Old.Name, c.Old, nil)
		}
		w.add(name, c.Old, c.New)
	}
	w.kickLocked()
	w.mu.Unlock()
	return nil
}

// kickLocked wakes the writer; w.mu is held, so Close cannot close the
// channel under it.
func (w *WriteBehind) kickLocked() {
	if w.closed {
		return
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *WriteBehind) add(name string, old, nf *model.Farm) {
	m, ok := w.pending[name]
	if !ok {
		m = &merged{old: old}
		w.pending[name] = m
		w.order = append(w.order, name)
	}
	if m.old == nil {
		m.old = old
	}
	m.new = nf
}

// take returns the pending changes as one diff and clears them.
func (w *WriteBehind) take() plan.Diff {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d plan.Diff
	for _, name := range w.order {
		m := w.pending[name]
		switch {
		case m.new != nil:
			d.Changes = append(d.Changes, plan.FarmChange{New: m.new})
		case m.old != nil:
			d.Changes = append(d.Changes, plan.FarmChange{Old: m.old})
		}
	}
	w.pending = map[string]*merged{}
	w.order = nil
	return d
}

// requeue puts a diff that failed to save back in front of newer changes.
func (w *WriteBehind) requeue(d plan.Diff) {
	w.mu.Lock()
	defer w.mu.Unlock()
	newer, order := w.pending, w.order
	w.pending, w.order = map[string]*merged{}, nil
	for _, c := range d.Changes {
		if c.New != nil {
			w.add(c.New.Name, nil, c.New)
		} else {
			w.add(c.Old.Name, c.Old, nil)
		}
	}
	for _, name := range order {
		m := newer[name]
		w.add(name, m.old, m.new)
	}
}

func (w *WriteBehind) loop() {
	defer close(w.done)
	failing := false
	for range w.kick {
		d := w.take()
		if d.Empty() {
			continue
		}
		if err := w.inner.Commit(context.Background(), d); err != nil {
			if !failing {
				w.log.Error("save kube-proxy state failed; retrying in the background", "err", err)
			}
			failing = true
			w.requeue(d)
			time.AfterFunc(time.Second, func() {
				w.mu.Lock()
				w.kickLocked()
				w.mu.Unlock()
			})
			continue
		}
		if failing {
			w.log.Info("saving kube-proxy state works again")
			failing = false
		}
	}
}

// Flush saves what is pending now (for tests and Close).
func (w *WriteBehind) Flush(ctx context.Context) error {
	d := w.take()
	if d.Empty() {
		return nil
	}
	if err := w.inner.Commit(ctx, d); err != nil {
		w.requeue(d)
		return err
	}
	return nil
}

// Close stops the background writer, saves what is pending and closes the
// inner store.
func (w *WriteBehind) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.kick)
	w.mu.Unlock()
	<-w.done
	err := w.Flush(context.Background())
	return errors.Join(err, w.inner.Close())
}

func (w *WriteBehind) pendingLen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

var _ TableStore = (*WriteBehind)(nil)

// LoadTables implements TableStore: the inner store's tables (none if it
// keeps none).
func (w *WriteBehind) LoadTables(ctx context.Context) ([]*model.Table, error) {
	ts, ok := w.inner.(TableStore)
	if !ok {
		return nil, nil
	}
	return ts.LoadTables(ctx)
}

// CommitTables implements TableStore. Tables are written through, not
// behind: the proxy's tables (loadBalancerSourceRanges allow lists) change
// only when a Service's ranges do, so the fsync is rarely paid, and a
// table is on disk before a farm that attaches it (which the engine saves
// after it) can be. A farm saved later than the destruction of its table
// is dropped with a load problem at the next start and rewritten by the
// first full reconcile.
func (w *WriteBehind) CommitTables(ctx context.Context, d plan.TableDiff) error {
	ts, ok := w.inner.(TableStore)
	if !ok {
		return errors.New("save tables: the proxy's store keeps no tables")
	}
	return ts.CommitTables(ctx, d)
}
