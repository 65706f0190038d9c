package conntrack

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/nsenter"
)

// Passive watches the handshakes of the TCP connections netfilter's
// conntrack tracks for the backends of farms with a passive check
// (dataplane.PassiveReader for the nft plane), from conntrack's events
// over netlink:
//
//   - a new entry (NEW, state SYN_SENT) whose original destination is a
//     watched farm's VIP and port and whose reply comes from one of its
//     backends is a handshake under way;
//   - its state moving on to SYN_RECV or ESTABLISHED (UPDATE) is the
//     backend's SYN-ACK: a success;
//   - the entry dropped in state CLOSE before any SYN-ACK is a RST
//     (netfilter deletes an entry at once whose only reply is a RST); it
//     is the backend's, a failure, when the entry's accounting counts a
//     packet in the reply direction (a client that resets its own SYN is
//     not counted). Passive turns nf_conntrack_acct on in the namespace
//     while it watches (and back off after, if it was off): a count per
//     packet, two additions;
//   - no answer within the farm's passive timeout (swept at each read) is
//     a failure: conntrack itself keeps a SYN_SENT entry 2 minutes.
//
// Each connection counts once. The events are those of every connection
// of the namespace (netfilter cannot be told to send only some): a cost
// per connection that exists only while a farm has passive checks, since
// the listener runs only then. They are read every passivePoll in batches. Not seen here, unlike on the eBPF plane:
// ICMP errors about the SYN (conntrack does not change the entry's state)
// and a SYN-ACK later than the timeout (counted as the timeout).
type Passive struct {
	log *slog.Logger
	ns  netns.NsHandle

	mu      sync.Mutex
	byVIP   map[vipPort][]watched // farms' VIP and port -> their watched backends
	farms   map[string]passiveFarm
	counts  map[beKey]*dataplane.PassiveCount
	flows   map[uint32]*handshake // conntrack id -> handshake under way
	cancel  context.CancelFunc    // of the listener; nil: not running
	running sync.WaitGroup
	// acctSet: Passive turned nf_conntrack_acct on (and turns it off).
	acctSet bool
	// lost counts the times the event socket overflowed (ENOBUFS) and
	// handshakes may have gone unseen.
	lost uint64
}

type vipPort struct {
	addr netip.Addr
	port uint16
}

type beKey struct{ farm, backend string }

type watched struct {
	key     beKey
	backend netip.AddrPort // port 0: the VIP's port
}

type passiveFarm struct {
	timeout time.Duration
	f       *model.Farm
}

type handshake struct {
	key  beKey
	seen time.Time // when the NEW event was read
}

// NewPassive returns a watcher of the namespace ns (zero or netns.None():
// the current one). It listens once it is given a farm with a passive
// check, and stops when none is left or at Close.
func NewPassive(log *slog.Logger, ns netns.NsHandle) *Passive {
	return &Passive{log: log, ns: ns, byVIP: map[vipPort][]watched{}, farms: map[string]passiveFarm{},
		counts: map[beKey]*dataplane.PassiveCount{}, flows: map[uint32]*handshake{}}
}

// SetFarms makes the watched farms those of farms with a passive check
// (mode snat or dnat, protocol tcp: the model refuses others). Counts of
// backends still watched are kept.
func (p *Passive) SetFarms(farms []*model.Farm) {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.byVIP)
	clear(p.farms)
	keep := map[beKey]bool{}
	for _, f := range farms {
		if f.Check == nil || f.Check.Passive == nil {
			continue
		}
		p.farms[f.Name] = passiveFarm{timeout: f.Check.Passive.Resolved().Timeout, f: f}
		for i := range f.Backends {
			if p.indexBackend(f, i) {
				keep[beKey{f.Name, f.Backends[i].Name}] = true
			}
		}
	}
	for k := range p.counts {
		if !keep[k] {
			delete(p.counts, k)
		}
	}
	for id, h := range p.flows {
		if !keep[h.key] {
			delete(p.flows, id)
		}
	}
	switch {
	case len(p.farms) > 0 && p.cancel == nil:
		p.setAcct(true)
		ctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		p.running.Add(1)
		go func() {
			defer p.running.Done()
			p.listen(ctx)
		}()
	case len(p.farms) == 0 && p.cancel != nil:
		p.cancel()
		p.cancel = nil
		p.setAcct(false)
	}
}

const sysctlAcct = "/proc/sys/net/netfilter/nf_conntrack_acct"

// setAcct turns netfilter's accounting on in the namespace (on), or back
// off if Passive turned it on (off). Callers hold mu.
func (p *Passive) setAcct(on bool) {
	if !on && !p.acctSet {
		return
	}
	err := nsenter.Run(p.ns, func() error {
		cur, err := os.ReadFile(sysctlAcct)
		if err != nil {
			return err
		}
		if on && strings.TrimSpace(string(cur)) != "0" {
			return nil // on already: not ours to turn off
		}
		v := "0"
		if on {
			v = "1"
		}
		if err := os.WriteFile(sysctlAcct, []byte(v), 0); err != nil {
			return err
		}
		p.acctSet = on
		return nil
	})
	if err != nil {
		p.log.Warn("set net.netfilter.nf_conntrack_acct: a client that resets its own SYN counts against the backend", "on", on, "err", err)
	}
}

