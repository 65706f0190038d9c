package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
)

// Rates are traffic rates per second, what `ipvsadm -L --rate` shows:
// connections, packets in and out, bytes in and out.
type Rates struct {
	CPS, InPPS, OutPPS, InBPS, OutBPS float64
}

// BackendRates are one backend's rates.
type BackendRates struct {
	Name string
	Rates
}

// FarmRates are a farm's rates and its backends', in the farm's order.
type FarmRates struct {
	Rates
	Backends []BackendRates
}

// RateTick is how often the estimator samples the counters: IPVS's
// estimator period (ip_vs_est.c).
const RateTick = 2 * time.Second

// RateEstimator estimates rates from the data plane's counters the way
// IPVS does: every 2 s it reads every farm's and backend's counters, takes
// the rate over those 2 s, and moves its estimate a quarter of the way
// towards it (an exponentially weighted moving average:
// avg += (rate - avg) / 4). A steady rate is reached to 90 % in 8 ticks
// (16 s); a stop decays as fast. IPVS keeps its estimates in fixed point;
// these are float64, which changes nothing a listing shows.
//
// The cost is one read of every counter per tick (for the eBPF plane a
// batched read of its counter slots, for nft a dump of its counter sets),
// whether anyone asks or not, as in IPVS.
type RateEstimator struct {
	eng  *engine.Engine
	log  *slog.Logger
	tick time.Duration

	mu    sync.RWMutex
	farms map[string]*farmEst
	// samples counts the samples taken (est.seen).
	samples uint64
	// err is why the last sample failed (a plane without counters).
	err error
	// last is the last sample's counters, by farm name, and when it was
	// read: the metrics serve them rather than read the plane again.
	last   map[string]dataplane.FarmCounters
	lastAt time.Time
}

type est struct {
	last  dataplane.Counters
	rates Rates
	// seen: the sample that last read it (one that was not read in
	// the last sample is gone).
	seen uint64
}

type farmEst struct {
	est
	backends map[string]*est
}

// NewRates returns an estimator of eng's farms' rates; Run drives it.
func NewRates(eng *engine.Engine, log *slog.Logger) *RateEstimator {
	return &RateEstimator{eng: eng, log: log, tick: RateTick, farms: map[string]*farmEst{}}
}

// Run samples the counters every tick until ctx ends.
func (r *RateEstimator) Run(ctx context.Context) {
	t := time.NewTicker(r.tick)
	defer t.Stop()
	r.Sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Sample(ctx)
		}
	}
}

// Sample reads the counters once and updates the estimates (Run calls it
// every tick; tests call it directly).
func (r *RateEstimator) Sample(ctx context.Context) {
	farms, cs, err := r.eng.AllCounters(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
	if err != nil {
		var ns *engine.NotSupportedError
		if !errors.As(err, &ns) {
			r.log.Warn("rate estimator: read counters", "err", err)
		}
		return
	}
	r.last = make(map[string]dataplane.FarmCounters, len(farms))
	for i, f := range farms {
		r.last[f.Name] = cs[i]
	}
	r.lastAt = time.Now()
	r.samples++
	secs := r.tick.Seconds()
	seen := make(map[string]bool, len(farms))
	for i, f := range farms {
		seen[f.Name] = true
		fe := r.farms[f.Name]
		if fe == nil {
			// The first sample only sets the base, as IPVS's
			// estimator does when a service is added.
			fe = &farmEst{est: est{last: cs[i].Counters}, backends: map[string]*est{}}
			r.farms[f.Name] = fe
		} else {
			fe.update(cs[i].Counters, secs)
		}
		// Backends not read in this sample are gone (a stamp per
		// estimate rather than a set of the live names per farm and
		// sample: 10,000 backends read every 2 s).
		for _, b := range cs[i].Backends {
			be := fe.backends[b.Name]
			if be == nil {
				fe.backends[b.Name] = &est{last: b.Counters, seen: r.samples}
				continue
			}
			be.seen = r.samples
			be.update(b.Counters, secs)
		}
		if len(fe.backends) != len(cs[i].Backends) {
			for name, be := range fe.backends {
				if be.seen != r.samples {
					delete(fe.backends, name)
				}
			}
		}
	}
	for name := range r.farms {
		if !seen[name] {
			delete(r.farms, name)
		}
	}
}

// update moves the estimate towards the rate since the last sample. A
// counter that went backwards (a backend removed and added again, its
// counters anew) restarts from the new value.
func (e *est) update(c dataplane.Counters, secs float64) {
	l := e.last
	e.last = c
	if c.Connections < l.Connections || c.InPackets < l.InPackets || c.OutPackets < l.OutPackets ||
		c.InBytes < l.InBytes || c.OutBytes < l.OutBytes {
		return
	}
	ewma := func(avg *float64, delta uint64) { *avg += (float64(delta)/secs - *avg) / 4 }
	ewma(&e.rates.CPS, c.Connections-l.Connections)
	ewma(&e.rates.InPPS, c.InPackets-l.InPackets)
	ewma(&e.rates.OutPPS, c.OutPackets-l.OutPackets)
	// IPVS's bps are bytes per second, as here.
	ewma(&e.rates.InBPS, c.InBytes-l.InBytes)
	ewma(&e.rates.OutBPS, c.OutBytes-l.OutBytes)
}

// Last returns the counters of the last sample, by farm name, and when
// they were read (zero time: none yet, or the plane keeps no counters).
// The map is not to be changed.
func (r *RateEstimator) Last() (map[string]dataplane.FarmCounters, time.Time) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.err != nil {
		return nil, time.Time{}
	}
	return r.last, r.lastAt
}

// FarmRates returns the current estimates of a farm and its backends
// (zero until two samples were taken), or why there are none.
func (r *RateEstimator) FarmRates(name string) (FarmRates, error) {
	f, ok := r.eng.Snapshot().Farm(name)
	if !ok {
		return FarmRates{}, &engine.NotFoundError{What: fmt.Sprintf("farm %q", name)}
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	var ns *engine.NotSupportedError
	if errors.As(r.err, &ns) {
		return FarmRates{}, &engine.NotSupportedError{Msg: ns.Msg + ": no rates either"}
	}
	out := FarmRates{Backends: make([]BackendRates, len(f.Backends))}
	fe := r.farms[name]
	if fe != nil {
		out.Rates = fe.rates
	}
	for i, b := range f.Backends {
		out.Backends[i].Name = b.Name
		if fe != nil {
			if be := fe.backends[b.Name]; be != nil {
				out.Backends[i].Rates = be.rates
			}
		}
	}
	return out, nil
}
