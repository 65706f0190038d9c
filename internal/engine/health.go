package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/model"
)

// Health is kept apart from the desired state. The checkers (internal/health)
// report each backend's health with SetHealth; the engine keeps it next to
// the desired farms and hands the data plane the *effective* farm: backends
// down by health take no new connections (weight 0, or state down when the
// farm asks to flush them), weights are scaled by warm-up and agents, and a
// sorry server serves while the farm's quorum is lost. The desired state,
// what the store saves and what GET /farms dumps, never changes; a health
// change is applied to the data plane alone, as a change of the farms it
// touches.

// HealthUpdate is one backend's health as its checker sees it.
type HealthUpdate struct {
	Farm, Backend string
	// Key is the model.Farm.CheckKey the result was found under; an update
	// whose key is not the backend's current one is stale and ignored.
	Key    string
	Down   bool
	Reason string // why it went down or up: "connect refused", "HTTP 503", "timeout after 1s", ...
	// Percent scales the backend's weight (an agent's "75%"; "drain" is
	// 0 while up). 100: unchanged.
	Percent uint32
	// Weight, when not negative, replaces the configured weight (an exec
	// check's "weight N").
	Weight int32
	// Ramp is the warm-up's share of the weight, per mille: 1000 once
	// warmed up.
	Ramp uint32
	// Passive: the update is a passive check's ejection (Ejected) or
	// return, not an active check's result; Key is then the backend's
	// model.Farm.PassiveKey, and Down, Percent, Weight and Ramp are
	// not used. An ejected backend takes no new connections, as a down
	// one, whatever its active check says.
	Passive bool
	Ejected bool
}

// Ejection returns a passive check's update: backend ejected (or back).
func Ejection(farm, backend, key string, ejected bool, reason string) HealthUpdate {
	return HealthUpdate{Farm: farm, Backend: backend, Key: key, Passive: true, Ejected: ejected, Reason: reason}
}

// ejection is the engine's record of a backend ejected by passive checks.
type ejection struct {
	key    string
	reason string
	since  time.Time
}

// Up returns the update of a backend that is up at full weight.
func Up(farm, backend, key, reason string) HealthUpdate {
	return HealthUpdate{Farm: farm, Backend: backend, Key: key, Reason: reason, Percent: 100, Weight: -1, Ramp: 1000}
}

// healthEntry is the engine's record of a checked backend.
type healthEntry struct {
	key     string
	down    bool
	reason  string
	since   time.Time
	percent uint32
	weight  int32
	ramp    uint32
	downs   uint64 // transitions to down
	ups     uint64 // transitions back up
}

func (h *healthEntry) sameState(u *HealthUpdate) bool {
	return h.down == u.Down && h.percent == u.Percent && h.weight == u.Weight && h.ramp == u.Ramp
}

// healthTable holds the health of checked backends and what the data
// plane was given. Writers hold Engine.mu and mu; readers hold mu only.
type healthTable struct {
	mu sync.RWMutex
	// byFarm: farm -> backend -> entry. A backend without an entry is up
	// at full weight (checks start optimistic, as keepalived's do, so a
	// daemon restart never takes backends out).
	byFarm map[string]map[string]*healthEntry
	// ejected: farm -> backend -> ejection by passive checks.
	ejected map[string]map[string]*ejection
	// ejections: farm -> backend -> ejections so far (kept after the
	// return, for the API).
	ejections map[string]map[string]uint64
	// quorumLost: farms whose quorum is lost (their sorry server serves).
	quorumLost map[string]bool
	// eff: the effective farms given to the data plane that differ from
	// the desired ones.
	eff map[string]*model.Farm
	// flusher cuts connections of backends going down in farms with
	// on-down flush when the data plane cannot (SetFlowFlusher).
	flusher dataplane.BackendFlusher
	events  *events.Broker
}

func newHealthTable() healthTable {
	return healthTable{byFarm: map[string]map[string]*healthEntry{}, ejected: map[string]map[string]*ejection{},
		ejections: map[string]map[string]uint64{}, quorumLost: map[string]bool{}, eff: map[string]*model.Farm{}}
}

// SetEvents makes the engine publish health events to b.
func (e *Engine) SetEvents(b *events.Broker) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.health.events = b
}

// SetFlowFlusher gives the engine what cuts a down backend's connections
// in farms with on-down flush, for a data plane that does not implement
// dataplane.BackendFlusher itself.
func (e *Engine) SetFlowFlusher(f dataplane.BackendFlusher) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.health.flusher = f
}