// indexBackend watches backend i of f, if the farm's passive check
// applies to it, and reports whether it does. Callers hold mu.
func (p *Passive) indexBackend(f *model.Farm, i int) bool {
	if f.PassiveKey(i) == "" {
		return false
	}
	b := &f.Backends[i]
	k := beKey{f.Name, b.Name}
	if p.counts[k] == nil {
		p.counts[k] = &dataplane.PassiveCount{Farm: f.Name, Backend: b.Name}
	}
	for _, vip := range f.VirtualAddrs() {
		if vip.Is4() != b.Addr.Is4() {
			continue
		}
		for _, r := range f.VirtualPorts {
			for port := int(r.First); port <= int(r.Last); port++ {
				vk := vipPort{vip, uint16(port)}
				p.byVIP[vk] = append(p.byVIP[vk], watched{key: k, backend: netip.AddrPortFrom(b.Addr, b.Port)})
			}
		}
	}
	return true
}

// Close stops the listener.
func (p *Passive) Close() {
	p.mu.Lock()
	if p.cancel != nil {
		p.cancel()
		p.cancel = nil
		p.setAcct(false)
	}
	p.mu.Unlock()
	p.running.Wait()
}

// Counts implements dataplane.PassiveReader's PassiveCounts: it counts
// the handshakes unanswered past their farm's timeout, then returns every
// watched backend's counts.
func (p *Passive) Counts(ctx context.Context) ([]dataplane.PassiveCount, error) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, h := range p.flows {
		if now.Sub(h.seen) > p.farms[h.key.farm].timeout {
			p.fail(h.key, func(c *dataplane.PassiveCount) { c.Timeouts++ })
			delete(p.flows, id)
		}
	}
	out := make([]dataplane.PassiveCount, 0, len(p.counts))
	for _, c := range p.counts {
		out = append(out, *c)
	}
	return out, nil
}

// Reset implements dataplane.PassiveReader's ResetPassive: the backend's
// consecutive failures start afresh, and its handshakes under way no
// longer count.
func (p *Passive) Reset(ctx context.Context, farm, backend string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := beKey{farm, backend}
	if c := p.counts[k]; c != nil {
		c.Consecutive = 0
	}
	for id, h := range p.flows {
		if h.key == k {
			delete(p.flows, id)
		}
	}
	return nil
}

// fail counts one failure of backend k. Callers hold mu.
func (p *Passive) fail(k beKey, kind func(*dataplane.PassiveCount)) {
	if c := p.counts[k]; c != nil {
		kind(c)
		c.Consecutive++
	}
}

// passivePoll is how often the listener reads the events that came. Reads
// in batches, not one system call and one wake-up per event, are what keep
// the cost per connection down (four or five events each; a reader woken
// per event cost 48 µs of CPU a connection in BenchmarkPassiveNftConnection).
// A handshake's timeout is judged up to this much late.
const passivePoll = 20 * time.Millisecond

