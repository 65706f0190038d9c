package testutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// DefaultTimeout bounds every client helper that takes no timeout.
const DefaultTimeout = 2 * time.Second

// StartTCPServer listens on addr inside ns and serves each connection: it
// first writes the line `reply + " " + remote address` (so a test sees both
// which backend answered and which source address the backend saw), then
// echoes every line it reads until the peer closes. An unspecified IPv6
// address ([::]) listens on IPv4 too. Port 0 picks a free port. It returns
// the bound address; the server stops in tb.Cleanup.
func StartTCPServer(tb testing.TB, ns netns.NsHandle, addr netip.AddrPort, reply string) netip.AddrPort {
	tb.Helper()
	var ln net.Listener
	err := Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr.String())
		return err
	})
	if err != nil {
		tb.Fatalf("listen tcp %s: %v", addr, err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			select {
			case <-done:
				mu.Unlock()
				c.Close()
				return
			default:
			}
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				if _, err := fmt.Fprintf(c, "%s %s\n", reply, c.RemoteAddr()); err != nil {
					return
				}
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if len(line) > 0 {
						if _, werr := io.WriteString(c, line); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	tb.Cleanup(func() {
		mu.Lock()
		close(done)
		ln.Close()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// StartUDPServer listens on addr inside ns and answers each datagram with
// `reply + " " + source address`. It returns the bound address; the server
// stops in tb.Cleanup.
func StartUDPServer(tb testing.TB, ns netns.NsHandle, addr netip.AddrPort, reply string) netip.AddrPort {
	tb.Helper()
	var pc net.PacketConn
	err := Do(ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp", addr.String())
		return err
	})
	if err != nil {
		tb.Fatalf("listen udp %s: %v", addr, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(reply+" "+from.String()), from)
		}
	}()
	tb.Cleanup(func() {
		pc.Close()
		<-done
	})
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// StartHTTPServer serves HTTP on addr inside ns; every request gets the body
// `reply + " " + remote address`. It returns the bound address; the server
// stops in tb.Cleanup.
func StartHTTPServer(tb testing.TB, ns netns.NsHandle, addr netip.AddrPort, reply string) netip.AddrPort {
	tb.Helper()
	var ln net.Listener
	err := Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr.String())
		return err
	})
	if err != nil {
		tb.Fatalf("listen http %s: %v", addr, err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s", reply, r.RemoteAddr)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		srv.Close()
		<-done
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// DialTCP connects to addr from inside ns. The connection's socket stays in
// ns; the caller closes it.
func DialTCP(ns netns.NsHandle, addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	return DialTCPFrom(ns, netip.AddrPort{}, addr, timeout)
}

// DialTCPFrom is DialTCP from a chosen local address and port (either may be
// zero: any). Reusing a local port right after closing a connection to the
// same peer may fail with EADDRINUSE while the old one is in TIME_WAIT.
func DialTCPFrom(ns netns.NsHandle, local, addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := Do(ns, func() error {
		d := net.Dialer{Timeout: timeout}
		if local.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(local)
		}
		var err error
		c, err = d.Dial("tcp", addr.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ReadLine reads one line (without its newline) from c, waiting at most
// timeout.
func ReadLine(c net.Conn, timeout time.Duration) (string, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	var b strings.Builder
	buf := make([]byte, 1)
	for {
		n, err := c.Read(buf)
		if n == 1 {
			if buf[0] == '\n' {
				return b.String(), nil
			}
			b.WriteByte(buf[0])
		}
		if err != nil {
			if errors.Is(err, io.EOF) && b.Len() > 0 {
				return b.String(), nil
			}
			return b.String(), err
		}
	}
}

// AskTCP connects to addr from inside ns, reads the server's first line and
// closes the connection. With StartTCPServer the line is `reply remote-addr`.
func AskTCP(ns netns.NsHandle, addr netip.AddrPort) (string, error) {
	return AskTCPFrom(ns, netip.AddrPort{}, addr)
}

// AskTCPFrom is AskTCP from a chosen local address and port.
func AskTCPFrom(ns netns.NsHandle, local, addr netip.AddrPort) (string, error) {
	c, err := DialTCPFrom(ns, local, addr, DefaultTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return ReadLine(c, DefaultTimeout)
}

// AskUDP sends one datagram to addr from a new socket inside ns (so a new
// source port, i.e. a new conntrack entry, each time) and returns the answer.
func AskUDP(ns netns.NsHandle, addr netip.AddrPort) (string, error) {
	return AskUDPFrom(ns, netip.AddrPort{}, addr)
}

// AskUDPFrom is AskUDP from a chosen local address and port.
func AskUDPFrom(ns netns.NsHandle, local, addr netip.AddrPort) (string, error) {
	return AskUDPWithin(ns, local, addr, DefaultTimeout)
}

// AskUDPWithin is AskUDPFrom waiting at most timeout for the answer.
func AskUDPWithin(ns netns.NsHandle, local, addr netip.AddrPort, timeout time.Duration) (string, error) {
	var c *net.UDPConn
	err := Do(ns, func() error {
		var laddr *net.UDPAddr
		if local.IsValid() {
			laddr = net.UDPAddrFromAddrPort(local)
		}
		var err error
		c, err = net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		return "", err
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// HTTPClient returns an HTTP client whose connections are made inside ns.
// Keep-alives are off, so each request is a new connection.
func HTTPClient(ns netns.NsHandle) *http.Client {
	return &http.Client{
		Timeout: DefaultTimeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				ap, err := netip.ParseAddrPort(addr)
				if err != nil {
					return nil, err
				}
				timeout := DefaultTimeout
				if dl, ok := ctx.Deadline(); ok {
					timeout = time.Until(dl)
				}
				return DialTCP(ns, ap, timeout)
			},
		},
	}
}

// ParseReply splits a server's answer `reply remote-addr` into the reply
// name and the address the server saw the connection come from.
func ParseReply(s string) (name string, from netip.AddrPort, err error) {
	name, addr, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok {
		return "", netip.AddrPort{}, fmt.Errorf("malformed reply %q", s)
	}
	from, err = netip.ParseAddrPort(addr)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("malformed reply %q: %w", s, err)
	}
	return name, from, nil
}

// ForwardTCP listens on listen inside h's namespace and forwards each
// connection to target as the test process reaches it (its own namespace),
// until tb ends: a command run in h reaches a server of the host's
// loopback (a test kube-apiserver) at the same address.
func ForwardTCP(tb testing.TB, h Host, listen, target string) {
	tb.Helper()
	var ln net.Listener
	if err := Do(h.NS, func() error {
		var err error
		ln, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		tb.Fatalf("listen on %s in %s: %v", listen, h.Name, err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(u, c)
			go pipe(c, u)
		}
	}()
}