// effectiveFarm is what the data plane holds for the desired farm f (if
// it listens anywhere: listen.go): its effective version.
func (e *Engine) effectiveFarm(f *model.Farm) *model.Farm {
	if f == nil {
		return nil
	}
	if ef, ok := e.health.eff[f.Name]; ok {
		return ef
	}
	return f
}

// effectiveFarms returns the farms of s as the data plane holds them.
func (e *Engine) effectiveFarms(s *State) []*model.Farm {
	farms := s.Farms()
	if len(e.health.eff) == 0 {
		return farms
	}
	for i, f := range farms {
		farms[i] = e.effectiveFarm(f)
	}
	return farms
}

// startFarms returns the effective farms of the saved state at start-up:
// no health is known yet (every checked backend counts as up), but sorry
// servers stand by while their farm's quorum holds.
func (e *Engine) startFarms(s *State) []*model.Farm {
	clear(e.health.eff)
	clear(e.health.quorumLost)
	farms := s.Farms()
	for i, f := range farms {
		nf, lost := effective(f, nil, nil, false)
		if nf != f {
			e.health.eff[f.Name] = nf
			farms[i] = nf
		}
		if lost {
			e.health.quorumLost[f.Name] = true
		}
	}
	return farms
}

// effective returns the farm the data plane is to hold for the desired
// farm f, with health from byFarm and ejections from ej (entries under
// another key are stale and ignored), and whether its quorum is lost given
// it was (lost) before.
func effective(f *model.Farm, hs map[string]*healthEntry, ej map[string]*ejection, lost bool) (*model.Farm, bool) {
	if f == nil || !f.HasChecks() {
		return f, false
	}
	var nf *model.Farm
	edit := func() *model.Farm {
		if nf == nil {
			c := f.Clone()
			nf = &c
		}
		return nf
	}
	flush := f.Check != nil && f.Check.OnDown == model.OnDownFlush
	up, sorry := 0, -1
	for i := range f.Backends {
		b := &f.Backends[i]
		if f.Check != nil && f.Check.SorryServer == b.Name {
			sorry = i
			continue
		}
		serving := b.Serving()
		ejected := false
		if x := ej[b.Name]; x != nil && x.key == f.PassiveKey(i) {
			ejected = true
		}
		var h *healthEntry
		if x := hs[b.Name]; x != nil {
			if c, ok := f.Resolve(i); ok && x.key == f.CheckKey(i, &c) {
				h = x
			}
		}
		if h != nil || ejected {
			w := b.Weight
			if h != nil {
				w = effectiveWeight(b.Weight, h)
			}
			down := ejected || h != nil && h.down
			switch {
			case down && flush && b.State == model.StateUp:
				// State down: the eBPF plane expires the backend's
				// tracked flows; the engine flushes the rest.
				edit().Backends[i].State = model.StateDown
			case down:
				w = 0
			}
			if w != b.Weight {
				edit().Backends[i].Weight = w
			}
			serving = serving && !down && w > 0
		}
		if serving {
			up++
		}
	}
	if sorry >= 0 {
		q := max(f.Check.Quorum, 1)
		hy := f.Check.Hysteresis
		switch {
		case !lost && uint32(up) < q-hy:
			lost = true
		case lost && uint32(up) >= q+hy:
			lost = false
		}
		if lost {
			// keepalived: the sorry server serves alone; the backends
			// still up keep their connections but take no new ones.
			for i := range f.Backends {
				w := f.Backends[i].Weight
				if nf != nil {
					w = nf.Backends[i].Weight
				}
				if i != sorry && w != 0 {
					edit().Backends[i].Weight = 0
				}
			}
		} else if f.Backends[sorry].Weight != 0 {
			edit().Backends[sorry].Weight = 0
		}
	} else {
		lost = false
	}
	if nf == nil {
		return f, lost
	}
	nf.Seal()
	return nf, lost
}

// effectiveWeight is a healthy backend's weight: configured (or set by an
// exec check), scaled by an agent's percentage and the warm-up ramp. A
// weight above zero stays above zero unless a factor is zero (drain).
func effectiveWeight(configured uint32, h *healthEntry) uint32 {
	w := uint64(configured)
	if h.weight >= 0 {
		w = uint64(h.weight)
	}
	if w == 0 || h.percent == 0 || h.ramp == 0 {
		return 0
	}
	scaled := w * uint64(h.percent) * uint64(h.ramp) / (100 * 1000)
	return uint32(min(max(scaled, 1), model.MaxWeight))
}