// listen reads conntrack's events until ctx ends; a socket that fails is
// opened again after a second.
func (p *Passive) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		p.log.Error("conntrack events for passive checks; listening again in 1s", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (p *Passive) listenOnce(ctx context.Context) error {
	var r *eventReader
	err := nsenter.Run(p.ns, func() error {
		var err error
		r, err = openEventReader(groupCTNew, groupCTUpdate, groupCTDestroy)
		return err
	})
	if err != nil {
		return err
	}
	defer r.close()
	t := time.NewTicker(passivePoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		lost, err := r.read(p.event)
		if lost {
			p.mu.Lock()
			p.lost++
			p.mu.Unlock()
			p.log.Warn("conntrack events lost (socket overflow): passive checks may miss handshakes")
		}
		if err != nil {
			return err
		}
	}
}

// event takes in one conntrack event.
func (p *Passive) event(ev ct.Event) {
	f := ev.Flow
	if f == nil || f.TupleOrig.Proto.Protocol != unix.IPPROTO_TCP {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Type {
	case ct.EventNew:
		if f.ProtoInfo.TCP == nil || f.ProtoInfo.TCP.State != tcpSynSent {
			return
		}
		vip := vipPort{f.TupleOrig.IP.DestinationAddress.Unmap(), f.TupleOrig.Proto.DestinationPort}
		be := netip.AddrPortFrom(f.TupleReply.IP.SourceAddress.Unmap(), f.TupleReply.Proto.SourcePort)
		for _, w := range p.byVIP[vip] {
			if w.backend.Addr() == be.Addr() && (w.backend.Port() == 0 && be.Port() == vip.port || w.backend.Port() == be.Port()) {
				p.flows[f.ID] = &handshake{key: w.key, seen: time.Now()}
				return
			}
		}
	case ct.EventUpdate:
		h := p.flows[f.ID]
		if h == nil || f.ProtoInfo.TCP == nil {
			return
		}
		switch st := f.ProtoInfo.TCP.State; {
		case st == tcpSynRecv || st == tcpEstablished:
			delete(p.flows, f.ID)
			if c := p.counts[h.key]; c != nil {
				c.Successes++
				c.Consecutive = 0
			}
		case st == tcpClose:
			delete(p.flows, f.ID)
			if f.Status.SeenReply() {
				p.fail(h.key, func(c *dataplane.PassiveCount) { c.Resets++ })
			}
		}
	case ct.EventDestroy:
		h := p.flows[f.ID]
		if h == nil {
			return
		}
		delete(p.flows, f.ID)
		// A RST while the entry waits for the SYN-ACK makes netfilter
		// drop the entry at once, in state CLOSE (nf_conntrack_proto_tcp:
		// "if only reply is a RST ... delete the conntrack
		// immediately"), whichever side sent it. The accounting
		// (nf_conntrack_acct, on while watching) tells: the backend's
		// RST is a packet in the reply direction. An entry deleted in
		// SYN_SENT is a flush, not the backend's doing (a timeout is
		// counted by the sweep first).
		if f.ProtoInfo.TCP == nil || f.ProtoInfo.TCP.State != tcpClose {
			return
		}
		acct := f.CountersOrig.Packets > 0
		if !acct || f.CountersReply.Packets > 0 || f.Status.SeenReply() {
			p.fail(h.key, func(c *dataplane.PassiveCount) { c.Resets++ })
		}
	}
}

// The kernel's TCP conntrack states (enum tcp_conntrack; tcpEstablished
// is in list.go).
const (
	tcpSynSent = 1
	tcpSynRecv = 2
	tcpClose   = 8
)

// eventReader reads conntrack's events from a non-blocking netlink socket
// in batches (recvmmsg), when asked, and decodes them with ti-mo/conntrack.
type eventReader struct {
	fd   int
	hdrs [eventBatch]struct {
		hdr unix.Msghdr
		len uint32
		_   [4]byte
	}
	iov  [eventBatch]unix.Iovec
	bufs [eventBatch][eventSize]byte
}

const (
	eventBatch = 64
	eventSize  = 1024 // one event message (a flow's attributes: a few hundred bytes)
)

// openEventReader opens the socket in the calling thread's namespace and
// joins the groups.
func openEventReader(groups ...int) (*eventReader, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack events: open ctnetlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("conntrack events: bind: %w", err)
	}
	// The events of a poll interval wait in the socket: room for tens of
	// thousands (ENOBUFS loses events).
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	for _, g := range groups {
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, g); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("conntrack events: join group %d: %w", g, err)
		}
	}
	r := &eventReader{fd: fd}
	for i := range r.hdrs {
		r.iov[i].Base = &r.bufs[i][0]
		r.iov[i].SetLen(eventSize)
		r.hdrs[i].hdr.Iov = &r.iov[i]
		r.hdrs[i].hdr.SetIovlen(1)
	}
	return r, nil
}

func (r *eventReader) close() { unix.Close(r.fd) }

// read takes every event waiting, without waiting for more, and hands each
// to fn. lost is true when the socket overflowed since the last read.
func (r *eventReader) read(fn func(ct.Event)) (lost bool, err error) {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.hdrs[0])), eventBatch, unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
		case unix.EAGAIN, unix.EINTR:
			return lost, nil
		case unix.ENOBUFS:
			lost = true
			continue
		default:
			return lost, fmt.Errorf("conntrack events: receive: %w", errno)
		}
		for i := range int(n) {
			b := r.bufs[i][:r.hdrs[i].len]
			for len(b) >= unix.NLMSG_HDRLEN {
				l := int(binary.NativeEndian.Uint32(b[0:4]))
				if l < unix.NLMSG_HDRLEN || l > len(b) {
					break
				}
				m := netlink.Message{
					Header: netlink.Header{Length: uint32(l), Type: netlink.HeaderType(binary.NativeEndian.Uint16(b[4:6])),
						Flags: netlink.HeaderFlags(binary.NativeEndian.Uint16(b[6:8])), Sequence: binary.NativeEndian.Uint32(b[8:12]),
						PID: binary.NativeEndian.Uint32(b[12:16])},
					Data: b[unix.NLMSG_HDRLEN:l],
				}
				var ev ct.Event
				if ev.Unmarshal(m) == nil {
					fn(ev)
				}
				b = b[min((l+3)&^3, len(b)):]
			}
		}
		if int(n) < eventBatch {
			return lost, nil
		}
	}
}
