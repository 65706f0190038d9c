package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Connection listing and counting over the program's own conntrack table
// (xlb_ct), read with batched map lookups: a walk of a table of a million
// entries is a few hundred system calls, not two million.
//
// A connection is its forward entry (client -> VIP; the key's source is
// the client, its destination the VIP, the value's destination the
// backend). Its reply entry (backend -> client) shares its state, and dsr
// connections have none. Entries are matched to farms by protocol, VIP and
// port, and to backends by address and port, not by the generation or
// backend ids they carry: those are freed as farms change, while a
// connection lives on until it idles out.

var (
	_ dataplane.ConnLister  = (*Plane)(nil)
	_ dataplane.ConnCounter = (*Plane)(nil)
	_ dataplane.PacketStats = (*Plane)(nil)
)

// ctBatch is how many entries one batched lookup asks for. A hash map's
// batch must hold at least its fullest bucket; 4096 entries of 40+88
// bytes are half a MiB of buffers.
const ctBatch = 4096

// walkCT calls fn for every entry of xlb_ct. Entries that come and go
// during the walk may be seen or not (as with any dump of a live table).
func (p *Plane) walkCT(ctx context.Context, fn func(k *xlbCtKey, v *xlbCtVal)) error {
	keys := make([]xlbCtKey, ctBatch)
	vals := make([]xlbCtVal, ctBatch)
	var cursor ebpf.MapBatchCursor
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := p.objs.XlbCt.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("walk the conntrack table: %w", err)
		}
	}
}

// ctFarm matches forward entries to one farm and its backends.
type ctFarm struct {
	f     *model.Farm
	vips  [][4]uint32
	proto uint8 // 0: any
}

func newCTFarm(f *model.Farm) ctFarm {
	m := ctFarm{f: f, proto: f.Protocol.Number()}
	for _, v := range f.VirtualAddrs() {
		m.vips = append(m.vips, addrWords(v))
	}
	return m
}

// match reports whether forward entry k, v is one of the farm's, and the
// index of its backend (-1: no backend of the farm has its address now).
func (m ctFarm) match(k *xlbCtKey, v *xlbCtVal) (bool, int) {
	if v.Dir != ctFwd || m.proto != 0 && k.Proto != m.proto {
		return false, -1
	}
	found := false
	for _, vip := range m.vips {
		if k.Dst == vip {
			found = true
			break
		}
	}
	if !found || !m.f.ServesPort(ne16(k.Dport)) {
		return false, -1
	}
	return true, m.backend(v, k.Family)
}

func (m ctFarm) backend(v *xlbCtVal, family uint8) int {
	addr := wordsAddr(v.Dst, family)
	port := ne16(v.Dport)
	for i := range m.f.Backends {
		b := &m.f.Backends[i]
		if b.Addr == addr && (b.Port == 0 || b.Port == port) {
			return i
		}
	}
	return -1
}

// ctStateNames are the flow states as IPVS names them.
var ctStateNames = map[uint8]string{
	ctStateSYN: "SYN_RECV", ctStateEST: "ESTABLISHED", ctStateFIN: "FIN_WAIT",
	ctStateClose: "CLOSE", ctStateUDP: "UDP",
}

// timeout is the idle timeout of a flow in state s (ct_timeout in
// bpf/xlb_lb.c).
func (t Timeouts) timeout(s uint8) time.Duration {
	switch s {
	case ctStateSYN:
		return t.SYN
	case ctStateEST:
		return t.TCP
	case ctStateFIN:
		return t.TCPFin
	case ctStateClose:
		return t.Close
	}
	return t.UDP
}

// monotonicCoarse is the program's conntrack clock (CLOCK_MONOTONIC_COARSE).
func monotonicCoarse() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

func toConn(m ctFarm, k *xlbCtKey, v *xlbCtVal, be int, now uint64, to Timeouts) dataplane.Conn {
	c := dataplane.Conn{
		Farm:     m.f.Name,
		Protocol: k.Proto,
		State:    ctStateNames[v.State],
		Active:   v.State == ctStateEST,
		Client:   netip.AddrPortFrom(wordsAddr(k.Src, k.Family), ne16(k.Sport)),
		VIP:      netip.AddrPortFrom(wordsAddr(k.Dst, k.Family), ne16(k.Dport)),
		Backend:  netip.AddrPortFrom(wordsAddr(v.Dst, k.Family), ne16(v.Dport)),
	}
	if c.State == "" {
		c.State = fmt.Sprintf("STATE_%d", v.State)
	}
	if be >= 0 {
		c.BackendName = m.f.Backends[be].Name
	}
	// The program's clock may run a tick ahead of the coarse clock read
	// here (calibrateClock): never more than the timeout.
	if end := v.Seen + uint64(to.timeout(v.State)); end > now {
		c.Expires = min(time.Duration(end-now), to.timeout(v.State))
	}
	return c
}

