package health

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The half-open engine's path around the LB's IP stack ("bypass"): on the
// raw socket (synprobe.go) every SYN goes through routing, netfilter and
// the bridge, and every answer through the LB's IP and TCP receive, which
// also answer each SYN-ACK with a RST: about 6.6 µs of the LB's kernel per
// check (bench/results/health-cpu.md), more than the 5 µs a check may cost
// at 10,000 a second within 5 % of a core. So, where it can:
//   - The SYNs go out as whole Ethernet frames through one AF_PACKET
//     socket with PACKET_QDISC_BYPASS, many a sendmmsg: the driver's
//     transmit, nothing before it. The frame's addresses come from the
//     route towards the backend (interface, next hop) and the next hop's
//     entry in the neighbour table, looked up once per backend address
//     (again every synPathTTL, and after a timeout).
//   - The answers are taken by a tcx program first on that interface
//     (bpf/xlb_synprobe.c) before the IP stack: SYN-ACKs and RSTs to our
//     source ports go to a ring buffer the engine reads with the raw
//     socket's replies, and the program itself turns each SYN-ACK into the
//     RST the LB's TCP would have sent.
//
// A backend whose next hop is not in the neighbour table yet (or whose
// check timed out: its entry may be stale) gets its next SYN through the
// raw socket, so the kernel resolves (or confirms) the neighbour; its
// answer comes back through the program all the same. An interface the
// program cannot attach to, one without Ethernet addresses (loopback), or
// a namespace where the program cannot be loaded at all, keep the raw
// socket for everything: the log says which.
//
// IPv4 only, as the raw socket's engine.

// synPathTTL is how long a backend's route and neighbour are used before
// they are looked up again.
const synPathTTL = 30 * time.Second

// synPath is how the SYNs to one backend address go.
type synPath struct {
	ok bool // frames: the program is on ifindex and the next hop's address known
	// resolving: not ok only for want of the next hop's address, which
	// the stack is resolving (look again soon).
	resolving bool
	ifindex   int
	eth       [12]byte // destination and source Ethernet addresses
	checked   time.Time
	viaStack  bool // send the next SYN through the raw socket (see above)
}

// synBypass is the bypass of one engine (one namespace).
type synBypass struct {
	objs synprobeObjects
	rd   *ringbuf.Reader
	pfd  int // AF_PACKET socket, send only
	nl   *netlink.Handle
	log  *slog.Logger

	mu      sync.Mutex
	links   map[int]link.Link // ifindex -> the program's tcx link
	refused map[int]bool      // interfaces it cannot attach to
	paths   map[netip.Addr]*synPath

	out frameOut // owned by the flushing goroutine, as synEngine.out
	rec ringbuf.Record
}

// synFrameLen: Ethernet, IPv4 (20), TCP with an MSS option (24).
const synFrameLen = 14 + 20 + 24

// frameOut is a batch of SYN frames, in the shape sendmmsg takes.
type frameOut struct {
	n      int
	hdrs   [synBatch]mmsghdr
	iov    [synBatch]unix.Iovec
	to     [synBatch]unix.RawSockaddrLinklayer
	frame  [synBatch][synFrameLen]byte
	tokens [synBatch]uint32
	owners [synBatch]any
}

