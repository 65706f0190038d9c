package health

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Half-open TCP checks ("half-open": "on"): a SYN sent from one raw socket,
// the backend's SYN-ACK (up) or RST (down, "connect refused") read back on
// it. No socket of the LB has the connection, so the LB's kernel answers
// the SYN-ACK with a RST and the backend forgets the half-open connection
// at once.
//
// The engine is built for 10,000 checks a second at a small cost:
//   - The monitor queues the SYNs of every check due in one tick of its
//     wheel (and those due in the next few milliseconds: Options.Batch)
//     and sends them with one sendmmsg.
//   - The monitor's loop reads the replies itself, with recvmmsg, many a
//     system call, whenever it wakes: right after a send (on a veth, or
//     loopback, the replies are there already) and, while checks are in
//     flight, at least every Options.Batch. No goroutine waits for them,
//     so a burst of replies wakes no thread: a reader parked in Go's
//     netpoller was woken by each burst on another CPU, a quarter of the
//     daemon's CPU in a profile. The kernel stamps each reply's arrival
//     (SO_TIMESTAMPNS), so one read late still counts by when it came.
//   - A reply is matched to its check by a cookie in the SYN's sequence
//     number (the reply acknowledges it + 1): the index of the check's
//     slot in a fixed table and the slot's generation, masked with a
//     secret. The reply's source address and port and our port must be
//     the slot's too, so neither a late answer to an earlier check nor a
//     forged one is taken for this one's.
//
// The source ports are held by bound (not listening) TCP sockets, so no
// connection of the LB can take them, and a SYN-ACK to them reaches no
// socket. A check takes a port that has no check in flight to the same
// backend address and port (the backend must see a new connection each
// time), so up to synPorts checks of one backend run at once; more make a
// full connect.
//
// IPv4 only: an IPv6 check with half-open on makes a full connect.
//
// The engine's system calls never block (MSG_DONTWAIT), and are made raw
// (unix.RawSyscall6: the Go runtime is not told): on a veth the kernel
// does the whole exchange of a batch's packets, both ends', inside the
// sendmmsg, a millisecond for 50 SYNs, and a system call the runtime
// knows of that long has sysmon hand the goroutine's P to another thread,
// waking it: a fifth of the daemon's CPU went to that hand-off (sysmon,
// findRunnable, context switches) in a profile.

const (
	// synPorts is how many source ports the engine holds: how many
	// checks of one backend address and port may be in flight at once
	// (and in one batch: Options.Batch). The receive program's port map
	// holds 64.
	synPorts = 64
	// synSlotBits: the slot table holds 1<<synSlotBits checks in flight
	// (at 10,000 checks a second with a 1 s timeout, 10,000 at most).
	synSlotBits = 16
	synSlots    = 1 << synSlotBits
	// synBatch is the most SYNs one sendmmsg sends, and replies one
	// recvmmsg reads.
	synBatch = 256
	// synSnap is what the reply filter keeps of a segment: the IPv4
	// header (up to 60 bytes) and the TCP header's first 14.
	synSnap = 128
)

// answers of a half-open check.
const (
	synUp      = "SYN-ACK"
	synRefused = "connect refused"
)

// synAnswer is the outcome of one half-open check: its owner (a monitor's
// target, or a blocking probe's synWait), its token, and the answer, or
// the error of its send.
type synAnswer struct {
	owner  any
	token  uint32
	answer string
	err    error
	at     time.Time
}

// synSlot is one check in flight.
type synSlot struct {
	gen   uint16
	used  bool
	sport uint16
	dst   netip.AddrPort
	owner any
	// framed: its SYN went as a frame (synbypass.go), not through the
	// stack.
	framed bool
}

type synKey struct {
	dst   netip.AddrPort
	sport uint16
}

