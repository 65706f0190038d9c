package ebpf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// Drift on the eBPF plane: nothing notifies a change to a map entry, a
// pin or a link, so the plane polls (dataplane.DriftWatcher):
//
//   - every poll: each tcx (and XDP) link is still attached to its
//     interface, runs xlb's program and is pinned; each map's pin is
//     there. A few syscalls per interface and map.
//   - every poll, within a budget of driftBudget map lookups (one
//     syscall each; 16,000 a second at most), rotating over the farms: each farm's
//     service entries, backends, and its first and last slot are what
//     the plane wrote. Up to about 650 farms of 3 backends each poll
//     sees every farm; at 10,000 a full round takes about 4 s. The slots
//     in between are not looked at (a slot deleted by hand is found by a
//     reconcile, not by the poll).
//
// DriftSeen runs the first kind of check at once (before a change is
// acknowledged: O(interfaces + maps), not O(farms)); a map entry deleted
// by hand is found by the next poll, at most driftPoll later.
//
// Reconcile repairs what the polls find: it re-attaches and re-pins links,
// re-pins maps, and rewrites every farm whose entries differ.

var _ dataplane.DriftWatcher = (*Plane)(nil)

const (
	driftPoll   = 250 * time.Millisecond
	driftBudget = 4000
)

type driftPoller struct {
	running atomic.Bool
	seen    atomic.Uint64
	drifted func(string) // set before running
	cursor  int          // (p.mu) the next farm the rotation looks at
	// progs: the loaded programs' ids (p.mu), read once: a program's
	// info is a system call and a read of its fdinfo in /proc, which
	// every poll paid (12 % of an idle daemon's CPU with 10,000
	// backends, bench/results/health-cpu.md); the programs are loaded
	// once per plane and keep their ids.
	progs     progIDs
	progsRead bool
	// The lookups' keys and values (p.mu): a local passed to Lookup as
	// unsafe.Pointer escapes, one allocation each.
	svcKey  xlbSvcKey
	svcVal  xlbSvcVal
	beID    uint32
	be      xlbBackend
	slotKey xlbSlotKey
	slotID  uint32
}

// WatchDrift implements dataplane.DriftWatcher.
func (p *Plane) WatchDrift(ctx context.Context, drifted func(what string)) error {
	if p.drift.running.Load() {
		return errors.New("ebpf drift watch: already running")
	}
	p.drift.drifted = drifted
	p.drift.running.Store(true)
	go func() {
		defer p.drift.running.Store(false)
		t := time.NewTicker(driftPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			p.pollDrift(true)
		}
	}()
	return nil
}

// DriftSeen implements dataplane.DriftWatcher: links and pins are checked
// now; map entries by the last poll.
func (p *Plane) DriftSeen(ctx context.Context) (uint64, error) {
	if !p.drift.running.Load() {
		return 0, errors.New("ebpf drift watch: not running")
	}
	p.pollDrift(false)
	return p.drift.seen.Load(), nil
}

// pollDrift checks the kernel objects (with entries: the farms' map
// entries too, within the budget) and reports what differs.
func (p *Plane) pollDrift(entries bool) {
	p.mu.Lock()
	what := p.checkObjects()
	if entries {
		what = append(what, p.checkEntries()...)
	}
	p.mu.Unlock()
	if len(what) == 0 {
		return
	}
	p.drift.seen.Add(1)
	if len(what) > 6 {
		what = append(what[:6], fmt.Sprintf("%d more", len(what)-6))
	}
	p.drift.drifted(strings.Join(what, "; "))
}

// checkObjects returns what differs among links and pins. Callers hold
// p.mu.
func (p *Plane) checkObjects() []string {
	var out []string
	prog := p.progIDs()
	for _, set := range []struct {
		kind  string
		links map[string]link.Link
		pin   func(string) string
		prog  ebpf.ProgramID
	}{
		{"tcx", p.links, func(n string) string { return linkPin(p.opts.PinPath, n) }, prog.tcx},
		{"xdp", p.xdpLinks, func(n string) string { return xdpLinkPin(p.opts.PinPath, p.opts.XDP, n) }, prog.xdp},
	} {
		for _, name := range sortedKeys(set.links) {
			l := set.links[name]
			if !attached(l, set.prog) {
				out = append(out, fmt.Sprintf("%s program detached from %s", set.kind, name))
				continue
			}
			if _, err := os.Stat(set.pin(name)); err != nil {
				out = append(out, fmt.Sprintf("%s link pin of %s removed", set.kind, name))
			}
		}
	}
	for _, name := range sortedKeys(p.pinned) {
		if _, err := os.Stat(filepath.Join(p.opts.PinPath, name)); err != nil {
			out = append(out, fmt.Sprintf("map pin %s removed", name))
		}
	}
	return out
}

// attached reports whether l is attached to an interface and runs prog.
func attached(l link.Link, prog ebpf.ProgramID) bool {
	info, err := l.Info()
	if err != nil || prog != 0 && info.Program != prog {
		return false
	}
	if tcx := info.TCX(); tcx != nil {
		return tcx.Ifindex != 0
	}
	if xdp := info.XDP(); xdp != nil {
		return xdp.Ifindex != 0
	}
	return true
}

type progIDs struct{ tcx, xdp ebpf.ProgramID }

