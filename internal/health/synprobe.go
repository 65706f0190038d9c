package health

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Half-open TCP checks ("half-open": "on"): a SYN sent from one raw socket,
// the backend's SYN-ACK (up) or RST (down, "connect refused") read back on
// it. No socket of the LB has the connection, so the LB's kernel answers
// the SYN-ACK with a RST and the backend forgets the half-open connection
// at once. A check then costs one sendmsg and a share of one recvfrom
// instead of a socket, a connect, an epoll registration and a close.
//
// The source ports are held by bound (not listening) TCP sockets, so no
// connection of the LB can take them, and a SYN-ACK to them reaches no
// socket. Replies are matched by backend address, port, our port and the
// acknowledgement of our random initial sequence number, so a late answer
// to an earlier check is never taken for this one's.
//
// IPv4 only: an IPv6 check with half-open on makes a full connect.

// synPorts is how many source ports a prober holds: checks of one
// backend address and port by several farms at the same moment each need
// their own (more at once make a full connect).
const synPorts = 4

// synProber sends and matches half-open checks for one network namespace.
type synProber struct {
	fd      int
	holders []int
	ports   [synPorts]uint16

	mu       sync.Mutex
	inflight map[synKey]*synWait
	src      map[netip.Addr]netip.Addr // route source towards each backend
	closed   bool
}

type synKey struct {
	dst   netip.AddrPort
	sport uint16
}

type synWait struct {
	ack uint32 // the acknowledgement a reply must carry: our ISN + 1
	ch  chan string
}

// answers of a half-open check.
const (
	synUp      = "SYN-ACK"
	synRefused = "connect refused"
)

// newSynProber opens the raw socket and holds the source ports in the
// namespace d (the current one if none). Its reader runs until close.
func newSynProber(d *dialer) (*synProber, error) {
	p := &synProber{fd: -1, inflight: map[synKey]*synWait{}, src: map[netip.Addr]netip.Addr{}}
	err := d.do(func() error {
		for i := range synPorts {
			h, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("tcp socket: %w", err)
			}
			p.holders = append(p.holders, h)
			if err := unix.Bind(h, &unix.SockaddrInet4{}); err != nil {
				return fmt.Errorf("hold a source port: %w", err)
			}
			sa, err := unix.Getsockname(h)
			if err != nil {
				return fmt.Errorf("hold a source port: %w", err)
			}
			p.ports[i] = uint16(sa.(*unix.SockaddrInet4).Port)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return fmt.Errorf("raw tcp socket: %w", err)
		}
		p.fd = fd
		markSocket(fd)
		prog, err := synFilter(p.ports[:])
		if err != nil {
			return err
		}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog); err != nil {
			return fmt.Errorf("attach the reply filter: %w", err)
		}
		return nil
	})
	if err != nil {
		p.close()
		return nil, err
	}
	go p.read()
	return p, nil
}

// synFilter is a classic BPF filter that keeps the TCP segments to our
// ports (IPv4 header first, as a raw IPv4 socket gets them).
func synFilter(ports []uint16) (*unix.SockFprog, error) {
	ins := []bpf.Instruction{
		bpf.LoadMemShift{Off: 0},          // X = IP header length
		bpf.LoadIndirect{Off: 2, Size: 2}, // A = TCP destination port
	}
	for i, port := range ports {
		ins = append(ins, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(port), SkipTrue: uint8(len(ports) - i)})
	}
	ins = append(ins, bpf.RetConstant{Val: 0}, bpf.RetConstant{Val: 128})
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

func (p *synProber) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if p.fd >= 0 {
		// Wakes the reader: recvfrom on a shut-down socket returns.
		_ = unix.Shutdown(p.fd, unix.SHUT_RDWR)
		_ = unix.Close(p.fd)
	}
	for _, h := range p.holders {
		_ = unix.Close(h)
	}
}

// read takes in the replies until the socket is closed.
func (p *synProber) read() {
	buf := make([]byte, 128)
	for {
		n, _, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		p.match(buf[:n])
	}
}

