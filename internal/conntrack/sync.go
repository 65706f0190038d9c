package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// Syncer implements dataplane.ConnSyncer with the kernel's conntrack for
// the nft data plane: events out through ctnetlink's multicast groups,
// entries in with IPCTNL_MSG_CT_NEW and their NAT bindings (CTA_NAT_DST,
// CTA_NAT_SRC), as conntrackd does. Only connections the kernel translated
// (dnat or snat: xlb's farms) are synchronised. It works in the network
// namespace of the calling process.
type Syncer struct {
	// IsVIP, if set, limits the connections synchronised to those whose
	// original destination it accepts.
	IsVIP func(netip.Addr) bool

	mu sync.Mutex
	// fromPeers holds the connections installed from peers: their events
	// are not sent back. Each node sends what its own traffic created;
	// whoever carries a connection after a failover keeps it alive in its
	// own kernel, and a node that (re)joins gets every entry in its
	// peers' dumps. Only ends the kernel makes here (a timeout, a reset)
	// are always sent, a peer's copy's too; the events of the installs
	// themselves, an end a peer sent included, never come back to the
	// watch (ownevents.go). Bounded by the conntrack table's size.
	fromPeers map[connKey]struct{}
	// ids: the netlink port ids of the install sockets (ownevents.go).
	ids []uint32
}

// connKey is a connection in fromPeers: its addresses as bytes, not
// netip.Addr (whose pointer made the garbage collector scan the whole
// set, a hundred thousand keys and more under load).
type connKey struct {
	client, vip  [16]byte
	cport, vport uint16
	proto        uint8
	v6           bool // client and vip were IPv6 (not mapped IPv4)
}

func keyOf(c dataplane.SyncConn) connKey {
	return connKey{client: c.Client.Addr().As16(), vip: c.VIP.Addr().As16(), cport: c.Client.Port(),
		vport: c.VIP.Port(), proto: c.Proto, v6: c.Client.Addr().Is6()}
}

// Batching of events: at most this many, or this long.
const (
	batchMax  = 256
	batchWait = 10 * time.Millisecond
)

// WatchConns streams batches of balanced connections' events.
func (s *Syncer) WatchConns(ctx context.Context, fn func([]dataplane.ConnEvent)) error {
	w, err := s.dialWatch()
	if err != nil {
		return err
	}
	return s.watch(ctx, w, fn)
}

func (s *Syncer) watch(ctx context.Context, w *eventSocket, fn func([]dataplane.ConnEvent)) error {
	defer w.close()
	var (
		// One batch for the watcher's life: fn keeps none
		// (dataplane.ConnSyncer), so no garbage per batch.
		batch = make([]dataplane.ConnEvent, 0, batchMax)
		since time.Time // of the batch's first event
	)
	flush := func() {
		if len(batch) > 0 {
			fn(batch)
			batch = batch[:0]
		}
	}
	add := func(kind dataplane.ConnEventKind, f ctFlow) {
		e, ok := s.event(kind, f)
		if !ok {
			return
		}
		if len(batch) == 0 {
			since = time.Now()
		}
		batch = append(batch, e)
		if len(batch) >= batchMax {
			flush()
		}
	}
	for {
		if ctx.Err() != nil {
			flush()
			return nil
		}
		b, err := w.read()
		switch {
		case err == errTimeout:
			flush()
			continue
		case err != nil:
			flush()
			return fmt.Errorf("conntrack events: %w", err)
		}
		eachEvent(b, add)
		if len(batch) > 0 && time.Since(since) >= batchWait {
			flush()
		}
	}
}

func (s *Syncer) event(kind dataplane.ConnEventKind, f ctFlow) (dataplane.ConnEvent, bool) {
	c, ok := s.conn(f)
	if !ok {
		return dataplane.ConnEvent{}, false
	}
	if s.fromPeer(c, kind == dataplane.ConnEnd) && kind != dataplane.ConnEnd {
		return dataplane.ConnEvent{}, false
	}
	return dataplane.ConnEvent{Kind: kind, Conn: c}, true
}