// synEngine sends and matches half-open checks for one network namespace.
type synEngine struct {
	fd      int
	holders []int
	ports   [synPorts]uint16
	secret  uint32

	mu       sync.Mutex
	slots    []synSlot
	free     []uint32 // free slot indexes, a stack
	inflight map[synKey]uint32
	src      map[netip.Addr]netip.Addr // route source towards each backend
	next     int                       // the next source port to try
	closed   bool
	used     int // slots in use: checks in flight
	// ready: answers of checks owned by a monitor, read and not yet
	// taken (takeAnswers).
	ready []synAnswer

	// The send batch: owned by the one goroutine that queues and flushes
	// (the monitor's loop).
	out synOut
	// What was sent and read, and in how many system calls (under mu).
	stats synStats

	// The receive buffers, for one poll at a time.
	rmu sync.Mutex
	in  *synIn

	// byp sends SYNs and takes answers around the IP stack where it can
	// (synbypass.go); nil: the raw socket does everything.
	byp *synBypass
}

const sizeofTimespec = int(unsafe.Sizeof(unix.Timespec{}))

// synIn are the buffers recvmmsg fills: the segments (their first synSnap
// bytes) and each one's arrival time.
type synIn struct {
	hdrs [synBatch]mmsghdr
	iov  [synBatch]unix.Iovec
	bufs [synBatch][synSnap]byte
	ctrl [synBatch][unix.SizeofCmsghdr + sizeofTimespec]byte
}

// synStats count the engine's work: SYNs sent and the sendmmsg calls that
// sent them, replies read and the recvmmsg calls that read them.
type synStats struct {
	SYNs, SendCalls, Replies, RecvCalls uint64
	// Of SYNs, sent as frames around the stack, and in how many
	// sendmmsg calls; answers read from the receive program's ring.
	Frames, FrameCalls, RingReplies uint64
}

// synOut is a batch of SYNs being built, in the shape sendmmsg takes.
type synOut struct {
	n      int
	hdrs   [synBatch]mmsghdr
	iov    [synBatch]unix.Iovec
	to     [synBatch]unix.RawSockaddrInet4
	ctrl   [synBatch][unix.SizeofCmsghdr + unix.SizeofInet4Pktinfo + 4]byte
	seg    [synBatch][24]byte
	tokens [synBatch]uint32
	owners [synBatch]any
	failed []synAnswer
}

// mmsghdr is struct mmsghdr (x/sys/unix has none).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// newSynEngine opens the raw socket and holds the source ports in the
// namespace d (the current one if none). Its reader runs until close.
func newSynEngine(d *dialer) (*synEngine, error) {
	e := &synEngine{fd: -1, secret: rand.Uint32(), slots: make([]synSlot, synSlots), free: make([]uint32, 0, synSlots),
		inflight: map[synKey]uint32{}, src: map[netip.Addr]netip.Addr{}}
	for i := synSlots - 1; i >= 0; i-- {
		e.free = append(e.free, uint32(i))
	}
	err := d.do(func() error {
		for i := range synPorts {
			h, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("tcp socket: %w", err)
			}
			e.holders = append(e.holders, h)
			if err := unix.Bind(h, &unix.SockaddrInet4{}); err != nil {
				return fmt.Errorf("hold a source port: %w", err)
			}
			sa, err := unix.Getsockname(h)
			if err != nil {
				return fmt.Errorf("hold a source port: %w", err)
			}
			e.ports[i] = uint16(sa.(*unix.SockaddrInet4).Port)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_TCP)
		if err != nil {
			return fmt.Errorf("raw tcp socket: %w", err)
		}
		e.fd = fd
		markSocket(fd)
		// Don't fragment: a SYN is small, and with DF the kernel gives
		// it IP id 0 instead of hashing one per packet.
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
		// Room for the replies between two reads, and for a batch of
		// SYNs.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
			return fmt.Errorf("stamp the replies: %w", err)
		}
		prog, err := synFilter(e.ports[:])
		if err != nil {
			return err
		}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog); err != nil {
			return fmt.Errorf("attach the reply filter: %w", err)
		}
		return nil
	})
	if err != nil {
		e.close()
		return nil, err
	}
	e.out.init()
	e.in = &synIn{}
	log := d.logger()
	if d.rawOnly {
		log.Info("half-open checks through the raw socket", "engine", "raw", "reason", "asked")
	} else if b, err := newSynBypass(d, e.ports[:], log); err != nil {
		log.Warn("half-open checks through the raw socket", "engine", "raw", "err", err)
	} else {
		e.byp = b
		log.Info("half-open checks around the IP stack where the interface allows", "engine", "bypass")
	}
	for i := range e.in.hdrs {
		e.in.iov[i].Base = &e.in.bufs[i][0]
		e.in.iov[i].SetLen(synSnap)
		e.in.hdrs[i].hdr.Iov = &e.in.iov[i]
		e.in.hdrs[i].hdr.SetIovlen(1)
	}
	return e, nil
}

