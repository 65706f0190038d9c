package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// dialer makes the checks' connections: from the LB's network namespace
// (ns, or the daemon's own), from a chosen source address, and closed with
// a reset (SO_LINGER 0) so 10,000 checks a second leave no TIME_WAIT
// sockets behind, as HAProxy's checks do.
type dialer struct {
	ns netns.NsHandle // zero or netns.None(): the current namespace
	// log: the monitor's (nil: none).
	log *slog.Logger
	// rawOnly: the half-open engine without its bypass (Options.HalfOpenRaw).
	rawOnly bool

	// The half-open checks' prober, opened at the first such check.
	synOnce sync.Once
	syn     *synEngine
	synErr  error
}

// do runs fn in the dialer's namespace.
func (d *dialer) do(fn func() error) error {
	if d.ns <= 0 {
		return fn()
	}
	return inNS(d.ns, fn)
}

func (d *dialer) logger() *slog.Logger {
	if d.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.log
}

// prober returns the namespace's half-open prober, opening it the first
// time.
func (d *dialer) prober() (*synEngine, error) {
	d.synOnce.Do(func() { d.syn, d.synErr = newSynEngine(d) })
	return d.syn, d.synErr
}

// close releases what the dialer holds.
func (d *dialer) close() {
	if d.syn != nil {
		d.syn.close()
	}
}

// control sets the options every check socket gets before bind and
// connect: a reset on close, and (with a source address) no port reserved
// at bind time, so the kernel picks one per destination at connect
// (IP_BIND_ADDRESS_NO_PORT: otherwise each bind takes a port of the whole
// ephemeral range).
func control(bindNoPort bool) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			markSocket(int(fd))
			if network == "tcp4" || network == "tcp6" {
				serr = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			}
			if serr == nil && bindNoPort {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// markSocket gives a check's socket dataplane.CheckSocketMark, so a plane
// with conntrack (nft) leaves its packets untracked. Best effort: it takes
// CAP_NET_ADMIN, and a check without it is only dearer.
func markSocket(fd int) {
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, dataplane.CheckSocketMark)
}

// dial connects to dst over network ("tcp" or "udp") from src (if valid)
// before deadline.
func (d *dialer) dial(ctx context.Context, network string, src netip.Addr, dst netip.AddrPort, deadline time.Time) (net.Conn, error) {
	// No keep-alive: a check lives less than a second, and the four
	// setsockopt calls that turn it on cost every check.
	nd := net.Dialer{Deadline: deadline, KeepAlive: -1, Control: control(src.IsValid())}
	if src.IsValid() {
		if network == "tcp" {
			nd.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		} else {
			nd.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
		}
	}
	if d.ns <= 0 { // zero or None: the current namespace (fd 0 is never a namespace)
		return nd.DialContext(ctx, network, dst.String())
	}
	var c net.Conn
	err := inNS(d.ns, func() error {
		var err error
		c, err = nd.DialContext(ctx, network, dst.String())
		return err
	})
	return c, err
}

// inNS runs fn on an OS thread switched into ns. A socket fn creates
// stays in ns for its whole life.
func inNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace: %w", err)
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		// Else the thread stays locked and ends with the goroutine, so no
		// other goroutine runs in the wrong namespace.
	}()
	return fn()
}

// describe turns a check's error into the reason shown to the operator:
// "connect refused", "timeout after 1s", "host unreachable", ...
func describe(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connect refused"
	case isTimeout(err):
		return "timeout after " + timeout.String()
	case errors.Is(err, syscall.EHOSTUNREACH):
		return "host unreachable"
	case errors.Is(err, syscall.ENETUNREACH):
		return "network unreachable"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "source address not available"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Op + ": " + oe.Err.Error()
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &ne) && ne.Timeout()
}
