package bgp

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/health"
	"github.com/xlb-lb/xlb/internal/model"
)

// Gate holds announcements back until the node is ready to carry traffic
// (connection sync: until it has caught up with its peers' state).
type Gate interface {
	// Ready reports whether the node may announce, and why not.
	Ready() (bool, string)
	// Changed is signalled whenever Ready may have changed.
	Changed() <-chan struct{}
}

// Source is what the announcer reads: the engine's published states (each
// one is in the kernel when it is published) and the farms as the data
// plane holds them (with health applied).
type Source interface {
	Snapshot() *engine.State
	Subscribe(ch chan<- *engine.State)
	EffectiveFarm(name string) (*model.Farm, bool)
}

// Checks gives the last result of a backend's health check: the health
// monitor.
type Checks interface {
	Status(farm, backend string) (health.Status, bool)
}

// Announcer keeps the speaker's routes equal to the VIPs that should be
// announced: those of farms in the kernel, up, wanting announcement, and
// (with WithdrawWhenDown) with a serving backend; none until the gate
// opens.
type Announcer struct {
	log    *slog.Logger
	cfg    *Config
	sp     *Speaker
	src    Source
	events *events.Broker
	checks Checks
	gate   Gate

	mu      sync.Mutex
	waiting string
}

// NewAnnouncer wires a speaker to the engine. broker (health events),
// checks and gate may be nil.
func NewAnnouncer(log *slog.Logger, cfg *Config, sp *Speaker, src Source, broker *events.Broker, checks Checks, gate Gate) *Announcer {
	return &Announcer{log: log, cfg: cfg, sp: sp, src: src, events: broker, checks: checks, gate: gate}
}

// retryEvery is how often a failed Set is tried again.
const retryEvery = 2 * time.Second

// Run announces until ctx ends, then drains: withdraws every route, waits
// DrainWait, and closes the sessions.
func (a *Announcer) Run(ctx context.Context) {
	states := make(chan *engine.State, 1)
	a.src.Subscribe(states)
	var evc <-chan events.Event
	if a.events != nil {
		sub := a.events.Subscribe(0, 64)
		defer a.events.Cancel(sub)
		evc = sub.C
	}
	var gatec <-chan struct{}
	if a.gate != nil {
		gatec = a.gate.Changed()
	}
	retry := time.NewTicker(retryEvery)
	defer retry.Stop()
	// A checked backend's first passing check publishes no event (it
	// counted as up before it): farms that withdraw when down are looked
	// at again every second.
	var recheck <-chan time.Time
	if a.cfg.withdrawWhenDown() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		recheck = t.C
	}
	failed := false
	sync := func() {
		err := a.sp.Set(ctx, a.Desired())
		if err != nil && ctx.Err() == nil {
			a.log.Warn("BGP announcements", "err", err)
		}
		failed = err != nil
	}
	sync()
	for {
		select {
		case <-ctx.Done():
			a.sp.Drain(context.WithoutCancel(ctx))
			return
		case <-states:
			sync()
		case ev := <-evc:
			// Health transitions and quorum changes may take a farm's
			// last serving backend away or bring one back.
			if ev.Kind == events.KindHealth || ev.Kind == events.KindQuorum || ev.Kind == events.KindWeight {
				sync()
			}
		case <-gatec:
			sync()
		case <-retry.C:
			if failed {
				sync()
			}
		case <-recheck:
			sync()
		}
	}
}

// Waiting says why nothing is announced ("" when the gate is open).
func (a *Announcer) Waiting() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waiting
}

// Desired computes the routes to announce now.
func (a *Announcer) Desired() map[netip.Addr]Attrs {
	if a.gate != nil {
		ok, why := a.gate.Ready()
		a.mu.Lock()
		if ok {
			a.waiting = ""
		} else {
			a.waiting = why
		}
		a.mu.Unlock()
		if !ok {
			return nil
		}
	}
	return desired(a.cfg, a.src.Snapshot().Farms(), a.src.EffectiveFarm, a.checks)
}

// desired is the set of VIPs to announce for these farms: a VIP is
// announced when at least one farm on it wants it; several farms on one
// VIP (different ports) share the route, with the communities of all of
// them, the lowest MED and the highest local-pref.
//
// A farm that withdraws when down wants its VIPs while a backend serves in
// the data plane and, if that backend is checked, its check has passed at
// least once: a checked backend counts as up until its first check, and
// a VIP announced then would draw traffic to a farm that may have none.
func desired(cfg *Config, farms []*model.Farm, effective func(string) (*model.Farm, bool), checks Checks) map[netip.Addr]Attrs {
	out := map[netip.Addr]Attrs{}
	for _, f := range farms {
		if !f.Listens() || f.State != model.StateUp {
			continue // not in the kernel, or not serving by the operator's word
		}
		at := cfg.attrsFor(f.Name)
		if at.Announce != nil && !*at.Announce {
			continue
		}
		if at.WithdrawWhenDown {
			if !serving(f, effective, checks) {
				continue
			}
		}
		for _, vip := range f.VirtualAddrs() {
			vip = vip.Unmap()
			prev, seen := out[vip]
			if !seen {
				out[vip] = Attrs{Communities: slices.Clone(at.Communities), MED: at.MED, LocalPref: at.LocalPref}
				continue
			}
			for _, c := range at.Communities {
				if !slices.Contains(prev.Communities, c) {
					prev.Communities = append(prev.Communities, c)
				}
			}
			slices.Sort(prev.Communities)
			if at.MED != nil && (prev.MED == nil || *at.MED < *prev.MED) {
				prev.MED = at.MED
			}
			if at.LocalPref != nil && (prev.LocalPref == nil || *at.LocalPref > *prev.LocalPref) {
				prev.LocalPref = at.LocalPref
			}
			out[vip] = prev
		}
	}
	for vip, at := range out {
		slices.Sort(at.Communities)
		out[vip] = at
	}
	return out
}

// Status is the speaker's sessions and routes and whether the gate is
// open, for GET /bgp.
func (a *Announcer) Status(ctx context.Context) (Status, error) {
	st := Status{RouterID: a.cfg.RouterID.String(), AS: a.cfg.AS, Ready: true, Routes: a.sp.Routes()}
	if w := a.Waiting(); w != "" {
		st.Ready, st.Waiting = false, w
	}
	var err error
	st.Sessions, err = a.sp.Sessions(ctx)
	return st, err
}

// serving reports whether a backend of f serves and, if checked, has
// passed its check.
func serving(f *model.Farm, effective func(string) (*model.Farm, bool), checks Checks) bool {
	eff, ok := effective(f.Name)
	if !ok {
		return false
	}
	if len(eff.Backends) != len(f.Backends) {
		// Not the desired farm's backends one for one: the data plane's
		// word alone.
		return slices.ContainsFunc(eff.Backends, func(b model.Backend) bool { return b.Serving() })
	}
	for i := range eff.Backends {
		if !eff.Backends[i].Serving() {
			continue
		}
		if _, checked := f.Resolve(i); !checked || checks == nil {
			return true
		}
		if st, ok := checks.Status(f.Name, f.Backends[i].Name); ok && st.Checked && st.Up {
			return true
		}
	}
	return false
}