// progIDs returns the loaded programs' ids. Callers hold p.mu.
func (p *Plane) progIDs() progIDs {
	if p.drift.progsRead {
		return p.drift.progs
	}
	var out progIDs
	if p.objs.XlbIngress != nil {
		if info, err := p.objs.XlbIngress.Info(); err == nil {
			out.tcx, _ = info.ID()
		}
	}
	if p.objs.XlbXdp != nil {
		if info, err := p.objs.XlbXdp.Info(); err == nil {
			out.xdp, _ = info.ID()
		}
	}
	if (p.objs.XlbIngress == nil || out.tcx != 0) && (p.objs.XlbXdp == nil || out.xdp != 0) {
		p.drift.progs, p.drift.progsRead = out, true
	}
	return out
}

// checkEntries looks at the next farms of the rotation, within the
// budget, and returns what differs. Callers hold p.mu.
func (p *Plane) checkEntries() []string {
	names := sortedKeys(p.farms)
	if len(names) == 0 {
		return nil
	}
	var out []string
	budget := driftBudget
	for n := 0; n < len(names) && budget > 0; n++ {
		p.drift.cursor %= len(names)
		g := p.farms[names[p.drift.cursor]]
		p.drift.cursor++
		budget -= len(g.keys) + len(g.ids) + 2
		if what := p.checkFarm(g); what != "" {
			out = append(out, fmt.Sprintf("farm %q: %s", g.farm, what))
		}
	}
	return out
}

// checkFarm returns what of g's entries differs from what was written.
// Keys and values are passed as unsafe.Pointer to the poller's own
// fields: cilium/ebpf then hands them to the kernel as they are, where a
// struct is marshalled through reflection with three allocations a lookup
// (BenchmarkDriftEntries: 955 -> 640 ns a lookup and no allocation, the poll's whole budget
// four times a second). Callers hold p.mu.
func (p *Plane) checkFarm(g *generation) string {
	d := &p.drift
	for _, k := range g.keys {
		d.svcKey = k
		if err := p.objs.XlbServices.Lookup(unsafe.Pointer(&d.svcKey), unsafe.Pointer(&d.svcVal)); err != nil {
			return "service entry deleted"
		}
		if d.svcVal != g.val {
			return "service entry changed"
		}
	}
	for i, id := range g.ids {
		d.beID = id
		if err := p.objs.XlbBackends.Lookup(unsafe.Pointer(&d.beID), unsafe.Pointer(&d.be)); err != nil {
			return fmt.Sprintf("backend %s deleted", g.names[i])
		}
		want := g.bes[i]
		d.be.Flags, want.Flags = 0, 0 // flags change with health
		if d.be != want {
			return fmt.Sprintf("backend %s changed", g.names[i])
		}
	}
	for _, i := range []int{0, len(g.slots) - 1} {
		if i < 0 {
			continue
		}
		d.slotKey = xlbSlotKey{Svc: g.val.Id, Idx: uint32(i)}
		if err := p.objs.XlbSlots.Lookup(unsafe.Pointer(&d.slotKey), unsafe.Pointer(&d.slotID)); err != nil {
			return fmt.Sprintf("slot %d deleted", i)
		}
		if d.slotID != g.ids[g.slots[i]] {
			return fmt.Sprintf("slot %d changed", i)
		}
	}
	return ""
}

// pinnedMaps returns the maps of objs that the spec pins, by name.
func pinnedMaps(spec *ebpf.CollectionSpec, maps *xlbMaps) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(maps).Elem()
	for i := range v.NumField() {
		name := v.Type().Field(i).Tag.Get("ebpf")
		m, _ := v.Field(i).Interface().(*ebpf.Map)
		if ms := spec.Maps[name]; ms != nil && ms.Pinning == ebpf.PinByName && m != nil {
			out[name] = m
		}
	}
	return out
}

// repairPins pins again the maps whose pin was removed, and re-attaches
// (and re-pins) links that were detached or lost their pin. Callers hold
// p.mu.
func (p *Plane) repairPins() error {
	var errs []error
	for name, m := range p.pinned {
		path := filepath.Join(p.opts.PinPath, name)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		// The map keeps its pinned path: forget it, then pin anew.
		_ = m.Unpin()
		if err := m.Pin(path); err != nil {
			errs = append(errs, fmt.Errorf("pin map %s again: %w", name, err))
			continue
		}
		p.log.Warn("pinned map again", "map", name, "path", path)
	}
	prog := p.progIDs()
	broken := false
	for name, l := range p.links {
		if _, err := os.Stat(linkPin(p.opts.PinPath, name)); err != nil || !attached(l, prog.tcx) {
			_ = l.Unpin()
			l.Close()
			delete(p.links, name)
			broken = true
		}
	}
	for name, l := range p.xdpLinks {
		if _, err := os.Stat(xdpLinkPin(p.opts.PinPath, p.opts.XDP, name)); err != nil || !attached(l, prog.xdp) {
			_ = l.Unpin()
			l.Close()
			delete(p.xdpLinks, name)
			broken = true
		}
	}
	if broken {
		// attach adopts the pinned links and makes the missing ones:
		// the open ones are closed first (their pins keep them).
		p.closeLinks()
		if err := p.attach(); err != nil {
			errs = append(errs, fmt.Errorf("attach again: %w", err))
		} else {
			p.log.Warn("attached the program again where it had been detached", "interfaces", sortedKeys(p.links))
		}
	}
	return errors.Join(errs...)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