// planeDiff turns a diff of desired farms into the diff of effective farms
// the data plane applies, and the quorum states that go with it.
func (e *Engine) planeDiff(d plan.Diff) (plan.Diff, map[string]*model.Farm, map[string]bool) {
	// Farms without checks (nearly all of a bulk change) are their own
	// effective farms: nothing is recorded for them.
	if len(e.health.eff) == 0 && !anyChecks(d) {
		return d, nil, nil
	}
	out := plan.Diff{Changes: make([]plan.FarmChange, 0, len(d.Changes))}
	effs := map[string]*model.Farm{}
	lost := map[string]bool{}
	for _, c := range d.Changes {
		old := e.effectiveFarm(c.Old)
		nw := c.New
		if nw != nil {
			var l bool
			nw, l = effective(nw, e.health.byFarm[nw.Name], e.health.ejected[nw.Name], e.health.quorumLost[nw.Name])
			if nw != c.New {
				effs[nw.Name] = nw
			}
			if l {
				lost[nw.Name] = true
			}
		}
		out.Changes = append(out.Changes, plan.FarmChange{Old: old, New: nw})
	}
	return out, effs, lost
}

// anyChecks reports whether a farm of the diff has checks, before or
// after.
func anyChecks(d plan.Diff) bool {
	for _, c := range d.Changes {
		if c.Old != nil && c.Old.HasChecks() || c.New != nil && c.New.HasChecks() {
			return true
		}
	}
	return false
}

// commitHealth records, after a change was applied, the effective farms
// and quorum states it computed, drops the health of farms deleted, and
// that of backends whose check changed (the checker starts them afresh).
func (e *Engine) commitHealth(d plan.Diff, effs map[string]*model.Farm, lost map[string]bool) {
	if effs == nil && len(e.health.byFarm) == 0 && len(e.health.ejected) == 0 && len(e.health.quorumLost) == 0 && len(e.health.eff) == 0 {
		return // no farm has or had health to record (planeDiff)
	}
	e.health.mu.Lock()
	defer e.health.mu.Unlock()
	for _, c := range d.Changes {
		switch {
		case c.New == nil:
			name := c.Old.Name
			delete(e.health.eff, name)
			delete(e.health.byFarm, name)
			delete(e.health.ejected, name)
			delete(e.health.ejections, name)
			delete(e.health.quorumLost, name)
			continue
		}
		name := c.New.Name
		if ef := effs[name]; ef != nil && ef != c.New {
			e.health.eff[name] = ef
		} else {
			delete(e.health.eff, name)
		}
		e.setQuorum(c.New, lost[name])
		if hs := e.health.byFarm[name]; hs != nil {
			for bn, h := range hs {
				_, i := c.New.Backend(bn)
				if i < 0 {
					delete(hs, bn)
					continue
				}
				if ch, ok := c.New.Resolve(i); !ok || h.key != c.New.CheckKey(i, &ch) {
					delete(hs, bn)
				}
			}
			if len(hs) == 0 {
				delete(e.health.byFarm, name)
			}
		}
		if ej := e.health.ejected[name]; ej != nil {
			for bn, x := range ej {
				if _, i := c.New.Backend(bn); i < 0 || x.key != c.New.PassiveKey(i) {
					delete(ej, bn)
				}
			}
			if len(ej) == 0 {
				delete(e.health.ejected, name)
			}
		}
	}
}

// setQuorum records a farm's quorum state and publishes its change.
// Callers hold health.mu.
func (e *Engine) setQuorum(f *model.Farm, lost bool) {
	was := e.health.quorumLost[f.Name]
	if lost == was {
		return
	}
	if lost {
		e.health.quorumLost[f.Name] = true
	} else {
		delete(e.health.quorumLost, f.Name)
	}
	state, sorry := "regained", ""
	if lost {
		state = "lost"
	}
	if f.Check != nil {
		sorry = f.Check.SorryServer
	}
	e.log.Warn("farm quorum "+state, "farm", f.Name, "sorry_server", sorry)
	e.health.events.Publish(events.Event{Kind: events.KindQuorum, Farm: f.Name, State: state, Backend: sorry})
}

