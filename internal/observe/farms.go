package observe

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// The farm and backend families. Names follow node_exporter's IPVS
// collector where the meaning is the same (node_ipvs_connections_total,
// node_ipvs_incoming_packets_total, node_ipvs_backend_connections_active,
// node_ipvs_backend_weight, ...) with xlb_farm_ and xlb_backend_ in place
// of node_ipvs_ and node_ipvs_backend_, and node_exporter's conntrack
// collector's (node_nf_conntrack_entries, _entries_limit). Samples are
// labelled by farm (and backend) name only; the addresses are in the
// xlb_farm_info and xlb_backend_info series, to be joined on those names.

// scrape is what one scrape read, per farm in the snapshot's order.
type scrape struct {
	farms    []*model.Farm
	counters []dataplane.FarmCounters // nil: the plane keeps none
	health   [][]engine.BackendHealth
	lost     []bool
	conns    *dataplane.ConnTable // nil: not countable
	// walkAt, walkTook: when the walk that counted conns started, and
	// how long it took.
	walkAt   time.Time
	walkTook time.Duration
	packets  map[string]uint64 // nil: the plane keeps none
	drops    []string
}

// connCache keeps the last walk of the connection table. A walk costs in
// proportion to the table (BenchmarkCountConns: about 1 µs per connection
// on the eBPF plane, 0.1 s at 100,000), so a scrape never waits for one
// but the first: it serves the last walk and starts the next in the
// background when the last is older than ConnWalkEvery. The counts are
// then up to one scrape interval old (xlb_conntrack_walk_timestamp_seconds
// says when they were taken).
type connCache struct {
	mu      sync.Mutex
	at      time.Time     // when the last walk started
	took    time.Duration // how long it took
	table   *dataplane.ConnTable
	running bool
	// none: the plane cannot count connections (no further walks).
	none bool
}

// connTable returns the last walk's counts (nil if there is none), and
// starts a new walk if that one is stale. farms are the snapshot's.
func (m *Metrics) connTable(ctx context.Context, farms []*model.Farm) *dataplane.ConnTable {
	c := &m.conns
	c.mu.Lock()
	if c.none {
		c.mu.Unlock()
		return nil
	}
	stale := c.table == nil || time.Since(c.at) >= m.opts.ConnWalkEvery
	if stale && !c.running {
		c.running = true
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Not the scrape's context: the walk outlives a scrape
			// that does not wait for it.
			m.walkConns(context.WithoutCancel(ctx), farms)
		}()
		if c.table == nil {
			// The first walk: wait for it (as long as the scrape may).
			c.mu.Unlock()
			select {
			case <-done:
			case <-ctx.Done():
			}
			c.mu.Lock()
		}
	}
	t := c.table
	c.mu.Unlock()
	return t
}

func (m *Metrics) walkConns(ctx context.Context, farms []*model.Farm) {
	start := time.Now()
	t, ok, err := m.opts.Engine.CountConns(ctx, farms)
	c := &m.conns
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running = false
	switch {
	case err != nil:
		m.collectErrors.WithLabelValues("connections").Inc()
		m.opts.Log.Warn("metrics: count connections", "err", err)
	case !ok:
		c.none = true
	default:
		c.table, c.at, c.took = &t, start, time.Since(start)
	}
}

func (m *Metrics) read(ctx context.Context) *scrape {
	eng := m.opts.Engine
	snap := eng.Snapshot()
	s := &scrape{farms: snap.Farms()}
	s.health = make([][]engine.BackendHealth, len(s.farms))
	s.lost = make([]bool, len(s.farms))
	for i, f := range s.farms {
		s.health[i], s.lost[i] = eng.FarmHealth(f)
	}
	s.counters = m.readCounters(ctx, s.farms)
	s.conns = m.connTable(ctx, s.farms)
	m.conns.mu.Lock()
	s.walkAt, s.walkTook = m.conns.at, m.conns.took
	m.conns.mu.Unlock()
	if ps, ok := eng.Dataplane().(dataplane.PacketStats); ok {
		var err error
		if s.packets, err = ps.PacketStats(ctx); err != nil {
			m.collectErrors.WithLabelValues("packets").Inc()
			m.opts.Log.Warn("metrics: read packet statistics", "err", err)
			s.packets = nil
		}
		s.drops = ps.DropReasons()
	}
	return s
}