// init points each message of the batch at its buffers, once.
func (o *synOut) init() {
	for i := range o.hdrs {
		h := &o.hdrs[i].hdr
		o.iov[i].Base = &o.seg[i][0]
		o.iov[i].SetLen(len(o.seg[i]))
		h.Iov = &o.iov[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&o.to[i]))
		h.Namelen = unix.SizeofSockaddrInet4
		h.Control = &o.ctrl[i][0]
		h.SetControllen(unix.CmsgSpace(unix.SizeofInet4Pktinfo))
		c := (*unix.Cmsghdr)(unsafe.Pointer(&o.ctrl[i][0]))
		c.Level, c.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
		c.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
		o.to[i].Family = unix.AF_INET
	}
}

// synFilter is a classic BPF filter that keeps the TCP segments to our
// ports (IPv4 header first, as a raw IPv4 socket gets them), their first
// synSnap bytes.
func synFilter(ports []uint16) (*unix.SockFprog, error) {
	ins := []bpf.Instruction{
		bpf.LoadMemShift{Off: 0},          // X = IP header length
		bpf.LoadIndirect{Off: 2, Size: 2}, // A = TCP destination port
	}
	for i, port := range ports {
		ins = append(ins, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(port), SkipTrue: uint8(len(ports) - i)})
	}
	ins = append(ins, bpf.RetConstant{Val: 0}, bpf.RetConstant{Val: synSnap})
	raw, err := bpf.Assemble(ins)
	if err != nil {
		return nil, fmt.Errorf("assemble the reply filter: %w", err)
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}, nil
}

func (e *synEngine) close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	if e.fd >= 0 {
		_ = unix.Close(e.fd)
	}
	if e.byp != nil {
		e.byp.close()
	}
	for _, h := range e.holders {
		_ = unix.Close(h)
	}
}

// inFlight is the number of checks sent and not yet answered or given up.
func (e *synEngine) inFlight() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.used
}

// takeAnswers reads the replies that are there and appends the answers of
// checks owned by a monitor to dst.
func (e *synEngine) takeAnswers(dst []synAnswer) []synAnswer {
	e.poll()
	e.mu.Lock()
	dst = append(dst, e.ready...)
	clear(e.ready)
	e.ready = e.ready[:0]
	e.mu.Unlock()
	return dst
}

// poll reads the replies that are there, without waiting: a blocking
// probe's answer goes to its channel, a monitor's check's to ready.
func (e *synEngine) poll() {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	in := e.in
	for {
		for i := range in.hdrs {
			in.hdrs[i].hdr.Control = &in.ctrl[i][0]
			in.hdrs[i].hdr.SetControllen(len(in.ctrl[i]))
		}
		r, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(e.fd), uintptr(unsafe.Pointer(&in.hdrs[0])), synBatch, unix.MSG_DONTWAIT, 0, 0)
		if errno != 0 {
			break // EAGAIN: nothing more (or the socket is closed)
		}
		n := int(r)
		now := time.Now()
		e.mu.Lock()
		e.stats.RecvCalls++
		e.stats.Replies += uint64(n)
		for i := range n {
			a, ok := e.match(in.bufs[i][:in.hdrs[i].len])
			if !ok {
				continue
			}
			a.at = now
			if in.hdrs[i].hdr.Controllen >= uint64(len(in.ctrl[i])) {
				c := (*unix.Cmsghdr)(unsafe.Pointer(&in.ctrl[i][0]))
				if c.Level == unix.SOL_SOCKET && c.Type == unix.SCM_TIMESTAMPNS {
					ts := (*unix.Timespec)(unsafe.Pointer(&in.ctrl[i][unix.CmsgLen(0)]))
					a.at = time.Unix(ts.Unix())
				}
			}
			e.deliver(a)
		}
		e.mu.Unlock()
		if n < synBatch {
			break
		}
	}
	if e.byp == nil {
		return
	}
	e.mu.Lock()
	n := e.byp.read(func(r *synReply, at time.Time) {
		a, ok := e.matchReply(*(*[4]byte)(unsafe.Pointer(&r.Saddr)), htons(r.Sport), htons(r.Dport), binary.BigEndian.Uint32((*[4]byte)(unsafe.Pointer(&r.Ack))[:]), r.Flags)
		if !ok {
			return
		}
		a.at = at
		e.deliver(a)
	})
	e.stats.RingReplies += uint64(n)
	e.mu.Unlock()
}

