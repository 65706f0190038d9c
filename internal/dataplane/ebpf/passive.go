package ebpf

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
)

// Passive health checks (bpf/xlb_passive.h): the program counts the
// outcome of each new TCP connection's handshake for the backends listed in
// xlb_passive, those of farms whose check has "passive". This file keeps
// that list equal to the farms, sweeps the handshakes nobody answered, and
// reads the counts for the daemon's outlier detection (internal/health).

var _ dataplane.PassiveReader = (*Plane)(nil)

// watch is a watched backend id.
type watch struct {
	farm, backend string // the desired farm's name (not a dual half's)
	timeout       uint64 // ns
	// timeouts: handshakes this side swept unanswered; streak: those
	// since the later of the last success (lastOK, as the program last
	// wrote it) and the last reset (resetAt).
	timeouts, streak uint32
	lastOK, resetAt  uint64
}

// passiveIDs returns the ids of g's watched backends, by id.
func passiveIDs(g *generation) map[uint32]string {
	if g == nil || g.passive == nil {
		return nil
	}
	out := make(map[uint32]string, len(g.ids))
	for i, id := range g.ids {
		if id != 0 && i < len(g.names) && g.names[i] != g.sorry {
			out[id] = g.names[i]
		}
	}
	return out
}

// syncPassive makes the watched backends of a farm those of its current
// generation cur (old: the one it replaces; either may be nil). Called
// under mu once the change is in place; a failure is logged (the farm
// serves, unwatched) rather than undoing the change.
func (p *Plane) syncPassive(old, cur *generation) {
	want := passiveIDs(cur)
	if old != nil {
		for _, id := range old.ids {
			if _, ok := want[id]; !ok {
				p.unwatch(id)
			}
		}
	}
	for id, name := range want {
		if err := p.watchBackend(id, cur, name); err != nil {
			p.log.Error("watch backend for passive checks", "farm", cur.farm, "backend", name, "err", err)
		}
	}
}

// watchBackend lists backend id of g in xlb_passive (zeroed, or keeping
// the counts of an entry already there: a restarted daemon's, or the
// farm's previous generation's) with g's timeout.
func (p *Plane) watchBackend(id uint32, g *generation, name string) error {
	timeout := uint64(g.passive.Timeout.Nanoseconds())
	w := p.watched[id]
	if w != nil && w.timeout == timeout {
		w.farm, w.backend = plan.FarmOf(g.farm), name
		return nil
	}
	var v xlbPassiveBe
	if err := p.objs.XlbPassive.Lookup(id, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("read passive counts: %w", err)
	}
	// A read-modify-write: a failure the program counts in between is
	// lost, which only delays an ejection.
	v.TimeoutNs = timeout
	if err := p.objs.XlbPassive.Update(id, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write passive entry: %w", err)
	}
	if w == nil {
		w = &watch{lastOK: v.LastOk}
		p.watched[id] = w
	}
	w.farm, w.backend, w.timeout = plan.FarmOf(g.farm), name, timeout
	return nil
}

// unwatch takes backend id out of xlb_passive.
func (p *Plane) unwatch(id uint32) {
	if _, ok := p.watched[id]; !ok {
		return
	}
	delete(p.watched, id)
	if err := p.objs.XlbPassive.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		p.log.Error("delete passive entry", "backend_id", id, "err", err)
	}
}

// reconcilePassive, at the end of Reconcile: the watched backends become
// those of the farms in place, keeping the counts of entries already in
// the map, and entries of anything else go.
func (p *Plane) reconcilePassive() error {
	p.watched = map[uint32]*watch{}
	want := map[uint32]bool{}
	for _, g := range p.farms {
		for id, name := range passiveIDs(g) {
			want[id] = true
			if err := p.watchBackend(id, g, name); err != nil {
				return fmt.Errorf("farm %q: %w", g.farm, err)
			}
		}
	}
	var stale []uint32
	var k uint32
	var v xlbPassiveBe
	it := p.objs.XlbPassive.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read passive entries: %w", err)
	}
	for _, id := range stale {
		_ = p.objs.XlbPassive.Delete(id)
	}
	return nil
}

// monoCoarse is the program's clock (xlb_now: CLOCK_MONOTONIC_COARSE).
func monoCoarse() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return uint64(ts.Nano())
}

