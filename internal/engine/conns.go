package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// observeHooks are what the engine is given to be observed: set once at
// start-up, read without the writer's lock.
type observeHooks struct {
	mu       sync.RWMutex
	observer ChangeObserver
}

// ChangeObserver is told of every change the engine commits or refuses
// (internal/observe turns them into metrics). It must not block.
type ChangeObserver interface {
	ObserveChange(c ChangeStats)
}

// ChangeStats describe one change.
type ChangeStats struct {
	// Farms is the number of farms the change touched.
	Farms int
	// Kernel is the data plane's transaction, Disk the store's write
	// (both run at once), Total the whole change from the transaction's
	// start to its publication (zero for a refused change).
	Kernel, Disk, Total time.Duration
	// Err is the kernel's or the disk's error; nil when committed.
	Err error
}

// SetObserver makes the engine report its changes to o.
func (e *Engine) SetObserver(o ChangeObserver) {
	e.hooks.mu.Lock()
	defer e.hooks.mu.Unlock()
	e.hooks.observer = o
}

func (e *Engine) observe(c ChangeStats) {
	e.hooks.mu.RLock()
	o := e.hooks.observer
	e.hooks.mu.RUnlock()
	if o != nil {
		o.ObserveChange(c)
	}
}

func (e *Engine) connLister() (dataplane.ConnLister, error) {
	if l, ok := e.dp.(dataplane.ConnLister); ok {
		return l, nil
	}
	return nil, &NotSupportedError{Msg: fmt.Sprintf("the %s data plane cannot list connections", e.dp.Name())}
}

// connFarms returns the farms whose connections are asked for: the one
// named farm, or every farm when farm is "". The filter's backend must be
// one of theirs.
func (e *Engine) connFarms(s *State, farm string, flt dataplane.ConnFilter) ([]*model.Farm, error) {
	var farms []*model.Farm
	if farm == "" {
		farms = s.Farms()
	} else {
		f, ok := s.Farm(farm)
		if !ok {
			return nil, &NotFoundError{What: fmt.Sprintf("farm %q", farm)}
		}
		farms = []*model.Farm{f}
	}
	if flt.Backend != "" {
		found := false
		for _, f := range farms {
			if _, i := f.Backend(flt.Backend); i >= 0 {
				found = true
				break
			}
		}
		if !found && farm != "" {
			return nil, &NotFoundError{What: fmt.Sprintf("farm %q backend %q", farm, flt.Backend)}
		}
		if !found {
			return nil, &NotFoundError{What: fmt.Sprintf("backend %q (in any farm)", flt.Backend)}
		}
	}
	// Farms that listen nowhere have nothing in the kernel.
	listening := farms[:0:0]
	for _, f := range farms {
		if f.Listens() {
			listening = append(listening, f)
		}
	}
	return listening, nil
}

// Connections lists the tracked connections of a farm (every farm when
// farm is "") that match flt, like ipvsadm -Lc. Connections are kernel
// state: reading them takes no lock of the engine.
func (e *Engine) Connections(ctx context.Context, farm string, flt dataplane.ConnFilter) ([]dataplane.Conn, error) {
	s := e.Snapshot()
	farms, err := e.connFarms(s, farm, flt)
	if err != nil {
		return nil, err
	}
	l, err := e.connLister()
	if err != nil {
		return nil, err
	}
	if len(farms) == 0 {
		return nil, nil
	}
	flt.Owners = e.connOwners(s)
	return l.Connections(ctx, farms, flt)
}

// DeleteConnections deletes the tracked connections of a farm that match
// flt and returns how many it deleted.
func (e *Engine) DeleteConnections(ctx context.Context, farm string, flt dataplane.ConnFilter) (int, error) {
	s := e.Snapshot()
	farms, err := e.connFarms(s, farm, flt)
	if err != nil {
		return 0, err
	}
	l, err := e.connLister()
	if err != nil {
		return 0, err
	}
	if len(farms) == 0 {
		return 0, nil
	}
	flt.Owners = e.connOwners(s)
	return l.DeleteConnections(ctx, farms, flt)
}

// CountConns counts the active and inactive connections of every backend
// of the given farms, and the table's entries, in one walk of the
// connection table. ok is false when the data plane cannot count them.
func (e *Engine) CountConns(ctx context.Context, farms []*model.Farm) (dataplane.ConnTable, bool, error) {
	c, ok := e.dp.(dataplane.ConnCounter)
	if !ok {
		return dataplane.ConnTable{}, false, nil
	}
	t, err := c.CountConns(ctx, farms, e.connOwners(e.Snapshot()))
	return t, true, err
}

// ownersMemo is the connection owners of one published state.
type ownersMemo struct {
	state  *State
	owners *plan.ConnOwners
}

// connOwners is buildConnOwners of s, built once per published state: a
// scrape of /metrics counts connections every few seconds, and building
// them from 16,000 farms cost 4.4 ms and 4.4 MB each time
// (BenchmarkConnOwners). A State is never changed once published, and
// ConnOwners is only read.
func (e *Engine) connOwners(s *State) *plan.ConnOwners {
	if m := e.owners.Load(); m != nil && m.state == s {
		return m.owners
	}
	o := buildConnOwners(s)
	e.owners.Store(&ownersMemo{state: s, owners: o})
	return o
}

// buildConnOwners tells the farms of a shared VIP, protocol and port apart
// in the connection tables (plan.ConnOwners): every farm of s counts, not
// only those listed.
func buildConnOwners(s *State) *plan.ConnOwners {
	farms := s.Farms()
	tables := map[string]*model.Table{}
	for _, f := range farms {
		if t, ok := s.Table(f.SourceTable); ok && f.SourceTable != "" {
			tables[f.SourceTable] = t
		}
	}
	return plan.NewConnOwners(farms, tables)
}

// Dataplane returns the engine's data plane, for readers of its optional
// interfaces (counters, packet statistics).
func (e *Engine) Dataplane() dataplane.Dataplane { return e.dp }