// conn converts a flow the kernel translated (reply tuple differs from the
// inverse of the original) to a Conn.
func (s *Syncer) conn(f ctFlow) (dataplane.SyncConn, bool) {
	p := f.proto
	if !f.origOK || !f.repOK || p != unix.IPPROTO_TCP && p != unix.IPPROTO_UDP && p != unix.IPPROTO_SCTP {
		return dataplane.SyncConn{}, false
	}
	c := dataplane.SyncConn{
		Proto:   p,
		Client:  f.orig[0],
		VIP:     f.orig[1],
		Backend: f.reply[0],
		Reply:   f.reply[1],
		Timeout: f.timeout,
		Mark:    f.mark,
	}
	if c.Backend == c.VIP && c.Reply == c.Client {
		return c, false // not translated: not a balanced connection
	}
	if s.IsVIP != nil && !s.IsVIP(c.VIP.Addr()) {
		return c, false
	}
	if f.hasTCPState {
		c.TCPState = f.tcpState
	}
	return c, true
}

// flowOf is what conn reads of a dumped entry.
func flowOf(f *ct.Flow) ctFlow {
	o, r := f.TupleOrig, f.TupleReply
	cf := ctFlow{
		proto: o.Proto.Protocol,
		orig: [2]netip.AddrPort{netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort),
			netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort)},
		reply: [2]netip.AddrPort{netip.AddrPortFrom(r.IP.SourceAddress.Unmap(), r.Proto.SourcePort),
			netip.AddrPortFrom(r.IP.DestinationAddress.Unmap(), r.Proto.DestinationPort)},
		timeout: f.Timeout, mark: f.Mark, origOK: true, repOK: true,
	}
	if f.ProtoInfo.TCP != nil {
		cf.tcpState, cf.hasTCPState = f.ProtoInfo.TCP.State, true
	}
	return cf
}

// fromPeer reports whether c was installed from a peer; an end forgets
// it.
func (s *Syncer) fromPeer(c dataplane.SyncConn, end bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := keyOf(c)
	_, ok := s.fromPeers[k]
	if end {
		delete(s.fromPeers, k)
	}
	return ok
}

// maxFromPeers bounds the set of installed connections (the largest
// conntrack table --conn-table-size allows).
const maxFromPeers = 1 << 26

// rememberAll remembers the connections of evs that are not ends, and
// forgets the ends', under one lock.
func (s *Syncer) rememberAll(evs []dataplane.ConnEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		if ev.Kind == dataplane.ConnEnd {
			// Its event, the install's own, does not come back
			// (ownevents.go) to forget it.
			delete(s.fromPeers, keyOf(ev.Conn))
			continue
		}
		if s.fromPeers == nil || len(s.fromPeers) >= maxFromPeers {
			s.fromPeers = map[connKey]struct{}{}
		}
		c := ev.Conn
		s.fromPeers[keyOf(c)] = struct{}{}
	}
}

// Liberal makes the kernel's TCP tracking accept segments outside the
// windows it has seen (nf_conntrack_tcp_be_liberal=1, in the calling
// process's network namespace): an entry installed from a peer knows
// nothing of the connection's windows, and without this the first
// segments it carries would be marked invalid. conntrackd's documentation
// asks the same of its users.
func Liberal() error {
	const p = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("set net.netfilter.nf_conntrack_tcp_be_liberal=1 for connection sync: %w", err)
	}
	return nil
}

