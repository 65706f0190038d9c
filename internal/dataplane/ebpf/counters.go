package ebpf

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

var _ dataplane.CounterReader = (*Plane)(nil)

// zeroStats returns a zero per-CPU value of xlb_be_stats.
func zeroStats() ([]xlbBeStats, error) {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible cpus: %w", err)
	}
	return make([]xlbBeStats, n), nil
}

// newBackendStats creates backend id's (zero) counters: the program counts
// only into existing entries.
func (p *Plane) newBackendStats(id uint32) error {
	z, err := zeroStats()
	if err != nil {
		return err
	}
	if err := p.objs.XlbBeStats.Update(id, z, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("create backend counters: %w", err)
	}
	return nil
}

// backendStats reads backend id's counters summed over CPUs (zero if it has
// none).
func (p *Plane) backendStats(id uint32) (dataplane.Counters, error) {
	var per []xlbBeStats
	if err := p.objs.XlbBeStats.Lookup(id, &per); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return dataplane.Counters{}, nil
		}
		return dataplane.Counters{}, fmt.Errorf("read backend counters: %w", err)
	}
	var c dataplane.Counters
	for _, s := range per {
		c.Add(dataplane.Counters{Connections: s.Conns, InPackets: s.InPkts, InBytes: s.InBytes,
			OutPackets: s.OutPkts, OutBytes: s.OutBytes})
	}
	return c, nil
}

// dropBackendStats deletes a freed backend id's counters, adding them to
// its farm's carry while the farm exists.
func (p *Plane) dropBackendStats(farm string, id uint32) {
	if _, ok := p.farms[farm]; ok {
		if c, err := p.backendStats(id); err == nil {
			cc := p.carry[farm]
			cc.Add(c)
			p.carry[farm] = cc
		}
	}
	_ = p.objs.XlbBeStats.Delete(id)
}

// syncBackendStats makes xlb_be_stats hold an entry for exactly the live
// backend ids (entries of a restarted daemon's backends are kept, with
// their counts).
func (p *Plane) syncBackendStats(live map[uint32]bool) error {
	var stale []uint32
	var k uint32
	var v []xlbBeStats
	have := map[uint32]bool{}
	it := p.objs.XlbBeStats.Iterate()
	for it.Next(&k, &v) {
		have[k] = true
		if !live[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read backend counters: %w", err)
	}
	for _, id := range stale {
		_ = p.objs.XlbBeStats.Delete(id)
	}
	for id := range live {
		if !have[id] {
			if err := p.newBackendStats(id); err != nil {
				return err
			}
		}
	}
	return nil
}

// setSvcFlags writes g's flags (log) to xlb_svc_flags.
func (p *Plane) setSvcFlags(g *generation) error {
	var fl uint32
	if g.log {
		fl |= svcFlagLog
	}
	if err := p.objs.XlbSvcFlags.Update(g.val.Id, fl, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write service flags: %w", err)
	}
	return nil
}

// Counters implements dataplane.CounterReader: each backend's counters
// (in the farm's order; zero for a backend not in the maps), and the
// farm's: the sum of its backends', plus what backends removed from it
// counted while this plane ran. A farm that is down has only the latter.
//
// In is client -> backend, out backend -> client. A dsr farm's replies
// bypass the balancer, and so do stlsdnat replies as far as counting goes
// (they are not tied to a backend): both count only "in". A stlsdnat farm
// has no connections.
func (p *Plane) Counters(ctx context.Context, f *model.Farm) (dataplane.FarmCounters, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := dataplane.FarmCounters{Counters: p.carry[f.Name]}
	byName := map[string]dataplane.Counters{}
	if g := p.farms[f.Name]; g != nil {
		for i, id := range g.ids {
			if id == 0 || i >= len(g.names) {
				continue
			}
			c, err := p.backendStats(id)
			if err != nil {
				return out, err
			}
			byName[g.names[i]] = c
			out.Add(c)
		}
	}
	for _, b := range f.Backends {
		out.Backends = append(out.Backends, dataplane.BackendCounters{Name: b.Name, Counters: byName[b.Name]})
	}
	return out, nil
}