// sweepBatch is how many handshakes one batch syscall reads.
const sweepBatch = 4096

// sweepSYNs counts and deletes the handshakes older than their backend's
// timeout (and those of backends no longer watched). Callers hold mu and
// have refreshed each watch's lastOK.
func (p *Plane) sweepSYNs(now uint64) error {
	keys := make([]xlbCtKey, sweepBatch)
	vals := make([]xlbPassiveSyn, sweepBatch)
	var expired []xlbCtKey
	var syns []xlbPassiveSyn
	var cursor ebpf.MapBatchCursor
	for {
		n, err := p.objs.XlbPassiveSyn.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			w := p.watched[vals[i].Backend]
			if w == nil || int64(now-vals[i].Ts) > int64(w.timeout) {
				expired = append(expired, keys[i])
				syns = append(syns, vals[i])
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return fmt.Errorf("read passive handshakes: %w", err)
		}
	}
	for i, k := range expired {
		// The program may have counted the answer meanwhile: whoever
		// deletes the entry counts it.
		if err := p.objs.XlbPassiveSyn.Delete(k); err != nil {
			continue
		}
		w := p.watched[syns[i].Backend]
		if w == nil {
			continue
		}
		w.timeouts++
		// Found up to a sweep late: it counts among the consecutive
		// failures if it expired after the last success (or reset),
		// as it would have been counted then.
		if int64(syns[i].Ts+w.timeout-max(w.lastOK, w.resetAt)) > 0 {
			w.streak++
		}
	}
	return nil
}

// PassiveCounts implements dataplane.PassiveReader.
func (p *Plane) PassiveCounts(ctx context.Context) ([]dataplane.PassiveCount, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.watched) == 0 {
		return nil, nil
	}
	ids := make([]uint32, 0, len(p.watched))
	vals := make([]xlbPassiveBe, 0, len(p.watched))
	for id, w := range p.watched {
		var v xlbPassiveBe
		if err := p.objs.XlbPassive.Lookup(id, &v); err != nil {
			return nil, fmt.Errorf("read passive counts of farm %q backend %q: %w", w.farm, w.backend, err)
		}
		if v.LastOk != w.lastOK {
			// A success since the last read: the timeouts before it no
			// longer count.
			w.lastOK, w.streak = v.LastOk, 0
		}
		ids, vals = append(ids, id), append(vals, v)
	}
	if err := p.sweepSYNs(monoCoarse()); err != nil {
		return nil, err
	}
	out := make([]dataplane.PassiveCount, 0, len(ids))
	for i, id := range ids {
		w, v := p.watched[id], vals[i]
		out = append(out, dataplane.PassiveCount{Farm: w.farm, Backend: w.backend,
			Consecutive: v.Consec + w.streak, Successes: v.Ok, Resets: v.Reset, Unreachable: v.Unreach,
			Slow: v.Slow, Timeouts: uint64(w.timeouts)})
	}
	return out, nil
}

// ResetPassive implements dataplane.PassiveReader.
func (p *Plane) ResetPassive(ctx context.Context, farm, backend string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, w := range p.watched {
		if w.farm != farm || w.backend != backend {
			continue
		}
		var v xlbPassiveBe
		if err := p.objs.XlbPassive.Lookup(id, &v); err != nil {
			return fmt.Errorf("read passive counts of farm %q backend %q: %w", farm, backend, err)
		}
		v.Consec = 0
		if err := p.objs.XlbPassive.Update(id, v, ebpf.UpdateExist); err != nil {
			return fmt.Errorf("reset passive counts of farm %q backend %q: %w", farm, backend, err)
		}
		w.streak, w.resetAt = 0, monoCoarse()
		// Handshakes sent before the reset (before the ejection) must
		// not count against the backend as it comes back.
		p.dropSYNs(id)
	}
	return nil
}

// dropSYNs deletes the handshakes in flight to backend id, uncounted.
func (p *Plane) dropSYNs(id uint32) {
	var k xlbCtKey
	var v xlbPassiveSyn
	var drop []xlbCtKey
	it := p.objs.XlbPassiveSyn.Iterate()
	for it.Next(&k, &v) {
		if v.Backend == id {
			drop = append(drop, k)
		}
	}
	for _, k := range drop {
		_ = p.objs.XlbPassiveSyn.Delete(k)
	}
}