// match hands one reply (IPv4 header, TCP header) to its check.
func (p *synProber) match(b []byte) {
	if len(b) < 20 || b[0]>>4 != 4 {
		return
	}
	ihl := int(b[0]&0xf) * 4
	if len(b) < ihl+14 {
		return
	}
	t := b[ihl:]
	src := netip.AddrFrom4([4]byte(b[12:16]))
	k := synKey{dst: netip.AddrPortFrom(src, binary.BigEndian.Uint16(t[0:])), sport: binary.BigEndian.Uint16(t[2:])}
	ack := binary.BigEndian.Uint32(t[8:])
	flags := t[13]
	var answer string
	switch {
	case flags&tcpRST != 0:
		answer = synRefused
	case flags&(tcpSYN|tcpACK) == tcpSYN|tcpACK:
		answer = synUp
	default:
		return
	}
	p.mu.Lock()
	w := p.inflight[k]
	if w != nil && w.ack == ack {
		delete(p.inflight, k)
	} else {
		w = nil
	}
	p.mu.Unlock()
	if w != nil {
		w.ch <- answer // buffered: never blocks
	}
}

// TCP flags.
const (
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// errSynBusy: every source port has a check in flight to this backend.
var errSynBusy = errors.New("every half-open source port is busy towards this backend")

// probe sends a SYN to dst (from src if valid) and waits for the answer
// until ctx ends. It returns synUp, synRefused, or ctx's error.
func (p *synProber) probe(ctx context.Context, d *dialer, src netip.Addr, dst netip.AddrPort) (string, error) {
	if !src.IsValid() {
		var err error
		if src, err = p.sourceFor(d, dst.Addr()); err != nil {
			return "", err
		}
	}
	isn := rand.Uint32()
	w := &synWait{ack: isn + 1, ch: make(chan string, 1)}
	var k synKey
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return "", errors.New("half-open prober closed")
	}
	for _, port := range p.ports {
		if _, busy := p.inflight[synKey{dst, port}]; !busy {
			k = synKey{dst, port}
			break
		}
	}
	if k.sport == 0 {
		p.mu.Unlock()
		return "", errSynBusy
	}
	p.inflight[k] = w
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.inflight[k] == w {
			delete(p.inflight, k)
		}
		p.mu.Unlock()
	}()
	seg := synSegment(src, dst, k.sport, isn)
	to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	if err := unix.Sendmsg(p.fd, seg, pktinfo4(src.As4()), to, 0); err != nil {
		return "", fmt.Errorf("send SYN: %w", err)
	}
	select {
	case a := <-w.ch:
		return a, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// sourceFor returns the address the namespace sends from towards dst (a
// connected UDP socket's, found once per backend).
func (p *synProber) sourceFor(d *dialer, dst netip.Addr) (netip.Addr, error) {
	p.mu.Lock()
	src, ok := p.src[dst]
	p.mu.Unlock()
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
	p.mu.Lock()
	p.src[dst] = src
	p.mu.Unlock()
	return src, nil
}

// synSegment builds a SYN from src:sport to dst with sequence number isn
// and an MSS option, checksummed.
func synSegment(src netip.Addr, dst netip.AddrPort, sport uint16, isn uint32) []byte {
	t := make([]byte, 24)
	binary.BigEndian.PutUint16(t[0:], sport)
	binary.BigEndian.PutUint16(t[2:], dst.Port())
	binary.BigEndian.PutUint32(t[4:], isn)
	t[12] = 6 << 4 // data offset: 6 words
	t[13] = tcpSYN
	binary.BigEndian.PutUint16(t[14:], 64240) // window
	t[20], t[21] = 2, 4                       // MSS
	binary.BigEndian.PutUint16(t[22:], 1460)
	s, d := src.As4(), dst.Addr().As4()
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	add(s[:])
	add(d[:])
	sum += unix.IPPROTO_TCP + uint32(len(t))
	add(t)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(t[16:], ^uint16(sum))
	return t
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