// SetHealth records checkers' results and applies the effective farms they
// change to the data plane, in one transaction of the farms touched (never
// the store: health is not configuration). Updates for farms, backends or
// checks that no longer exist are ignored. If the data plane refuses, no
// update is recorded and the error is returned: the caller sends them again.
func (e *Engine) SetHealth(ctx context.Context, updates []HealthUpdate) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.cur.Load()
	type accepted struct {
		u    *HealthUpdate
		farm *model.Farm
		i    int
	}
	var acc []accepted
	touched := map[string]*model.Farm{}
	var order []string
	for k := range updates {
		u := &updates[k]
		f, ok := s.Farm(u.Farm)
		if !ok {
			continue
		}
		_, i := f.Backend(u.Backend)
		if i < 0 {
			continue
		}
		if u.Passive {
			key := f.PassiveKey(i)
			if key == "" || u.Key != key {
				continue
			}
			x := e.health.ejected[u.Farm][u.Backend]
			if (x != nil && x.key == key) == u.Ejected {
				continue
			}
		} else {
			c, ok := f.Resolve(i)
			if !ok || (u.Key != "" && u.Key != f.CheckKey(i, &c)) {
				continue
			}
			if h := e.health.byFarm[u.Farm][u.Backend]; h != nil && h.key == f.CheckKey(i, &c) && h.sameState(u) {
				continue
			} else if h == nil && !u.Down && u.Percent == 100 && u.Weight < 0 && u.Ramp == 1000 {
				continue // up at full weight, as a backend without an entry is
			}
		}
		acc = append(acc, accepted{u, f, i})
		if touched[u.Farm] == nil {
			touched[u.Farm] = f
			order = append(order, u.Farm)
		}
	}
	if len(acc) == 0 {
		return nil
	}
	// The entries as they will be: copies of the touched farms' maps.
	next := map[string]map[string]*healthEntry{}
	nextEj := map[string]map[string]*ejection{}
	for _, name := range order {
		m := make(map[string]*healthEntry, len(e.health.byFarm[name])+1)
		for bn, h := range e.health.byFarm[name] {
			m[bn] = h
		}
		next[name] = m
		x := make(map[string]*ejection, len(e.health.ejected[name])+1)
		for bn, j := range e.health.ejected[name] {
			x[bn] = j
		}
		nextEj[name] = x
	}
	now := time.Now()
	type transition struct {
		farm    *model.Farm
		i       int
		entry   *healthEntry
		changed bool // up <-> down
		passive *HealthUpdate
	}
	var trans []transition
	for _, a := range acc {
		if a.u.Passive {
			if a.u.Ejected {
				nextEj[a.u.Farm][a.u.Backend] = &ejection{key: a.u.Key, reason: a.u.Reason, since: now}
			} else {
				delete(nextEj[a.u.Farm], a.u.Backend)
			}
			trans = append(trans, transition{farm: a.farm, i: a.i, passive: a.u})
			continue
		}
		c, _ := a.farm.Resolve(a.i)
		key := a.farm.CheckKey(a.i, &c)
		old := next[a.u.Farm][a.u.Backend]
		h := &healthEntry{key: key, down: a.u.Down, reason: a.u.Reason, since: now,
			percent: a.u.Percent, weight: a.u.Weight, ramp: a.u.Ramp}
		wasDown := false
		if old != nil && old.key == key {
			wasDown = old.down
			h.downs, h.ups = old.downs, old.ups
			if old.down == h.down {
				h.since = old.since
			}
		}
		changed := wasDown != h.down
		if changed && h.down {
			h.downs++
		} else if changed {
			h.ups++
		}
		next[a.u.Farm][a.u.Backend] = h
		trans = append(trans, transition{farm: a.farm, i: a.i, entry: h, changed: changed})
	}
	var d plan.Diff
	effs := map[string]*model.Farm{}
	lost := map[string]bool{}
	for _, name := range order {
		f := touched[name]
		old := e.effectiveFarm(f)
		nw, l := effective(f, next[name], nextEj[name], e.health.quorumLost[name])
		effs[name], lost[name] = nw, l
		if old == nw || model.SameJSON(old, nw) {
			continue
		}
		d.Changes = append(d.Changes, plan.FarmChange{Old: old, New: nw})
	}
	if d = kernelDiff(d); !d.Empty() {
		err := e.dp.Apply(ctx, d)
		if err != nil {
			// Refused by a kernel others changed? Repair, try again
			// (after a success, the watch repairs within a second).
			if drift, seen, serr := e.drifted(ctx); drift {
				if rerr := e.repairLocked(ctx, seen, serr, s, e.effectiveFarms(s), "health"); rerr == nil {
					err = e.dp.Apply(ctx, d)
				}
			}
		}
		if err != nil {
			return fmt.Errorf("apply health to %s data plane: %w", e.dp.Name(), err)
		}
	}
	e.health.mu.Lock()
	for _, name := range order {
		f := touched[name]
		if len(next[name]) > 0 {
			e.health.byFarm[name] = next[name]
		} else {
			delete(e.health.byFarm, name)
		}
		if len(nextEj[name]) > 0 {
			e.health.ejected[name] = nextEj[name]
		} else {
			delete(e.health.ejected, name)
		}
		if effs[name] != f {
			e.health.eff[name] = effs[name]
		} else {
			delete(e.health.eff, name)
		}
		e.setQuorum(f, lost[name])
	}
	for _, t := range trans {
		if t.passive != nil && t.passive.Ejected {
			m := e.health.ejections[t.farm.Name]
			if m == nil {
				m = map[string]uint64{}
				e.health.ejections[t.farm.Name] = m
			}
			m[t.passive.Backend]++
		}
	}
	e.health.mu.Unlock()
	for _, t := range trans {
		if t.passive != nil {
			e.reportEjection(ctx, t.farm, t.i, t.passive, effs[t.farm.Name])
			continue
		}
		e.reportHealth(ctx, t.farm, t.i, t.entry, t.changed, effs[t.farm.Name])
	}
	return nil
}