func (o *frameOut) init() {
	for i := range o.hdrs {
		h := &o.hdrs[i].hdr
		o.iov[i].Base = &o.frame[i][0]
		o.iov[i].SetLen(synFrameLen)
		h.Iov = &o.iov[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&o.to[i]))
		h.Namelen = unix.SizeofSockaddrLinklayer
		o.to[i].Family = unix.AF_PACKET
		o.to[i].Protocol = htons(unix.ETH_P_IP)
		o.to[i].Halen = 6
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// newSynBypass loads the receive program and opens the packet socket in
// d's namespace for the source ports ports. Interfaces are attached to as
// backends need them.
func newSynBypass(d *dialer, ports []uint16, log *slog.Logger) (*synBypass, error) {
	b := &synBypass{pfd: -1, log: log, links: map[int]link.Link{}, refused: map[int]bool{}, paths: map[netip.Addr]*synPath{}}
	if err := loadSynprobeObjects(&b.objs, nil); err != nil {
		return nil, fmt.Errorf("load the half-open receive program: %w", err)
	}
	for _, p := range ports {
		if err := b.objs.XlbSynPorts.Update(htons(p), uint8(1), ebpf.UpdateAny); err != nil {
			b.close()
			return nil, fmt.Errorf("write the half-open source ports: %w", err)
		}
	}
	var err error
	if b.rd, err = ringbuf.NewReader(b.objs.XlbSynReplies); err != nil {
		b.close()
		return nil, fmt.Errorf("half-open answers' ring: %w", err)
	}
	// Never wait in the reader: poll reads only what is there.
	b.rd.SetDeadline(time.Unix(1, 0))
	err = d.do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		b.pfd = fd
		markSocket(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
			return fmt.Errorf("packet socket: qdisc bypass: %w", err)
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		return nil
	})
	if err == nil {
		if d.ns > 0 {
			b.nl, err = netlink.NewHandleAt(d.ns)
		} else {
			b.nl, err = netlink.NewHandle()
		}
		if err != nil {
			err = fmt.Errorf("netlink: %w", err)
		}
	}
	if err != nil {
		b.close()
		return nil, err
	}
	b.out.init()
	return b, nil
}

func (b *synBypass) close() {
	b.mu.Lock()
	for _, l := range b.links {
		_ = l.Close()
	}
	b.links = map[int]link.Link{}
	b.mu.Unlock()
	if b.rd != nil {
		_ = b.rd.Close()
	}
	if b.pfd >= 0 {
		_ = unix.Close(b.pfd)
	}
	if b.nl != nil {
		b.nl.Close()
	}
	_ = b.objs.Close()
}

// interfaces returns the interfaces the program is attached to.
func (b *synBypass) interfaces() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.links)
}

// path returns how SYNs to dst go: ok false means through the raw socket.
func (b *synBypass) path(d *dialer, dst netip.Addr, now time.Time) *synPath {
	b.mu.Lock()
	p := b.paths[dst]
	if p == nil {
		p = &synPath{}
		b.paths[dst] = p
	}
	if p.viaStack {
		// This SYN goes through the stack; the next one looks again.
		p.viaStack, p.ok, p.checked = false, false, time.Time{}
		b.mu.Unlock()
		return p
	}
	ttl := synPathTTL
	if p.resolving {
		ttl = 20 * time.Millisecond
	}
	fresh := !p.checked.IsZero() && now.Sub(p.checked) < ttl
	b.mu.Unlock()
	if fresh {
		return p
	}
	np := b.lookup(d, dst)
	np.checked = now
	b.mu.Lock()
	*p = np
	b.mu.Unlock()
	return p
}

// stale makes the next SYN to dst go through the stack (its check timed
// out: the neighbour entry may be out of date).
func (b *synBypass) stale(dst netip.Addr) {
	b.mu.Lock()
	if p := b.paths[dst]; p != nil && p.ok {
		p.viaStack = true
	}
	b.mu.Unlock()
}

// lookup finds dst's route, its interface's and next hop's Ethernet
// addresses, and attaches the program to the interface if it is not yet.
func (b *synBypass) lookup(d *dialer, dst netip.Addr) synPath {
	routes, err := b.nl.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 || routes[0].Type != unix.RTN_UNICAST {
		return synPath{}
	}
	r := routes[0]
	nh := dst
	if r.Gw != nil {
		if a, ok := netip.AddrFromSlice(r.Gw); ok {
			nh = a.Unmap()
		}
	}
	l, err := b.nl.LinkByIndex(r.LinkIndex)
	if err != nil {
		return synPath{}
	}
	a := l.Attrs()
	if a.EncapType != "ether" || len(a.HardwareAddr) != 6 || a.Flags&(1<<2) != 0 /* IFF_LOOPBACK */ {
		return synPath{}
	}
	if !b.attach(d, a.Index, a.Name) {
		return synPath{}
	}
	neighs, err := b.nl.NeighList(a.Index, unix.AF_INET)
	if err != nil {
		return synPath{}
	}
	p := synPath{ifindex: a.Index, resolving: true}
	copy(p.eth[6:], a.HardwareAddr)
	for _, n := range neighs {
		usable := n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT) != 0
		if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == nh && usable && len(n.HardwareAddr) == 6 {
			copy(p.eth[:6], n.HardwareAddr)
			p.ok, p.resolving = true, false
			break
		}
	}
	return p
}

