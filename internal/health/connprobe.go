package health

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Plain tcp checks (a connect, nothing sent or expected) of a monitor run
// without a goroutine each: the scheduler's loop opens each check's
// non-blocking socket, starts the connect and registers it in one epoll
// instance of its own; whenever the loop wakes it takes the finished
// connects from that epoll (epoll_wait without waiting: many a system
// call), reads each one's outcome (SO_ERROR) and closes the socket with a
// reset (SO_LINGER 0). A check through Go's net.Dialer costs a goroutine,
// a context and a timer, and the netpoller's registration and wake-up of
// a goroutine, besides three more system calls (TCP_NODELAY, getsockname,
// getpeername); the connect itself and the socket are the kernel's work
// either way. The timeout is the wheel's, as for half-open checks.
type connEngine struct {
	ep    int
	inFly map[int32]*target
	evs   [synBatch]unix.EpollEvent
}

func newConnEngine() (*connEngine, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll for connect checks: %w", err)
	}
	return &connEngine{ep: ep, inFly: map[int32]*target{}}, nil
}

func (c *connEngine) close() {
	for fd := range c.inFly {
		unix.Close(int(fd))
	}
	clear(c.inFly)
	unix.Close(c.ep)
}

// start opens t's socket in the dialer's namespace and starts the connect.
// done is true when the connect finished at once (r is its result);
// otherwise the connect is under way and its socket is t.connFD.
func (c *connEngine) start(d *dialer, t *target) (r Result, done bool) {
	dst := t.probe.dst
	src := t.check.SourceAddr
	fam := unix.AF_INET
	if dst.Addr().Is6() {
		fam = unix.AF_INET6
	}
	var fd int
	err := d.do(func() error {
		var err error
		fd, err = unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return t.probe.failErr(fmt.Errorf("socket: %w", err)), true
	}
	markSocket(fd)
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		unix.Close(fd)
		return t.probe.failErr(fmt.Errorf("setsockopt SO_LINGER: %w", err)), true
	}
	if src.IsValid() {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
		if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(src, 0))); err != nil {
			unix.Close(fd)
			return t.probe.failErr(fmt.Errorf("bind %s: %w", src, err)), true
		}
	}
	err = rawConnect(fd, dst)
	switch {
	case err == nil:
		unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
		return pass("connected"), true
	case !errors.Is(err, unix.EINPROGRESS):
		unix.Close(fd)
		return t.probe.failErr(err), true
	}
	ev := unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLERR | unix.EPOLLHUP, Fd: int32(fd)}
	if err := unix.EpollCtl(c.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		unix.Close(fd)
		return t.probe.failErr(fmt.Errorf("epoll_ctl: %w", err)), true
	}
	c.inFly[int32(fd)] = t
	t.connFD = int32(fd)
	return Result{}, false
}

// cancel closes a connect given up (its timeout passed, or its target
// went away).
func (c *connEngine) cancel(t *target) {
	if t.connFD < 0 {
		return
	}
	if c.inFly[t.connFD] == t {
		delete(c.inFly, t.connFD)
		unix.Close(int(t.connFD)) // leaves the epoll set with it
	}
	t.connFD = -1
}

// connDone is a connect that finished.
type connDone struct {
	t   *target
	err error // nil: connected
	at  time.Time
}

// poll takes the connects that finished, without waiting, closes their
// sockets and appends their outcomes to dst.
func (c *connEngine) poll(dst []connDone) []connDone {
	for len(c.inFly) > 0 {
		// Raw: it does not block (timeout 0), see synprobe.go.
		r, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(c.ep), uintptr(unsafe.Pointer(&c.evs[0])), uintptr(len(c.evs)), 0, 0, 0)
		n := int(r)
		if errno != 0 || n <= 0 {
			return dst
		}
		now := time.Now()
		for _, ev := range c.evs[:n] {
			t := c.inFly[ev.Fd]
			if t == nil {
				continue
			}
			var cerr error
			if v, err := unix.GetsockoptInt(int(ev.Fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
				cerr = err
			} else if v != 0 {
				cerr = unix.Errno(v)
			}
			delete(c.inFly, ev.Fd)
			// Raw, as connect: the reset goes out, and the backend
			// takes it, inside the close.
			unix.RawSyscall(unix.SYS_CLOSE, uintptr(ev.Fd), 0, 0)
			t.connFD = -1
			dst = append(dst, connDone{t: t, err: cerr, at: now})
		}
		if n < len(c.evs) {
			return dst
		}
	}
	return dst
}

// rawConnect starts a non-blocking connect with a raw system call: on a
// veth or loopback the kernel does the whole handshake inside it, long
// enough for the Go runtime to hand the P to another thread if it knew
// (see synprobe.go). It returns EINPROGRESS when the connect goes on.
func rawConnect(fd int, dst netip.AddrPort) error {
	var sa unsafe.Pointer
	var l uintptr
	if dst.Addr().Is4() {
		var a unix.RawSockaddrInet4
		a.Family = unix.AF_INET
		a.Addr = dst.Addr().As4()
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&a.Port))[:], dst.Port())
		sa, l = unsafe.Pointer(&a), unix.SizeofSockaddrInet4
	} else {
		var a unix.RawSockaddrInet6
		a.Family = unix.AF_INET6
		a.Addr = dst.Addr().As16()
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&a.Port))[:], dst.Port())
		sa, l = unsafe.Pointer(&a), unix.SizeofSockaddrInet6
	}
	_, _, errno := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(sa), l)
	if errno != 0 {
		return errno
	}
	return nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}
