package ebpf

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

var (
	_ dataplane.CounterReader     = (*Plane)(nil)
	_ dataplane.BulkCounterReader = (*Plane)(nil)
)

// statSlots allocates counter slots (indexes of xlb_be_stats,
// 1..maxStatSlots-1), lowest free first.
type statSlots struct {
	free  []uint32 // released slots
	next  uint32   // never given yet: next .. maxStatSlots-1
	taken map[uint32]bool
	// end: above every slot ever taken (given, or adopted from the
	// maps at a restart), where a read of every slot may stop.
	end uint32
}

func (a *statSlots) init() { a.free, a.next, a.taken, a.end = nil, 1, map[uint32]bool{}, 1 }

// take marks s taken.
func (a *statSlots) take(s uint32) {
	a.taken[s] = true
	a.end = max(a.end, s+1)
}

func (a *statSlots) alloc() (uint32, bool) {
	for len(a.free) > 0 {
		s := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		if !a.taken[s] {
			a.take(s)
			return s, true
		}
	}
	for a.next < maxStatSlots {
		s := a.next
		a.next++
		if !a.taken[s] {
			a.take(s)
			return s, true
		}
	}
	return 0, false
}

func (a *statSlots) release(s uint32) {
	if a.taken[s] {
		delete(a.taken, s)
		a.free = append(a.free, s)
	}
}

// zeroStats returns a zero per-CPU value of xlb_be_stats.
func zeroStats() ([]xlbBeStats, error) {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible cpus: %w", err)
	}
	return make([]xlbBeStats, n), nil
}

// newBackendStats gives backend id a zeroed counter slot (the caller then
// writes its flags, which publishes the slot to the program). With every
// slot taken, the backend is not counted (logged).
func (p *Plane) newBackendStats(id uint32) error {
	if id >= maxBackends {
		return nil
	}
	s, ok := p.statSlots.alloc()
	if !ok {
		p.log.Warn("out of ebpf counter slots: backend not counted", "backend_id", id, "slots", maxStatSlots-1)
		return nil
	}
	z, err := zeroStats()
	if err != nil {
		p.statSlots.release(s)
		return err
	}
	if err := p.objs.XlbBeStats.Update(s, z, ebpf.UpdateAny); err != nil {
		p.statSlots.release(s)
		return fmt.Errorf("reset backend counters: %w", err)
	}
	p.statSlot[id] = s
	return nil
}

// backendStats reads backend id's counters summed over CPUs (zero if it has
// no slot).
func (p *Plane) backendStats(id uint32) (dataplane.Counters, error) {
	s, ok := p.statSlot[id]
	if !ok {
		return dataplane.Counters{}, nil
	}
	var per []xlbBeStats
	if err := p.objs.XlbBeStats.Lookup(s, &per); err != nil {
		return dataplane.Counters{}, fmt.Errorf("read backend counters: %w", err)
	}
	return sumStats(per), nil
}

// dropBackendStats takes a freed backend id's counter slot back, adding its
// counts to its farm's carry while the farm exists. The caller then
// rewrites the id's flags (without the slot).
func (p *Plane) dropBackendStats(farm string, id uint32) {
	if _, ok := p.farms[farm]; ok {
		if c, err := p.backendStats(id); err == nil {
			cc := p.carry[farm]
			cc.Add(c)
			p.carry[farm] = cc
		}
	}
	if s, ok := p.statSlot[id]; ok {
		p.statSlots.release(s)
		delete(p.statSlot, id)
	}
}

// adoptStatSlots reads the counter slots of the backends in the maps from
// their xlb_be_flags values (a restarted daemon keeps their counts).
func (p *Plane) adoptStatSlots(bes map[uint32]xlbBackend) error {
	p.statSlot = map[uint32]uint32{}
	p.statSlots.init()
	for id := range bes {
		if id >= maxBackends {
			continue
		}
		var v uint32
		if err := p.objs.XlbBeFlags.Lookup(id, &v); err != nil {
			return fmt.Errorf("read backend flags: %w", err)
		}
		if s := v >> beSlotShift; s != 0 && s < maxStatSlots && !p.statSlots.taken[s] {
			p.statSlots.take(s)
			p.statSlot[id] = s
		}
	}
	return nil
}

// syncBackendStats, at the end of Reconcile: live backend ids without a
// counter slot get one, and the slots of ids no longer live are taken back.
func (p *Plane) syncBackendStats(live map[uint32]bool) error {
	for id := range p.statSlot {
		if !live[id] {
			p.dropBackendStats("", id)
			_ = p.setFlags(id, 0)
		}
	}
	for id := range live {
		if _, ok := p.statSlot[id]; ok || id >= maxBackends {
			continue
		}
		if err := p.newBackendStats(id); err != nil {
			return err
		}
		var v uint32
		if err := p.objs.XlbBeFlags.Lookup(id, &v); err != nil {
			return fmt.Errorf("read backend flags: %w", err)
		}
		if err := p.setFlags(id, uint8(v&beFlagMask)); err != nil {
			return err
		}
	}
	return nil
}