// ctIndex finds the farm of a forward entry by protocol and VIP. Where
// farms share a key (farms chosen by source table), it is the farm of the
// generation that made the flow while the plane holds that generation
// (ids are handed out in turn, so a freed one comes back only after all
// the others), else owners' answer (plan.ConnOwners).
type ctIndex struct {
	byVIP  map[ctVIP][]ctFarm
	svcs   map[uint32]string // generation id -> farm
	owners *plan.ConnOwners  // nil: the first farm of a key
}

type ctVIP struct {
	proto uint8
	vip   [4]uint32
}

func (p *Plane) newCTIndex(farms []*model.Farm, owners *plan.ConnOwners) ctIndex {
	x := ctIndex{byVIP: map[ctVIP][]ctFarm{}, owners: owners}
	for _, f := range farms {
		m := newCTFarm(f)
		for _, v := range m.vips {
			x.byVIP[ctVIP{m.proto, v}] = append(x.byVIP[ctVIP{m.proto, v}], m)
		}
	}
	if owners.Shared() {
		p.mu.Lock()
		x.svcs = make(map[uint32]string, len(p.bySvc))
		for id, g := range p.bySvc {
			x.svcs[id] = g.farm
		}
		p.mu.Unlock()
	}
	return x
}

// find returns the farm of forward entry k, v and the index of its
// backend (-1: none of the farm's backends has its address now); ok is
// false for a reply entry or an entry of no farm given.
func (x ctIndex) find(k *xlbCtKey, v *xlbCtVal) (ctFarm, int, bool) {
	if v.Dir != ctFwd {
		return ctFarm{}, -1, false
	}
	owner, asked := "", false
	for _, proto := range []uint8{k.Proto, 0} {
		for _, m := range x.byVIP[ctVIP{proto, k.Dst}] {
			ok, be := m.match(k, v)
			if !ok {
				continue
			}
			if !asked {
				owner, asked = x.owner(k, v), true
			}
			if owner == "" || owner == m.f.Name {
				return m, be, true
			}
		}
	}
	return ctFarm{}, -1, false
}

// owner names the farm of a forward entry whose key farms share ("" when
// none does).
func (x ctIndex) owner(k *xlbCtKey, v *xlbCtVal) string {
	vip := netip.AddrPortFrom(wordsAddr(k.Dst, k.Family), ne16(k.Dport))
	byKey := x.owners.Owner(k.Proto, vip, wordsAddr(k.Src, k.Family), wordsAddr(v.Dst, k.Family))
	if byKey == "" {
		return ""
	}
	if f, ok := x.svcs[v.Svc]; ok {
		return f
	}
	return byKey
}

// ctFilter is a dataplane.ConnFilter resolved against farms.
type ctFilter struct {
	idx     ctIndex
	backend string // "": any
	client  [4]uint32
	any     bool // no client given
}

func (p *Plane) newCTFilter(farms []*model.Farm, flt dataplane.ConnFilter) ctFilter {
	cf := ctFilter{idx: p.newCTIndex(farms, flt.Owners), backend: flt.Backend, any: !flt.Client.IsValid()}
	if !cf.any {
		cf.client = addrWords(flt.Client.Unmap())
	}
	return cf
}

func (cf ctFilter) find(k *xlbCtKey, v *xlbCtVal) (ctFarm, int, bool) {
	m, be, ok := cf.idx.find(k, v)
	if !ok || cf.backend != "" && (be < 0 || m.f.Backends[be].Name != cf.backend) || !cf.any && k.Src != cf.client {
		return m, be, false
	}
	return m, be, true
}

// Connections implements dataplane.ConnLister.
func (p *Plane) Connections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) ([]dataplane.Conn, error) {
	cf := p.newCTFilter(farms, flt)
	now, to := monotonicCoarse(), p.opts.Timeouts.withDefaults()
	var out []dataplane.Conn
	err := p.walkCT(ctx, func(k *xlbCtKey, v *xlbCtVal) {
		if m, be, ok := cf.find(k, v); ok {
			out = append(out, toConn(m, k, v, be, now, to))
		}
	})
	return out, err
}

