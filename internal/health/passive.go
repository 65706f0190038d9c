package health

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// Passive checks: Envoy's consecutive-failure outlier detection over the
// handshakes the data plane watches (dataplane.PassiveReader; the eBPF
// plane counts them in its own conntrack, the nft plane from netfilter's
// conntrack events). An Ejector reads the counts
// every PassiveInterval and
//
//   - ejects a backend whose consecutive failures reach the farm's
//     `failures`, unless max-ejected percent of the farm's watched backends
//     are ejected already (one always may be, as in Envoy);
//   - keeps it out for ejection-time × its ejections in a row (at most
//     max-ejection-time), then returns it and has the plane start its
//     count afresh;
//   - forgets one ejection in a row for every ejection-time a backend
//     stays in (Envoy lowers the multiplier while a host stays healthy).
//
// Ejections and returns go to the engine as health updates (engine.Ejection):
// an ejected backend takes no new connections, like a down one.

// DefaultPassiveInterval is how often an Ejector reads the counts: the
// detection delay after the failure that reaches the threshold (a SYN's
// timeout itself is found up to one interval late).
const DefaultPassiveInterval = 100 * time.Millisecond

// Ejector runs passive checks' ejections.
type Ejector struct {
	log      *slog.Logger
	sink     Sink
	r        dataplane.PassiveReader
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	farms   map[string]*model.Farm // farms with a passive check
	state   map[tkey]*outlier
	pending map[tkey]engine.HealthUpdate
	resets  []tkey // backends returned: the plane's count starts afresh
}

// outlier is one watched backend.
type outlier struct {
	key      string // model.Farm.PassiveKey
	ejected  bool
	until    time.Time
	inARow   uint32    // ejections in a row: the multiplier
	decayAt  time.Time // when inARow next goes down by one
	last     dataplane.PassiveCount
	base     dataplane.PassiveCount // the last reading without consecutive failures
	capped   bool                   // over the threshold but not ejected (max-ejected): logged once
	ejectFor time.Duration
}

// NewEjector returns an ejector reading r every interval (0: the default)
// and reporting to sink. Run starts it.
func NewEjector(log *slog.Logger, sink Sink, r dataplane.PassiveReader, interval time.Duration) *Ejector {
	if interval <= 0 {
		interval = DefaultPassiveInterval
	}
	return &Ejector{log: log, sink: sink, r: r, interval: interval, now: time.Now,
		farms: map[string]*model.Farm{}, state: map[tkey]*outlier{}, pending: map[tkey]engine.HealthUpdate{}}
}

// Sync makes the watched farms those of farms with a passive check.
func (x *Ejector) Sync(farms []*model.Farm) {
	x.mu.Lock()
	defer x.mu.Unlock()
	keep := map[tkey]bool{}
	clear(x.farms)
	for _, f := range farms {
		if f.Check == nil || f.Check.Passive == nil {
			continue
		}
		x.farms[f.Name] = f
		for i := range f.Backends {
			key := f.PassiveKey(i)
			if key == "" {
				continue
			}
			k := tkey{f.Name, f.Backends[i].Name}
			keep[k] = true
			if o := x.state[k]; o != nil && o.key != key {
				// A new address, port or configuration: afresh. The
				// engine ignores the old key's ejection.
				delete(x.state, k)
			}
		}
	}
	for k := range x.state {
		if !keep[k] {
			delete(x.state, k)
		}
	}
}

// Watch keeps the ejector's farms equal to the engine's until ctx ends.
func (x *Ejector) Watch(ctx context.Context, eng *engine.Engine) {
	ch := make(chan *engine.State, 1)
	eng.Subscribe(ch)
	x.Sync(eng.Snapshot().Farms())
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			x.Sync(eng.Snapshot().Farms())
		}
	}
}

// Run reads the counts every interval until ctx ends.
func (x *Ejector) Run(ctx context.Context) {
	t := time.NewTicker(x.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := x.Step(ctx); err != nil && ctx.Err() == nil {
			x.log.Error("passive checks", "err", err)
		}
	}
}

// Step reads the counts once, ejects and returns backends, and reports to
// the sink.
func (x *Ejector) Step(ctx context.Context) error {
	x.mu.Lock()
	watching := len(x.farms) > 0
	resets := x.resets
	x.resets = nil
	x.mu.Unlock()
	for _, k := range resets {
		if err := x.r.ResetPassive(ctx, k.farm, k.backend); err != nil {
			x.log.Error("reset passive counts", "farm", k.farm, "backend", k.backend, "err", err)
		}
	}
	if !watching {
		return nil
	}
	counts, err := x.r.PassiveCounts(ctx)
	if err != nil {
		return fmt.Errorf("read passive counts: %w", err)
	}
	x.mu.Lock()
	x.observe(counts, x.now())
	batch := make([]engine.HealthUpdate, 0, len(x.pending))
	for _, u := range x.pending {
		batch = append(batch, u)
	}
	// Returns before ejections: the events then never show more
	// backends out than there are.
	slices.SortStableFunc(batch, func(a, b engine.HealthUpdate) int {
		switch {
		case a.Ejected == b.Ejected:
			return 0
		case !a.Ejected:
			return -1
		}
		return 1
	})
	clear(x.pending)
	x.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	if err := x.sink.SetHealth(ctx, batch); err != nil {
		x.mu.Lock()
		for _, u := range batch {
			if _, newer := x.pending[tkey{u.Farm, u.Backend}]; !newer {
				x.pending[tkey{u.Farm, u.Backend}] = u
			}
		}
		x.mu.Unlock()
		return fmt.Errorf("apply %d ejections: %w", len(batch), err)
	}
	return nil
}