// setSvcFlags writes g's flags (log, passive, intra-connect off) to
// xlb_svc_flags.
func (p *Plane) setSvcFlags(g *generation) error {
	var fl uint32
	if g.log {
		fl |= svcFlagLog
	}
	if g.passive != nil {
		fl |= svcFlagPassive
	}
	if g.noLocal {
		fl |= svcFlagNoLocal
	}
	fl |= p.farmIDs.farmID(g.farm) << farmIDShift
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
	return p.farmCounters(f, p.backendStats)
}

// AllCounters implements dataplane.BulkCounterReader: the counters of
// every farm as Counters gives them, from one batched read of the counter
// slots in use (BPF_MAP_LOOKUP_BATCH over xlb_be_stats' slots 0 up to the
// highest taken, adopted ones too) instead of a lookup system call per backend. The rate
// estimator reads every backend every 2 s: at 10,000 backends the lookups
// were most of its cost (bench/results/health-cpu.md).
func (p *Plane) AllCounters(ctx context.Context, farms []*model.Farm) ([]dataplane.FarmCounters, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.readStatSlots(); err != nil {
		return nil, err
	}
	cpus := len(p.statBuf) / max(len(p.statKeys), 1)
	stat := func(id uint32) (dataplane.Counters, error) {
		s, ok := p.statSlot[id]
		if !ok || int(s) >= len(p.statKeys) {
			return dataplane.Counters{}, nil
		}
		return sumStats(p.statBuf[int(s)*cpus : int(s+1)*cpus]), nil
	}
	out := make([]dataplane.FarmCounters, len(farms))
	for i, f := range farms {
		var err error
		if out[i], err = p.farmCounters(f, stat); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readStatSlots reads xlb_be_stats' slots 0 .. statSlots.end-1 (every
// slot ever taken: slots are given lowest first) into p.statBuf, each
// slot's per-CPU values in a row. Callers hold p.mu.
func (p *Plane) readStatSlots() error {
	n := int(p.statSlots.end)
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("possible cpus: %w", err)
	}
	if len(p.statKeys) != n {
		p.statKeys = make([]uint32, n)
		p.statBuf = make([]xlbBeStats, n*cpus)
	}
	// In chunks, so that a chunk's buffers stay a few hundred KiB
	// (the kernel copies a whole batch through one allocation).
	const chunk = 4096
	var cursor ebpf.MapBatchCursor
	for done := 0; done < n; {
		c := min(chunk, n-done)
		got, err := p.objs.XlbBeStats.BatchLookup(&cursor, p.statKeys[done:done+c], p.statBuf[done*cpus:(done+c)*cpus], nil)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("read backend counters: %w", err)
		}
		if got != c {
			return fmt.Errorf("read backend counters: %d of %d slots read", done+got, n)
		}
		done += c
	}
	return nil
}

// sumStats sums one slot's per-CPU counters.
func sumStats(per []xlbBeStats) dataplane.Counters {
	var c dataplane.Counters
	for _, x := range per {
		c.Add(dataplane.Counters{Connections: x.Conns, InPackets: x.InPkts, InBytes: x.InBytes,
			OutPackets: x.OutPkts, OutBytes: x.OutBytes})
	}
	return c
}

// farmCounters is Counters with each backend id's counters from stat.
// Callers hold p.mu.
func (p *Plane) farmCounters(f *model.Farm, stat func(id uint32) (dataplane.Counters, error)) (dataplane.FarmCounters, error) {
	var out dataplane.FarmCounters
	byName := make(map[string]dataplane.Counters, len(f.Backends))
	for _, h := range plan.Halves(f) { // a dual farm's halves are counted apart
		out.Add(p.carry[h.Name])
		g := p.farms[h.Name]
		if g == nil {
			continue
		}
		for i, id := range g.ids {
			if id == 0 || i >= len(g.names) {
				continue
			}
			c, err := stat(id)
			if err != nil {
				return out, err
			}
			byName[g.names[i]] = c
			out.Add(c)
		}
	}
	out.Backends = make([]dataplane.BackendCounters, 0, len(f.Backends))
	for _, b := range f.Backends {
		out.Backends = append(out.Backends, dataplane.BackendCounters{Name: b.Name, Counters: byName[b.Name]})
	}
	return out, nil
}