// DeleteConnections implements dataplane.ConnLister: both entries of each
// matching connection are deleted.
func (p *Plane) DeleteConnections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) (int, error) {
	cf := p.newCTFilter(farms, flt)
	var fwd, peers []xlbCtKey
	err := p.walkCT(ctx, func(k *xlbCtKey, v *xlbCtVal) {
		if _, _, ok := cf.find(k, v); ok {
			fwd = append(fwd, *k)
			// The reply entry's key is the forward entry's value
			// reversed (ct_peer_key in bpf/xlb_lb.c).
			peers = append(peers, xlbCtKey{Src: v.Dst, Dst: v.Src, Sport: v.Dport, Dport: v.Sport, Proto: k.Proto, Family: k.Family})
		}
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range fwd {
		// Either entry may be gone already (expiry, LRU eviction, the
		// program's own removal).
		removed, err := p.removeFlow(&fwd[i])
		if err != nil {
			return n, err
		}
		if removed {
			n++
		}
		_ = p.objs.XlbCt.Delete(&peers[i])
	}
	return n, nil
}

// removeFlow removes the flow of forward entry k (both entries) through
// the program (xlb_ct_remove in bpf/xlb_lb.c), which counts it out of its
// backend's active connections as its own removals do; a plain map delete
// would leave it counted. False when the entry was gone already.
func (p *Plane) removeFlow(k *xlbCtKey) (bool, error) {
	ctx := make([]byte, binary.Size(*k))
	if _, err := binary.Encode(ctx, binary.NativeEndian, k); err != nil {
		return false, fmt.Errorf("encode conntrack key: %w", err)
	}
	rc, err := p.objs.XlbCtRemove.Run(&ebpf.RunOptions{Context: ctx})
	if err != nil {
		return false, fmt.Errorf("remove connection: %w", err)
	}
	return rc == 0, nil
}

// CountConns implements dataplane.ConnCounter. Active is the program's own
// count of each backend's TCP flows in SYN or EST (xlb_be_active, what lc
// and wlc schedule by: bpf/xlb_lc.h); Inactive, the entries of the
// backend's other flows (TCP closing, UDP), and Entries come from one walk
// of xlb_ct. The program's count is what IPVS's ActiveConn is, kept in the
// data path, so it is exact where a walk of a table that changes while it
// is read is not.
func (p *Plane) CountConns(ctx context.Context, farms []*model.Farm, owners *plan.ConnOwners) (dataplane.ConnTable, error) {
	idx := p.newCTIndex(farms, owners)
	out := dataplane.ConnTable{Capacity: uint64(p.objs.XlbCt.MaxEntries()), Backends: map[string][]dataplane.ConnCounts{}}
	counts := func(f *model.Farm) []dataplane.ConnCounts {
		c := out.Backends[f.Name]
		if c == nil {
			c = make([]dataplane.ConnCounts, len(f.Backends))
			out.Backends[f.Name] = c
		}
		return c
	}
	err := p.walkCT(ctx, func(k *xlbCtKey, v *xlbCtVal) {
		out.Entries++
		m, be, ok := idx.find(k, v)
		if !ok || be < 0 || v.State == ctStateSYN || v.State == ctStateEST {
			return
		}
		counts(m.f)[be].Inactive++
	})
	if err != nil {
		return out, err
	}
	err = p.activeCounts(farms, func(f *model.Farm, be int, n uint64) { counts(f)[be].Active += n })
	return out, err
}

// activeCounts reads the program's active connections (xlb_be_active) of
// the given farms' backends, by farm and backend index; a dual farm's
// halves add up. A count read below 0 (a decrement that raced ahead of
// its increment) is 0, as lc_pick() takes it.
func (p *Plane) activeCounts(farms []*model.Farm, fn func(f *model.Farm, be int, n uint64)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range farms {
		index := make(map[string]int, len(f.Backends))
		for i := range f.Backends {
			index[f.Backends[i].Name] = i
		}
		for _, h := range plan.Halves(f) {
			g := p.farms[h.Name]
			if g == nil {
				continue
			}
			for i, id := range g.ids {
				if id == 0 || id >= maxBackends || i >= len(g.names) {
					continue
				}
				be, ok := index[g.names[i]]
				if !ok {
					continue
				}
				var n int64
				if err := p.objs.XlbBeActive.Lookup(id, &n); err != nil {
					return fmt.Errorf("read active connections of backend %q of farm %q: %w", g.names[i], f.Name, err)
				}
				if n > 0 {
					fn(f, be, uint64(n))
				}
			}
		}
	}
	return nil
}

// dropReasons are the events of xlb_stats whose packets are dropped or
// refused (statNames; see enum xlb_stat in bpf/xlb_consts.h).
var dropReasons = []string{"no_backend", "snat_full", "fib_drop", "error"}

// PacketStats implements dataplane.PacketStats with xlb_stats.
func (p *Plane) PacketStats(ctx context.Context) (map[string]uint64, error) { return p.Stats() }

// DropReasons implements dataplane.PacketStats.
func (p *Plane) DropReasons() []string { return dropReasons }