// observe applies one reading. Callers hold mu.
func (x *Ejector) observe(counts []dataplane.PassiveCount, now time.Time) {
	byKey := make(map[tkey]dataplane.PassiveCount, len(counts))
	for _, c := range counts {
		byKey[tkey{c.Farm, c.Backend}] = c
	}
	for name, f := range x.farms {
		p := f.Check.Passive.Resolved()
		watched, ejected := 0, 0
		for i := range f.Backends {
			if f.PassiveKey(i) == "" {
				continue
			}
			watched++
			if o := x.state[tkey{name, f.Backends[i].Name}]; o != nil && o.ejected {
				ejected++
			}
		}
		// Returns first: a place freed now may be taken below. A
		// backend returned is judged again once the plane has started
		// its count afresh (at the next step).
		returned := map[tkey]bool{}
		for i := range f.Backends {
			k := tkey{name, f.Backends[i].Name}
			o := x.state[k]
			if o == nil || !o.ejected || now.Before(o.until) {
				continue
			}
			o.ejected, o.capped, o.decayAt = false, false, now.Add(p.EjectionTime)
			ejected--
			returned[k] = true
			x.resets = append(x.resets, k)
			x.pending[k] = engine.Ejection(name, k.backend, o.key, false, "ejection of "+o.ejectFor.String()+" over")
		}
		allowed := p.MaxEjectedOf(watched)
		for i := range f.Backends {
			key := f.PassiveKey(i)
			if key == "" {
				continue
			}
			k := tkey{name, f.Backends[i].Name}
			c, ok := byKey[k]
			if !ok {
				continue // not in the plane (yet)
			}
			o := x.state[k]
			if o == nil {
				o = &outlier{key: key}
				x.state[k] = o
			}
			o.last = c
			if c.Consecutive == 0 {
				o.base = c
			}
			if o.ejected || returned[k] {
				continue
			}
			if o.inARow > 0 && !now.Before(o.decayAt) {
				o.inARow--
				o.decayAt = now.Add(p.EjectionTime)
			}
			if c.Consecutive < p.Failures {
				o.capped = false
				continue
			}
			if ejected >= allowed {
				if !o.capped {
					o.capped = true
					x.log.Warn("backend not ejected: max-ejected reached", "farm", name, "backend", k.backend,
						"consecutive_failures", c.Consecutive, "ejected", ejected, "max_ejected", allowed)
				}
				continue
			}
			o.inARow++
			o.ejectFor = p.EjectionFor(o.inARow)
			o.ejected, o.capped, o.until = true, false, now.Add(o.ejectFor)
			ejected++
			reason := fmt.Sprintf("%d consecutive connection failures (%s); ejected for %s", c.Consecutive, failureKinds(o.base, c), o.ejectFor)
			x.pending[k] = engine.Ejection(name, k.backend, key, true, reason)
		}
	}
}

// failureKinds describes the failures between two readings, e.g. "3 reset
// by the backend, 2 no answer to the SYN".
func failureKinds(prev, cur dataplane.PassiveCount) string {
	var parts []string
	for _, k := range []struct {
		n    uint64
		what string
	}{
		{cur.Resets - prev.Resets, "reset by the backend"},
		{cur.Timeouts - prev.Timeouts, "no answer to the SYN"},
		{cur.Unreachable - prev.Unreachable, "ICMP unreachable"},
		{cur.Slow - prev.Slow, "answered too late"},
	} {
		if k.n > 0 && k.n < 1<<40 {
			parts = append(parts, fmt.Sprintf("%d %s", k.n, k.what))
		}
	}
	if len(parts) == 0 {
		return "connection failures"
	}
	return strings.Join(parts, ", ")
}

// PassiveStatus is what the ejector knows of one watched backend.
type PassiveStatus struct {
	Count   dataplane.PassiveCount // the last reading
	Ejected bool
	Until   time.Time // end of the ejection
	InARow  uint32    // ejections in a row (the next one lasts InARow+1 times ejection-time)
}

// PassiveStatus returns the state of a watched backend.
func (x *Ejector) PassiveStatus(farm, backend string) (PassiveStatus, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	o := x.state[tkey{farm, backend}]
	if o == nil {
		return PassiveStatus{}, false
	}
	return PassiveStatus{Count: o.last, Ejected: o.ejected, Until: o.until, InARow: o.inARow}, true
}