// DumpConns lists every balanced connection.
func (s *Syncer) DumpConns(ctx context.Context) ([]dataplane.SyncConn, error) {
	c, err := ct.Dial(nil)
	if err != nil {
		return nil, fmt.Errorf("conntrack dump: dial ctnetlink: %w", err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		return nil, fmt.Errorf("conntrack dump: %w", err)
	}
	out := make([]dataplane.SyncConn, 0, len(flows))
	for i := range flows {
		if cn, ok := s.conn(flowOf(&flows[i])); ok {
			out = append(out, cn)
		}
	}
	return out, nil
}

// InstallConns creates (or updates) the entries of new and updated
// connections, with their NAT bindings, and deletes those of ended ones.
// A batch goes to the kernel in writes of up to 64 KiB with one
// acknowledgement each (nlSocket.exec): one round trip per batch, not per
// connection.
func (s *Syncer) InstallConns(ctx context.Context, evs []dataplane.ConnEvent) (int, error) {
	// Persistence sessions are not the kernel's conntrack: the nft
	// plane's go through internal/cluster/sessionsync, which passes none
	// here; any that come are not installed.
	if slices.ContainsFunc(evs, func(ev dataplane.ConnEvent) bool { return ev.Kind == dataplane.ConnSession }) {
		evs = slices.DeleteFunc(slices.Clone(evs), func(ev dataplane.ConnEvent) bool { return ev.Kind == dataplane.ConnSession })
	}
	sock, err := openNetlink(s.installIDs()...)
	if err != nil {
		return 0, fmt.Errorf("conntrack install: %w", err)
	}
	defer sock.close()
	sc := installRooms.Get().(*installRoom)
	defer installRooms.Put(sc)
	buf, ends := sc.buf[:0], sc.ends[:0]
	defer func() { sc.buf, sc.ends = buf[:0], ends[:0] }()
	s.rememberAll(evs)
	for _, ev := range evs {
		typ, flags := uint8(msgNew), uint16(unix.NLM_F_CREATE|unix.NLM_F_EXCL)
		if ev.Kind == dataplane.ConnEnd {
			typ, flags = msgDelete, 0
		}
		buf = appendRequest(buf, ev.Conn, typ, flags)
		ends = append(ends, len(buf))
	}
	sc.reqs = split(sc.reqs[:0], buf, ends)
	errs := grow(sc.errs, len(evs))
	sc.errs = errs
	if err := sock.exec(sc.reqs, errs); err != nil {
		return 0, fmt.Errorf("conntrack install: %w", err)
	}
	// Entries known here already: refresh their timeout and state.
	again := sc.again[:0]
	defer func() { sc.again = again[:0] }()
	for i, e := range errs {
		if e == unix.EEXIST && evs[i].Kind != dataplane.ConnEnd {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		buf = buf[:0]
		ends = ends[:0]
		for _, i := range again {
			buf = appendRequest(buf, evs[i].Conn, msgNew, 0)
			ends = append(ends, len(buf))
		}
		sc.reqs = split(sc.reqs[:0], buf, ends)
		uerrs := grow(sc.uerrs, len(again))
		sc.uerrs = uerrs
		if err := sock.exec(sc.reqs, uerrs); err != nil {
			return 0, fmt.Errorf("conntrack install: %w", err)
		}
		for j, i := range again {
			errs[i] = uerrs[j]
		}
	}
	n := 0
	var first error
	for i, e := range errs {
		switch {
		case e == 0:
			n++
		case e == unix.ENOENT && evs[i].Kind == dataplane.ConnEnd:
			// Gone already.
		case first == nil:
			c := evs[i].Conn
			first = fmt.Errorf("install connection %s %s -> %s: %w", protoName(c.Proto), c.Client, c.VIP, e)
		}
	}
	return n, first
}

// installRoom is an InstallConns call's room, kept between calls (a
// batch made no garbage but its events'; calls may run at once, one per
// peer: pooled).
type installRoom struct {
	buf         []byte // the requests
	ends        []int  // where each ends in buf
	reqs        [][]byte
	errs, uerrs []unix.Errno
	again       []int
}

var installRooms = sync.Pool{New: func() any { return new(installRoom) }}

// grow returns s with length n (its contents undefined).
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// split appends to dst buf cut at the given ends into its messages.
func split(dst [][]byte, buf []byte, ends []int) [][]byte {
	start := 0
	for _, e := range ends {
		dst = append(dst, buf[start:e:e])
		start = e
	}
	return dst
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}