// reportEjection logs and publishes a passive check's ejection or return,
// and flushes the backend's connections when it was ejected in a farm with
// on-down flush.
func (e *Engine) reportEjection(ctx context.Context, f *model.Farm, i int, u *HealthUpdate, eff *model.Farm) {
	b := &f.Backends[i]
	w := eff.Backends[i].Weight
	if eff.Backends[i].State != model.StateUp {
		w = 0
	}
	state, level := HealthReturned, slog.LevelInfo
	if u.Ejected {
		state, level = HealthEjected, slog.LevelWarn
	}
	e.log.Log(ctx, level, "backend "+state, "farm", f.Name, "backend", b.Name, "reason", u.Reason, "weight", w)
	e.health.events.Publish(events.Event{Kind: events.KindHealth, Farm: f.Name, Backend: b.Name, State: state, Reason: u.Reason, Weight: &w})
	if u.Ejected {
		e.flushDown(ctx, f, i, eff)
	}
}

// reportHealth logs and publishes one backend's new health, and flushes
// its connections when it went down in a farm with on-down flush.
func (e *Engine) reportHealth(ctx context.Context, f *model.Farm, i int, h *healthEntry, changed bool, eff *model.Farm) {
	b := &f.Backends[i]
	w := eff.Backends[i].Weight
	if eff.Backends[i].State != model.StateUp {
		w = 0
	}
	state := "up"
	if h.down {
		state = "down"
	}
	if !changed {
		e.log.Debug("backend weight", "farm", f.Name, "backend", b.Name, "weight", w, "reason", h.reason)
		e.health.events.Publish(events.Event{Kind: events.KindWeight, Farm: f.Name, Backend: b.Name, State: state, Reason: h.reason, Weight: &w})
		return
	}
	level := slog.LevelInfo
	if h.down {
		level = slog.LevelWarn
	}
	e.log.Log(ctx, level, "backend "+state, "farm", f.Name, "backend", b.Name, "reason", h.reason, "weight", w)
	e.health.events.Publish(events.Event{Kind: events.KindHealth, Farm: f.Name, Backend: b.Name, State: state, Reason: h.reason, Weight: &w})
	if h.down {
		e.flushDown(ctx, f, i, eff)
	}
}

// flushDown cuts the connections of backend i of f, gone down or ejected,
// if the farm asks for it (on-down flush).
func (e *Engine) flushDown(ctx context.Context, f *model.Farm, i int, eff *model.Farm) {
	b := &f.Backends[i]
	if f.Check == nil || f.Check.OnDown != model.OnDownFlush {
		return
	}
	ff, ok := e.dp.(dataplane.BackendFlusher)
	if !ok {
		ff = e.health.flusher
	}
	if ff == nil {
		return // the eBPF plane expires the flows of a backend in state down itself
	}
	n, err := ff.FlushBackend(ctx, eff, &eff.Backends[i])
	if err != nil {
		e.log.Error("flush connections of a down backend", "farm", f.Name, "backend", b.Name, "err", err)
		return
	}
	e.log.Info("connections of a down backend flushed", "farm", f.Name, "backend", b.Name, "count", n)
	e.health.events.Publish(events.Event{Kind: events.KindFlush, Farm: f.Name, Backend: b.Name, Count: &n})
}