// readCounters returns the farms' counters (nil when the plane keeps
// none): the rate estimator's last read if recent, else a read of the
// plane.
func (m *Metrics) readCounters(ctx context.Context, farms []*model.Farm) []dataplane.FarmCounters {
	if cs, ok := m.recentCounters(farms); ok {
		return cs
	}
	_, cs, err := m.opts.Engine.AllCounters(ctx)
	var ns *engine.NotSupportedError
	switch {
	case errors.As(err, &ns):
	case err != nil:
		m.collectErrors.WithLabelValues("counters").Inc()
		m.opts.Log.Warn("metrics: read counters", "err", err)
	case len(cs) == len(farms):
		return cs
	}
	return nil
}

// recentCounters returns the rate estimator's last read of the counters,
// in the order of farms and their backends, if it is under two ticks old.
func (m *Metrics) recentCounters(farms []*model.Farm) ([]dataplane.FarmCounters, bool) {
	if m.opts.Rates == nil {
		return nil, false
	}
	last, at := m.opts.Rates.Last()
	if at.IsZero() || time.Since(at) > 2*RateTick {
		return nil, false
	}
	out := make([]dataplane.FarmCounters, len(farms))
	for i, f := range farms {
		c := last[f.Name]
		out[i].Counters = c.Counters
		out[i].Backends = make([]dataplane.BackendCounters, len(f.Backends))
		for j, b := range f.Backends {
			out[i].Backends[j].Name = b.Name
			for _, bc := range c.Backends {
				if bc.Name == b.Name {
					out[i].Backends[j].Counters = bc.Counters
					break
				}
			}
		}
	}
	return out, true
}

// expo appends the text exposition format.
type expo struct {
	b []byte
	// farm[i] is `{farm="NAME"`, backend[i][j] `{farm="NAME",backend="B"`.
	farm    [][]byte
	backend [][][]byte
}

func (e *expo) family(name, typ, help string) {
	e.b = append(e.b, "# HELP "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, help...)
	e.b = append(e.b, "\n# TYPE "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, typ...)
	e.b = append(e.b, '\n')
}

