package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
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
	// peers' dumps. Only ends are always sent (a peer's copy goes too).
	// Bounded by the conntrack table's size.
	fromPeers map[connKey]struct{}
}

type connKey struct {
	proto       uint8
	client, vip netip.AddrPort
}

// Batching of events: at most this many, or this long.
const (
	batchMax  = 256
	batchWait = 10 * time.Millisecond
)

// WatchConns streams batches of balanced connections' events.
func (s *Syncer) WatchConns(ctx context.Context, fn func([]dataplane.ConnEvent)) error {
	w, err := dialWatch()
	if err != nil {
		return err
	}
	return s.watch(ctx, w, fn)
}

// watchConn is a ctnetlink socket in the conntrack event groups.
type watchConn struct {
	c     *ct.Conn
	evCh  chan ct.Event
	errCh chan error
}

// dialWatch opens the event socket in the calling thread's namespace.
func dialWatch() (*watchConn, error) {
	return dialWatchGroups(netfilter.GroupCTNew, netfilter.GroupCTUpdate, netfilter.GroupCTDestroy)
}

func (s *Syncer) watch(ctx context.Context, w *watchConn, fn func([]dataplane.ConnEvent)) error {
	defer w.c.Close()
	var batch []dataplane.ConnEvent
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	flush := func() {
		if len(batch) > 0 {
			fn(batch)
			batch = nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			flush()
			return nil
		case err := <-w.errCh:
			flush()
			return fmt.Errorf("conntrack events: %w", err)
		case ev := <-w.evCh:
			e, ok := s.event(ev)
			if !ok {
				continue
			}
			if len(batch) == 0 {
				timer.Reset(batchWait)
			}
			batch = append(batch, e)
			if len(batch) >= batchMax {
				timer.Stop()
				flush()
			}
		case <-timer.C:
			flush()
		}
	}
}

func (s *Syncer) event(ev ct.Event) (dataplane.ConnEvent, bool) {
	if ev.Flow == nil {
		return dataplane.ConnEvent{}, false
	}
	var kind dataplane.ConnEventKind
	switch ev.Type {
	case ct.EventNew:
		kind = dataplane.ConnNew
	case ct.EventUpdate:
		kind = dataplane.ConnUpdate
	case ct.EventDestroy:
		kind = dataplane.ConnEnd
	default:
		return dataplane.ConnEvent{}, false
	}
	c, ok := s.conn(ev.Flow)
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
func (s *Syncer) conn(f *ct.Flow) (dataplane.SyncConn, bool) {
	o, r := f.TupleOrig, f.TupleReply
	p := o.Proto.Protocol
	if p != unix.IPPROTO_TCP && p != unix.IPPROTO_UDP && p != unix.IPPROTO_SCTP {
		return dataplane.SyncConn{}, false
	}
	c := dataplane.SyncConn{
		Proto:   p,
		Client:  netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort),
		VIP:     netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort),
		Backend: netip.AddrPortFrom(r.IP.SourceAddress.Unmap(), r.Proto.SourcePort),
		Reply:   netip.AddrPortFrom(r.IP.DestinationAddress.Unmap(), r.Proto.DestinationPort),
		Timeout: f.Timeout,
		Mark:    f.Mark,
	}
	if c.Backend == c.VIP && c.Reply == c.Client {
		return c, false // not translated: not a balanced connection
	}
	if s.IsVIP != nil && !s.IsVIP(c.VIP.Addr()) {
		return c, false
	}
	if f.ProtoInfo.TCP != nil {
		c.TCPState = f.ProtoInfo.TCP.State
	}
	return c, true
}

// fromPeer reports whether c was installed from a peer; an end forgets
// it.
func (s *Syncer) fromPeer(c dataplane.SyncConn, end bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := connKey{c.Proto, c.Client, c.VIP}
	_, ok := s.fromPeers[k]
	if end {
		delete(s.fromPeers, k)
	}
	return ok
}

// maxFromPeers bounds the set of installed connections (the largest
// conntrack table --conn-table-size allows).
const maxFromPeers = 1 << 26

func (s *Syncer) remember(c dataplane.SyncConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fromPeers == nil || len(s.fromPeers) >= maxFromPeers {
		s.fromPeers = map[connKey]struct{}{}
	}
	s.fromPeers[connKey{c.Proto, c.Client, c.VIP}] = struct{}{}
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
		if cn, ok := s.conn(&flows[i]); ok {
			out = append(out, cn)
		}
	}
	return out, nil
}