// deliver hands an answer to its owner. Callers hold mu.
func (e *synEngine) deliver(a synAnswer) {
	if w, ok := a.owner.(*synWait); ok {
		w.ch <- a.answer // buffered: never blocks
	} else {
		e.ready = append(e.ready, a)
	}
}

// match finds the check of one reply (IPv4 header, TCP header) and frees
// its slot. Callers hold mu.
func (e *synEngine) match(b []byte) (synAnswer, bool) {
	if len(b) < 20 || b[0]>>4 != 4 {
		return synAnswer{}, false
	}
	ihl := int(b[0]&0xf) * 4
	if len(b) < ihl+14 {
		return synAnswer{}, false
	}
	t := b[ihl:]
	return e.matchReply([4]byte(b[12:16]), binary.BigEndian.Uint16(t[0:]), binary.BigEndian.Uint16(t[2:]), binary.BigEndian.Uint32(t[8:]), t[13])
}

// matchReply finds the check a reply from saddr:sport to our port dport,
// acknowledging ack, with TCP flags flags, answers, and frees its slot.
// Callers hold mu.
func (e *synEngine) matchReply(saddr [4]byte, sport, dport uint16, ack uint32, flags byte) (synAnswer, bool) {
	var answer string
	switch {
	case flags&tcpRST != 0:
		answer = synRefused
	case flags&(tcpSYN|tcpACK) == tcpSYN|tcpACK:
		answer = synUp
	default:
		return synAnswer{}, false
	}
	cookie := (ack - 1) ^ e.secret
	idx, gen := cookie>>16, uint16(cookie)
	if idx >= synSlots {
		return synAnswer{}, false
	}
	s := &e.slots[idx]
	src := netip.AddrPortFrom(netip.AddrFrom4(saddr), sport)
	if !s.used || s.gen != gen || s.dst != src || s.sport != dport {
		return synAnswer{}, false
	}
	a := synAnswer{owner: s.owner, token: cookie, answer: answer}
	e.release(idx)
	return a, true
}