// appendLabelValue appends v quoted as a label value.
func appendLabelValue(dst []byte, v string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			dst = append(dst, `\\`...)
		case '"':
			dst = append(dst, `\"`...)
		case '\n':
			dst = append(dst, `\n`...)
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

func label(dst []byte, name, value string) []byte {
	dst = append(dst, ',')
	dst = append(dst, name...)
	dst = append(dst, '=')
	return appendLabelValue(dst, value)
}

// sample appends `name{prefix extra} value`.
func (e *expo) sample(name string, prefix, extra []byte, v uint64) {
	e.b = append(e.b, name...)
	e.b = append(e.b, prefix...)
	e.b = append(e.b, extra...)
	e.b = append(e.b, "} "...)
	e.b = strconv.AppendUint(e.b, v, 10)
	e.b = append(e.b, '\n')
}

func (e *expo) sampleFloat(name string, prefix, extra []byte, v float64) {
	e.b = append(e.b, name...)
	e.b = append(e.b, prefix...)
	e.b = append(e.b, extra...)
	e.b = append(e.b, "} "...)
	switch {
	case math.IsNaN(v):
		e.b = append(e.b, "NaN"...)
	default:
		e.b = strconv.AppendFloat(e.b, v, 'g', -1, 64)
	}
	e.b = append(e.b, '\n')
}

// global appends a sample without labels.
func (e *expo) global(name string, v uint64) {
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = strconv.AppendUint(e.b, v, 10)
	e.b = append(e.b, '\n')
}

func (e *expo) globalFloat(name string, v float64) {
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = strconv.AppendFloat(e.b, v, 'g', -1, 64)
	e.b = append(e.b, '\n')
}

// counterFields are the traffic counter families, by suffix.
var counterFields = []struct {
	suffix, help string
	get          func(*dataplane.Counters) uint64
}{
	{"connections_total", "Connections scheduled (new flows).", func(c *dataplane.Counters) uint64 { return c.Connections }},
	{"incoming_packets_total", "Packets from clients (client -> backend).", func(c *dataplane.Counters) uint64 { return c.InPackets }},
	{"outgoing_packets_total", "Packets to clients (backend -> client; dsr and stlsdnat replies bypass the balancer and are not counted).", func(c *dataplane.Counters) uint64 { return c.OutPackets }},
	{"incoming_bytes_total", "Bytes of IP packets from clients.", func(c *dataplane.Counters) uint64 { return c.InBytes }},
	{"outgoing_bytes_total", "Bytes of IP packets to clients.", func(c *dataplane.Counters) uint64 { return c.OutBytes }},
}

var healthStates = []string{engine.HealthUp, engine.HealthDown, engine.HealthUnchecked}

// appendFarms appends the farm and backend families to dst.
func (m *Metrics) appendFarms(ctx context.Context, dst []byte) []byte {
	s := m.read(ctx)
	nb := 0
	for _, f := range s.farms {
		nb += len(f.Backends)
	}
	e := &expo{b: dst, farm: make([][]byte, len(s.farms)), backend: make([][][]byte, len(s.farms))}
	// Label prefixes, built once: every family reuses them.
	pre := make([]byte, 0, len(s.farms)*24+nb*40)
	for i, f := range s.farms {
		st := len(pre)
		pre = append(pre, `{farm=`...)
		pre = appendLabelValue(pre, f.Name)
		e.farm[i] = pre[st:len(pre):len(pre)]
		e.backend[i] = make([][]byte, len(f.Backends))
		for j := range f.Backends {
			st := len(pre)
			pre = append(pre, e.farm[i]...)
			pre = label(pre, "backend", f.Backends[j].Name)
			e.backend[i][j] = pre[st:len(pre):len(pre)]
		}
	}

	e.family("xlb_farms", "gauge", "Farms configured.")
	e.global("xlb_farms", uint64(len(s.farms)))
	e.family("xlb_backends", "gauge", "Backends configured, in all farms.")
	e.global("xlb_backends", uint64(nb))

	var extra []byte
	e.family("xlb_farm_info", "gauge", "A farm's addresses and settings (always 1); local_address is each VIP and further address (empty for a firewall-mark farm).")
	for i, f := range s.farms {
		// One sample per listener: each VIP and each further address
		// (nftlb's addresses), with its own ports and protocol.
		ls := f.Listeners()
		if len(ls) == 0 {
			ls = append(ls, model.Listener{Addr: netipZero, Protocol: f.Protocol, Ports: f.VirtualPorts})
		}
		for _, l := range ls {
			extra = extra[:0]
			v := ""
			if l.Addr.IsValid() {
				v = l.Addr.String()
			}
			extra = label(extra, "local_address", v)
			extra = label(extra, "local_ports", portsText(l.Ports))
			extra = label(extra, "local_mark", markText(f))
			extra = label(extra, "proto", l.Protocol.String())
			extra = label(extra, "mode", f.Mode.String())
			extra = label(extra, "scheduler", f.Scheduler.String())
			extra = label(extra, "state", f.State.String())
			e.sample("xlb_farm_info", e.farm[i], extra, 1)
		}
	}
	e.family("xlb_backend_info", "gauge", "A backend's address (always 1); remote_port 0: the port the client connected to.")
	for i, f := range s.farms {
		for j := range f.Backends {
			b := &f.Backends[j]
			extra = label(extra[:0], "remote_address", b.Addr.String())
			extra = label(extra, "remote_port", strconv.Itoa(int(b.Port)))
			extra = label(extra, "state", b.State.String())
			e.sample("xlb_backend_info", e.backend[i][j], extra, 1)
		}
	}

	if s.counters != nil {
		for _, cf := range counterFields {
			name := "xlb_farm_" + cf.suffix
			e.family(name, "counter", cf.help+" Of the farm (its backends', and those of backends since removed).")
			for i := range s.farms {
				e.sample(name, e.farm[i], nil, cf.get(&s.counters[i].Counters))
			}
		}
		for _, cf := range counterFields {
			name := "xlb_backend_" + cf.suffix
			e.family(name, "counter", cf.help+" Of the backend.")
			for i, f := range s.farms {
				bc := s.counters[i].Backends
				for j := range f.Backends {
					if j < len(bc) {
						e.sample(name, e.backend[i][j], nil, cf.get(&bc[j].Counters))
					}
				}
			}
		}
	}

	if s.conns != nil {
		for k, name := range []string{"xlb_backend_connections_active", "xlb_backend_connections_inactive"} {
			help := "TCP connections of the backend that are active (IPVS's ActiveConn; eBPF: the program's own count of flows in SYN or ESTABLISHED; nft: ESTABLISHED in a walk of conntrack)."
			if k == 1 {
				help = "Other connections tracked for the backend: TCP closing (on nft also opening), UDP (IPVS's InActConn)."
			}
			e.family(name, "gauge", help)
			for i, f := range s.farms {
				cc := s.conns.Backends[f.Name]
				for j := range f.Backends {
					var v uint64
					if j < len(cc) {
						v = cc[j].Active
						if k == 1 {
							v = cc[j].Inactive
						}
					}
					e.sample(name, e.backend[i][j], nil, v)
				}
			}
		}
		e.family("xlb_conntrack_walk_timestamp_seconds", "gauge", "When the walk of the connection table that counted the connections and entries started (Unix time; walks run in the background, at most every second).")
		e.globalFloat("xlb_conntrack_walk_timestamp_seconds", float64(s.walkAt.UnixNano())/1e9)
		e.family("xlb_conntrack_walk_duration_seconds", "gauge", "How long that walk took.")
		e.globalFloat("xlb_conntrack_walk_duration_seconds", s.walkTook.Seconds())
		e.family("xlb_conntrack_entries", "gauge", "Entries of the connection table (eBPF: two per connection, one for dsr; nft: netfilter's conntrack of the namespace).")
		e.global("xlb_conntrack_entries", s.conns.Entries)
		if s.conns.Capacity > 0 {
			e.family("xlb_conntrack_entries_limit", "gauge", "Capacity of the connection table in entries (eBPF: --conn-table-size x 2; nft: nf_conntrack_max).")
			e.global("xlb_conntrack_entries_limit", s.conns.Capacity)
		}
	}

	e.family("xlb_backend_weight", "gauge", "The backend's effective weight, what the data plane schedules with: configured weight x health x warm-up; 0 while down, drained or not serving.")
	for i, f := range s.farms {
		for j := range f.Backends {
			e.sample("xlb_backend_weight", e.backend[i][j], nil, uint64(s.health[i][j].Weight))
		}
	}
	e.family("xlb_backend_configured_weight", "gauge", "The backend's configured weight.")
	for i, f := range s.farms {
		for j := range f.Backends {
			e.sample("xlb_backend_configured_weight", e.backend[i][j], nil, uint64(f.Backends[j].Weight))
		}
	}
	e.family("xlb_backend_health_state", "gauge", "The backend's health by its checks: 1 for its state (up, down, or unchecked when no check applies), 0 for the others.")
	for i, f := range s.farms {
		for j := range f.Backends {
			for _, st := range healthStates {
				extra = label(extra[:0], "state", st)
				v := uint64(0)
				if s.health[i][j].State == st {
					v = 1
				}
				e.sample("xlb_backend_health_state", e.backend[i][j], extra, v)
			}
		}
	}
	e.family("xlb_backend_health_transitions_total", "counter", "Transitions of a checked backend to down and back up since its check started.")
	for i, f := range s.farms {
		for j := range f.Backends {
			h := &s.health[i][j]
			if h.State == engine.HealthUnchecked {
				continue
			}
			e.sample("xlb_backend_health_transitions_total", e.backend[i][j], []byte(`,to="down"`), h.Downs)
			e.sample("xlb_backend_health_transitions_total", e.backend[i][j], []byte(`,to="up"`), h.Ups)
		}
	}
	e.family("xlb_farm_quorum_lost", "gauge", "1 while a farm with a sorry server has fewer backends up than its quorum.")
	for i, f := range s.farms {
		if f.Check != nil && f.Check.SorryServer != "" {
			v := uint64(0)
			if s.lost[i] {
				v = 1
			}
			e.sample("xlb_farm_quorum_lost", e.farm[i], nil, v)
		}
	}
	m.appendChecks(e, s)

	if s.packets != nil {
		e.family("xlb_ebpf_packets_total", "counter", "Packets by what the eBPF program did with them (event: see enum xlb_stat in bpf/xlb_consts.h).")
		for _, name := range sortedKeys(s.packets) {
			extra = label(extra[:0], "event", name)
			extra[0] = '{'
			e.sample("xlb_ebpf_packets_total", nil, extra, s.packets[name])
		}
		e.family("xlb_dropped_packets_total", "counter", "Packets the data plane dropped or refused, by reason (no_backend: refused with ICMP unreachable).")
		for _, r := range s.drops {
			extra = label(extra[:0], "reason", r)
			extra[0] = '{'
			e.sample("xlb_dropped_packets_total", nil, extra, s.packets[r])
		}
	}
	return e.b
}

// appendChecks appends the last checks of checked backends.
func (m *Metrics) appendChecks(e *expo, s *scrape) {
	checks := m.checks()
	if checks == nil {
		return
	}
	type last struct {
		i, j          int
		took          float64
		checks, fails uint64
	}
	var ls []last
	for i, f := range s.farms {
		if !f.HasChecks() {
			continue
		}
		for j := range f.Backends {
			if s.health[i][j].State == engine.HealthUnchecked {
				continue
			}
			st, ok := checks.Status(f.Name, f.Backends[j].Name)
			if !ok {
				continue
			}
			took := math.NaN()
			if st.Checked {
				took = st.Last.Took.Seconds()
			}
			ls = append(ls, last{i, j, took, st.Checks, st.Fails})
		}
	}
	e.family("xlb_backend_check_duration_seconds", "gauge", "Duration of the backend's last health check (NaN before the first).")
	for _, l := range ls {
		e.sampleFloat("xlb_backend_check_duration_seconds", e.backend[l.i][l.j], nil, l.took)
	}
	e.family("xlb_backend_checks_total", "counter", "Health checks run against the backend.")
	for _, l := range ls {
		e.sample("xlb_backend_checks_total", e.backend[l.i][l.j], nil, l.checks)
	}
	e.family("xlb_backend_check_failures_total", "counter", "Health checks of the backend that failed.")
	for _, l := range ls {
		e.sample("xlb_backend_check_failures_total", e.backend[l.i][l.j], nil, l.fails)
	}
}

var netipZero netip.Addr

// portsText is a farm's virtual ports as nftlb writes them ("80,443,1000-2000"; "" for every port).
func portsText(ports []model.PortRange) string {
	var b []byte
	for i, r := range ports {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, r.String()...)
	}
	return string(b)
}

// markText is a firewall-mark farm's mark ("0x1"), else "".
func markText(f *model.Farm) string {
	if !f.IsMarkFarm() {
		return ""
	}
	return "0x" + strconv.FormatUint(uint64(f.Mark), 16)
}

func sortedKeys(m map[string]uint64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