// attach puts the receive program first on interface ifindex, once; false
// if it cannot be (that interface keeps the raw socket).
func (b *synBypass) attach(d *dialer, ifindex int, name string) bool {
	b.mu.Lock()
	_, ok := b.links[ifindex]
	refused := b.refused[ifindex]
	b.mu.Unlock()
	if ok || refused {
		return ok
	}
	var l link.Link
	err := d.do(func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: b.objs.XlbSynRx, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
		return err
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.refused[ifindex] = true
		b.log.Warn("half-open checks through the raw socket on this interface", "engine", "raw", "iface", name, "err", fmt.Errorf("attach tcx to %q: %w", name, err))
		return false
	}
	b.links[ifindex] = l
	b.log.Info("half-open checks bypass the IP stack on this interface", "engine", "bypass", "iface", name)
	return true
}

// queue adds the frame of a SYN (segment seg, from src to dst) along p to
// the batch.
func (b *synBypass) queue(p *synPath, src netip.Addr, dst netip.Addr, seg *[24]byte, token uint32, owner any) {
	o := &b.out
	i := o.n
	o.n++
	synFrame(&o.frame[i], p, src, dst, seg)
	o.to[i].Ifindex = int32(p.ifindex)
	o.tokens[i], o.owners[i] = token, owner
}

// synFrame writes the Ethernet and IPv4 headers before seg into f.
func synFrame(f *[synFrameLen]byte, p *synPath, src, dst netip.Addr, seg *[24]byte) {
	copy(f[:12], p.eth[:])
	f[12], f[13] = 0x08, 0x00
	ip := f[14:34]
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:], 20+24)
	ip[4], ip[5] = 0, 0    // id: 0 with DF, as the kernel does
	ip[6], ip[7] = 0x40, 0 // DF
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	ip[10], ip[11] = 0, 0
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	copy(f[34:], seg[:])
}

// flush sends the queued frames; a frame the socket refuses is answered
// with the error (fail).
func (b *synBypass) flush(count func(calls, frames int), fail func(token uint32, owner any, err error)) {
	o := &b.out
	for sent := 0; sent < o.n; {
		r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(b.pfd), uintptr(unsafe.Pointer(&o.hdrs[sent])), uintptr(o.n-sent), unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			sent += int(r)
			count(1, int(r))
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN, unix.ENOBUFS:
			pfd := []unix.PollFd{{Fd: int32(b.pfd), Events: unix.POLLOUT}}
			if n, _ := unix.Poll(pfd, 10); n > 0 {
				continue
			}
		}
		fail(o.tokens[sent], o.owners[sent], fmt.Errorf("send SYN frame: %w", error(errno)))
		sent++
	}
	clear(o.owners[:o.n])
	o.n = 0
}

// send sends one frame now (a check outside a monitor).
func (b *synBypass) send(p *synPath, src, dst netip.Addr, seg *[24]byte) error {
	var f [synFrameLen]byte
	synFrame(&f, p, src, dst, seg)
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: p.ifindex, Halen: 6}
	copy(to.Addr[:], p.eth[:6])
	if err := unix.Sendto(b.pfd, f[:], 0, to); err != nil {
		return fmt.Errorf("send SYN frame: %w", err)
	}
	return nil
}

// synReply is one answer the program took (struct syn_reply).
type synReply = synprobeSynReply

// read hands each answer in the ring to fn, with its arrival time. The
// ring is read in place (shared memory): no system call unless there is
// something to read.
func (b *synBypass) read(fn func(r *synReply, at time.Time)) int {
	if b.rd.AvailableBytes() == 0 {
		return 0
	}
	now := time.Now()
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	mono := ts.Nano()
	n := 0
	for b.rd.AvailableBytes() > 0 {
		if err := b.rd.ReadInto(&b.rec); err != nil {
			return n // the deadline (nothing more), or closed
		}
		if len(b.rec.RawSample) < int(unsafe.Sizeof(synReply{})) {
			continue
		}
		r := (*synReply)(unsafe.Pointer(&b.rec.RawSample[0]))
		fn(r, now.Add(-time.Duration(mono-int64(r.Ts))))
		n++
	}
	return n
}