// TCP flags.
const (
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// errSynBusy: every source port has a check in flight to this backend, or
// every slot is taken.
var errSynBusy = errors.New("every half-open source port is busy towards this backend")

// reserve takes a slot and a source port for a check of dst owned by
// owner and returns its token (slot index << 16 | generation). Callers
// hold mu.
func (e *synEngine) reserve(dst netip.AddrPort, owner any) (uint32, uint16, error) {
	if e.closed {
		return 0, 0, errors.New("half-open prober closed")
	}
	if len(e.free) == 0 {
		return 0, 0, errSynBusy
	}
	var sport uint16
	for range synPorts {
		p := e.ports[e.next]
		if e.next++; e.next == synPorts {
			e.next = 0
		}
		if _, busy := e.inflight[synKey{dst, p}]; !busy {
			sport = p
			break
		}
	}
	if sport == 0 {
		return 0, 0, errSynBusy
	}
	idx := e.free[len(e.free)-1]
	e.free = e.free[:len(e.free)-1]
	s := &e.slots[idx]
	s.gen++
	s.used, s.sport, s.dst, s.owner, s.framed = true, sport, dst, owner, false
	e.inflight[synKey{dst, sport}] = idx
	e.used++
	return idx<<16 | uint32(s.gen), sport, nil
}

// release frees slot idx. Callers hold mu.
func (e *synEngine) release(idx uint32) {
	s := &e.slots[idx]
	delete(e.inflight, synKey{s.dst, s.sport})
	s.used, s.owner = false, nil
	e.free = append(e.free, idx)
	e.used--
}

// cancel frees the slot of token if it is still that check's (its timeout
// passed, or its target went away).
//
// A check sent as a frame that is given up makes the next SYN to its
// backend go through the stack, which confirms the neighbour entry the
// frames were addressed by (synbypass.go).
func (e *synEngine) cancel(token uint32) {
	e.mu.Lock()
	idx := token >> 16
	var stale netip.Addr
	if idx < synSlots && e.slots[idx].used && e.slots[idx].gen == uint16(token) {
		if e.slots[idx].framed {
			stale = e.slots[idx].dst.Addr()
		}
		e.release(idx)
	}
	e.mu.Unlock()
	if stale.IsValid() {
		e.byp.stale(stale)
	}
}

// queue adds a SYN to dst (from src if valid, else the route's source) to
// the send batch, sent by flush. The answer goes to onAnswers with owner
// and the token returned. Only the goroutine that flushes may queue.
func (e *synEngine) queue(d *dialer, src netip.Addr, dst netip.AddrPort, owner any) (uint32, error) {
	if !src.IsValid() {
		var err error
		if src, err = e.sourceFor(d, dst.Addr()); err != nil {
			return 0, err
		}
	}
	if e.out.n == synBatch || (e.byp != nil && e.byp.out.n == synBatch) {
		e.flush()
	}
	var path *synPath
	if e.byp != nil {
		path = e.byp.path(d, dst.Addr(), time.Now())
	}
	e.mu.Lock()
	token, sport, err := e.reserve(dst, owner)
	if err == nil && path != nil && path.ok {
		e.slots[token>>16].framed = true
	}
	e.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if path != nil && path.ok {
		var seg [24]byte
		synSegment(&seg, src, dst, sport, token^e.secret)
		e.byp.queue(path, src, dst.Addr(), &seg, token, owner)
		return token, nil
	}
	i := e.out.n
	e.out.n++
	synSegment(&e.out.seg[i], src, dst, sport, token^e.secret)
	e.out.to[i].Addr = dst.Addr().As4()
	pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&e.out.ctrl[i][unix.CmsgLen(0)]))
	pi.Spec_dst = src.As4()
	e.out.tokens[i], e.out.owners[i] = token, owner
	return token, nil
}

// flush sends the queued SYNs, in as few sendmmsg calls as the socket
// takes. A SYN the kernel refuses (no route, a firewall) is answered with
// the error: takeFailed returns those answers.
func (e *synEngine) flush() {
	o := &e.out
	for sent := 0; sent < o.n; {
		r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(e.fd), uintptr(unsafe.Pointer(&o.hdrs[sent])), uintptr(o.n-sent), unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			sent += int(r)
			e.mu.Lock()
			e.stats.SendCalls++
			e.stats.SYNs += uint64(r)
			e.mu.Unlock()
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			// The socket's send buffer (4 MiB) is full: wait for room,
			// a little.
			pfd := []unix.PollFd{{Fd: int32(e.fd), Events: unix.POLLOUT}}
			if n, _ := unix.Poll(pfd, 10); n > 0 {
				continue
			}
		}
		// The message at sent failed: answer it, go on with the rest.
		var err error = errno
		e.cancel(o.tokens[sent])
		o.failed = append(o.failed, synAnswer{owner: o.owners[sent], token: o.tokens[sent], err: fmt.Errorf("send SYN: %w", err), at: time.Now()})
		sent++
	}
	clear(o.owners[:o.n])
	o.n = 0
	if e.byp != nil && e.byp.out.n > 0 {
		e.byp.flush(func(calls, frames int) {
			e.mu.Lock()
			e.stats.FrameCalls += uint64(calls)
			e.stats.Frames += uint64(frames)
			e.stats.SYNs += uint64(frames)
			e.mu.Unlock()
		}, func(token uint32, owner any, err error) {
			e.cancel(token)
			o.failed = append(o.failed, synAnswer{owner: owner, token: token, err: err, at: time.Now()})
		})
	}
}

// queued is the number of SYNs queued and not yet flushed.
func (e *synEngine) queued() int {
	n := e.out.n
	if e.byp != nil {
		n += e.byp.out.n
	}
	return n
}

// takeFailed returns the answers of the SYNs flush could not send.
func (e *synEngine) takeFailed() []synAnswer {
	f := e.out.failed
	e.out.failed = nil
	return f
}