// InstallConns creates (or updates) the entries of new and updated
// connections, with their NAT bindings, and deletes those of ended ones.
// A batch goes to the kernel in one write and its acknowledgements are
// read together: one round trip per batch, not per connection.
func (s *Syncer) InstallConns(ctx context.Context, evs []dataplane.ConnEvent) (int, error) {
	sock, err := openNetlink()
	if err != nil {
		return 0, fmt.Errorf("conntrack install: %w", err)
	}
	defer sock.close()
	reqs := make([][]byte, len(evs))
	for i, ev := range evs {
		typ, flags := uint8(msgNew), netlink.Create|netlink.Excl
		if ev.Kind == dataplane.ConnEnd {
			typ, flags = msgDelete, 0
		} else {
			s.remember(ev.Conn)
		}
		if reqs[i], err = request(ev.Conn, typ, flags); err != nil {
			return 0, fmt.Errorf("conntrack install: %w", err)
		}
	}
	errs, err := sock.exec(reqs)
	if err != nil {
		return 0, fmt.Errorf("conntrack install: %w", err)
	}
	// Entries known here already: refresh their timeout and state.
	var again []int
	for i, e := range errs {
		if e == unix.EEXIST && evs[i].Kind != dataplane.ConnEnd {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		upd := make([][]byte, len(again))
		for j, i := range again {
			if upd[j], err = request(evs[i].Conn, msgNew, 0); err != nil {
				return 0, fmt.Errorf("conntrack install: %w", err)
			}
		}
		uerrs, err := sock.exec(upd)
		if err != nil {
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

// ctnetlink message types and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	msgNew    = 0 // IPCTNL_MSG_CT_NEW
	msgDelete = 2 // IPCTNL_MSG_CT_DELETE

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaProtoinfo  = 4
	ctaNatSrc     = 6
	ctaTimeout    = 7
	ctaMark       = 8
	ctaNatDst     = 13

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4
	ctaProtoNum   = 1
	ctaProtoSrc   = 2
	ctaProtoDst   = 3

	ctaNatV4MinIP = 1
	ctaNatV4MaxIP = 2
	ctaNatProto   = 3
	ctaNatV6MinIP = 4
	ctaNatV6MaxIP = 5
	ctaPortMin    = 1
	ctaPortMax    = 2

	ctaProtoinfoTCP      = 1
	ctaProtoinfoTCPState = 1

	statusSeenReply = 1 << 1
	statusAssured   = 1 << 2
	// The kernel marks a new entry confirmed before it applies CTA_STATUS
	// and refuses (EBUSY) a status that would clear that bit.
	statusConfirmed = 1 << 3
)

// request builds the ctnetlink request of c (its sequence number is set
// when it is sent).
func request(c dataplane.SyncConn, typ uint8, flags netlink.HeaderFlags) ([]byte, error) {
	attrs := []netfilter.Attribute{tuple(ctaTupleOrig, c.Proto, c.Client, c.VIP)}
	if typ == msgNew {
		// The reply tuple as it stands before translation; the NAT
		// bindings below turn it into the translated one.
		attrs = append(attrs, tuple(ctaTupleReply, c.Proto, c.VIP, c.Client))
		if flags&netlink.Create != 0 {
			if c.Backend != c.VIP {
				attrs = append(attrs, natRange(ctaNatDst, c.Backend))
			}
			if c.Reply != c.Client {
				attrs = append(attrs, natRange(ctaNatSrc, c.Reply))
			}
		}
		timeout := c.Timeout
		if timeout == 0 {
			timeout = 120
		}
		attrs = append(attrs, u32(ctaTimeout, timeout))
		if c.Mark != 0 {
			attrs = append(attrs, u32(ctaMark, c.Mark))
		}
		if c.Proto == unix.IPPROTO_TCP && c.TCPState != 0 {
			attrs = append(attrs, netfilter.Attribute{Type: ctaProtoinfo, Nested: true, Children: []netfilter.Attribute{
				{Type: ctaProtoinfoTCP, Nested: true, Children: []netfilter.Attribute{
					{Type: ctaProtoinfoTCPState, Data: []byte{c.TCPState}},
				}},
			}})
		}
		if c.Proto != unix.IPPROTO_TCP || c.TCPState >= tcpEstablished {
			attrs = append(attrs, u32(ctaStatus, statusSeenReply|statusAssured|statusConfirmed))
		}
	}
	fam := netfilter.ProtoIPv4
	if c.Client.Addr().Is6() {
		fam = netfilter.ProtoIPv6
	}
	req, err := netfilter.MarshalNetlink(netfilter.Header{
		SubsystemID: netfilter.NFSubsysCTNetlink,
		MessageType: netfilter.MessageType(typ),
		Family:      fam,
		Flags:       netlink.Request | netlink.Acknowledge | flags,
	}, attrs)
	if err != nil {
		return nil, err
	}
	req.Header.Length = uint32(unix.NLMSG_HDRLEN + len(req.Data))
	return req.MarshalBinary()
}

func u32(t uint16, v uint32) netfilter.Attribute {
	a := netfilter.Attribute{Type: t}
	a.PutUint32(v)
	return a
}

func u16(t uint16, v uint16) netfilter.Attribute {
	a := netfilter.Attribute{Type: t}
	a.PutUint16(v)
	return a
}

func tuple(t uint16, proto uint8, src, dst netip.AddrPort) netfilter.Attribute {
	ipSrc, ipDst := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if src.Addr().Is6() {
		ipSrc, ipDst = ctaIPv6Src, ctaIPv6Dst
	}
	return netfilter.Attribute{Type: t, Nested: true, Children: []netfilter.Attribute{
		{Type: ctaTupleIP, Nested: true, Children: []netfilter.Attribute{
			{Type: ipSrc, Data: src.Addr().AsSlice()},
			{Type: ipDst, Data: dst.Addr().AsSlice()},
		}},
		{Type: ctaTupleProto, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaProtoNum, Data: []byte{proto}},
			u16(ctaProtoSrc, src.Port()),
			u16(ctaProtoDst, dst.Port()),
		}},
	}}
}

func natRange(t uint16, to netip.AddrPort) netfilter.Attribute {
	minT, maxT := uint16(ctaNatV4MinIP), uint16(ctaNatV4MaxIP)
	if to.Addr().Is6() {
		minT, maxT = ctaNatV6MinIP, ctaNatV6MaxIP
	}
	return netfilter.Attribute{Type: t, Nested: true, Children: []netfilter.Attribute{
		{Type: minT, Data: to.Addr().AsSlice()},
		{Type: maxT, Data: to.Addr().AsSlice()},
		{Type: ctaNatProto, Nested: true, Children: []netfilter.Attribute{
			u16(ctaPortMin, to.Port()),
			u16(ctaPortMax, to.Port()),
		}},
	}}
}