// Health states as the API shows them.
const (
	HealthUp        = "up"
	HealthDown      = "down"
	HealthUnchecked = "unchecked"
	// HealthEjected: ejected by passive checks (and not down by an
	// active one); HealthReturned is the event of its return.
	HealthEjected  = "ejected"
	HealthReturned = "returned"
)

// BackendHealth is what the engine knows of one backend's health.
type BackendHealth struct {
	State  string // HealthUp, HealthDown or HealthUnchecked
	Reason string
	Since  time.Time // of the last transition; zero: up since its check started
	// Weight is the effective weight the data plane has: 0 while down.
	Weight uint32
	Downs  uint64 // transitions to down
	Ups    uint64 // transitions back up
	// Sorry: the farm's sorry server (serving, or not, by quorum).
	Sorry bool
	// Passive checks: Watched, Ejected (then EjectReason and
	// EjectedSince), and Ejections so far.
	Watched      bool
	Ejected      bool
	EjectReason  string
	EjectedSince time.Time
	Ejections    uint64
}

// FarmHealth returns the health of each backend of f (a farm of the
// current snapshot), in its order, and whether its quorum is lost.
func (e *Engine) FarmHealth(f *model.Farm) ([]BackendHealth, bool) {
	e.health.mu.RLock()
	defer e.health.mu.RUnlock()
	eff := f
	if ef, ok := e.health.eff[f.Name]; ok && len(ef.Backends) == len(f.Backends) {
		eff = ef
	}
	hs := e.health.byFarm[f.Name]
	out := make([]BackendHealth, len(f.Backends))
	for i := range f.Backends {
		b := &f.Backends[i]
		bh := &out[i]
		bh.Weight = eff.Backends[i].Weight
		if eff.Backends[i].State != model.StateUp {
			bh.Weight = 0
		}
		if f.Check != nil && f.Check.SorryServer == b.Name {
			bh.State, bh.Sorry = HealthUnchecked, true
			continue
		}
		bh.State = HealthUnchecked
		if c, ok := f.Resolve(i); ok {
			bh.State = HealthUp
			if h := hs[b.Name]; h != nil && h.key == f.CheckKey(i, &c) {
				if h.down {
					bh.State = HealthDown
				}
				bh.Reason, bh.Since, bh.Downs, bh.Ups = h.reason, h.since, h.downs, h.ups
			}
		}
		if key := f.PassiveKey(i); key != "" {
			bh.Watched = true
			bh.Ejections = e.health.ejections[f.Name][b.Name]
			if bh.State == HealthUnchecked {
				bh.State = HealthUp
			}
			if x := e.health.ejected[f.Name][b.Name]; x != nil && x.key == key {
				bh.Ejected, bh.EjectReason, bh.EjectedSince = true, x.reason, x.since
				if bh.State == HealthUp {
					bh.State = HealthEjected
				}
			}
		}
	}
	return out, e.health.quorumLost[f.Name]
}

// EffectiveFarm returns the farm the data plane holds for the desired farm
// of that name.
func (e *Engine) EffectiveFarm(name string) (*model.Farm, bool) {
	f, ok := e.Snapshot().Farm(name)
	if !ok {
		return nil, false
	}
	e.health.mu.RLock()
	defer e.health.mu.RUnlock()
	if ef, ok := e.health.eff[name]; ok {
		return ef, true
	}
	return f, true
}

// HealthSuffix is the health column of backend i of f in the ipvsadm-style
// listing: "" for a farm without checks.
func HealthSuffix(f *model.Farm, hs []BackendHealth, i int) string {
	h := hs[i]
	if h.Sorry {
		if h.Weight > 0 {
			return " sorry-server serving"
		}
		return " sorry-server standby"
	}
	if h.State == HealthUnchecked {
		return ""
	}
	s := " health " + h.State
	if h.Weight != f.Backends[i].Weight && f.Backends[i].Serving() {
		s += " weight " + strconv.FormatUint(uint64(h.Weight), 10)
	}
	if h.Reason != "" && h.State == HealthDown {
		s += " (" + h.Reason + ")"
	}
	if h.Ejected && h.State == HealthEjected {
		s += " (" + h.EjectReason + ")"
	} else if h.Ejected {
		s += " ejected"
	}
	return s
}