// synWait is a blocking probe's owner: the reader sends it the answer.
type synWait struct{ ch chan string }

// probe sends one SYN to dst (from src if valid) and waits for the answer
// until ctx ends: what a check run alone does (a test, or a check outside
// a monitor). It returns synUp, synRefused, or ctx's error.
func (e *synEngine) probe(ctx context.Context, d *dialer, src netip.Addr, dst netip.AddrPort) (string, error) {
	if !src.IsValid() {
		var err error
		if src, err = e.sourceFor(d, dst.Addr()); err != nil {
			return "", err
		}
	}
	w := &synWait{ch: make(chan string, 1)}
	e.mu.Lock()
	token, sport, err := e.reserve(dst, w)
	e.mu.Unlock()
	if err != nil {
		return "", err
	}
	defer e.cancel(token)
	var seg [24]byte
	synSegment(&seg, src, dst, sport, token^e.secret)
	var path *synPath
	if e.byp != nil {
		path = e.byp.path(d, dst.Addr(), time.Now())
	}
	if path != nil && path.ok {
		e.mu.Lock()
		e.slots[token>>16].framed = true
		e.mu.Unlock()
		if err := e.byp.send(path, src, dst.Addr(), &seg); err != nil {
			return "", err
		}
		e.mu.Lock()
		e.stats.Frames++
		e.stats.SYNs++
		e.mu.Unlock()
	} else {
		to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
		if err := unix.Sendmsg(e.fd, seg[:], pktinfo4(src.As4()), to, 0); err != nil {
			return "", fmt.Errorf("send SYN: %w", err)
		}
		e.mu.Lock()
		e.stats.SYNs++
		e.mu.Unlock()
	}
	// No reader waits on the socket (see above): poll it (a monitor's
	// answers read here wait in ready for its next read).
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		e.poll()
		select {
		case a := <-w.ch:
			return a, nil
		case <-ctx.Done():
			return "", ctx.Err()
		case <-tick.C:
		}
	}
}

// sourceFor returns the address the namespace sends from towards dst (a
// connected UDP socket's, found once per backend).
func (e *synEngine) sourceFor(d *dialer, dst netip.Addr) (netip.Addr, error) {
	e.mu.Lock()
	src, ok := e.src[dst]
	e.mu.Unlock()
	if ok {
		return src, nil
	}
	err := d.do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: dst.As4(), Port: 9}); err != nil {
			return err
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			return err
		}
		src = netip.AddrFrom4(sa.(*unix.SockaddrInet4).Addr)
		return nil
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("source address towards %s: %w", dst, err)
	}
	e.mu.Lock()
	e.src[dst] = src
	e.mu.Unlock()
	return src, nil
}

// synSegment writes into t a SYN from src:sport to dst with sequence
// number isn and an MSS option, checksummed.
func synSegment(t *[24]byte, src netip.Addr, dst netip.AddrPort, sport uint16, isn uint32) {
	*t = [24]byte{}
	binary.BigEndian.PutUint16(t[0:], sport)
	binary.BigEndian.PutUint16(t[2:], dst.Port())
	binary.BigEndian.PutUint32(t[4:], isn)
	t[12] = 6 << 4 // data offset: 6 words
	t[13] = tcpSYN
	binary.BigEndian.PutUint16(t[14:], 64240) // window
	t[20], t[21] = 2, 4                       // MSS
	binary.BigEndian.PutUint16(t[22:], 1460)
	s, d := src.As4(), dst.Addr().As4()
	sum := (uint32(s[0])<<8 | uint32(s[1])) + (uint32(s[2])<<8 | uint32(s[3])) +
		(uint32(d[0])<<8 | uint32(d[1])) + (uint32(d[2])<<8 | uint32(d[3])) +
		unix.IPPROTO_TCP + uint32(len(t))
	for i := 0; i+1 < len(t); i += 2 {
		sum += uint32(t[i])<<8 | uint32(t[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(t[16:], ^uint16(sum))
}

// pktinfo4 is an IP_PKTINFO control message that sets the source address.
func pktinfo4(src [4]byte) []byte {
	b := make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
	pi.Spec_dst = src
	return b
}
