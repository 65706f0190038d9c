package conformance

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// FTP ports of the helper-ftp scenario: the farm listens on 21 and the
// backend's scripted FTP server on 2121.
const (
	ftpVPort = 21
	ftpBPort = 2121
)

// startFTPServer serves a scripted FTP conversation on [::]:ftpBPort in the
// backend's namespace, enough for curl and for runFTP's own client: 220 on
// connect; USER, PASS, PWD, CWD, TYPE answer success; PASV opens a data
// listener on the backend's address; PORT a,b,c,d,p,q records the client's
// data address (and sends it on ports); SIZE gives the file's size; RETR
// sends "passive-data" on the passive connection or "active-data" on a
// connection to the PORT address, between 150 and 226; QUIT ends.
func startFTPServer(t *testing.T, b testutil.Host, ports chan<- netip.AddrPort) {
	var ln net.Listener
	err := testutil.Do(b.NS, func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf("[::]:%d", ftpBPort))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFTP(b.NS, b.IPv4, c, ports)
		}
	}()
}

func serveFTP(ns netns.NsHandle, self netip.Addr, c net.Conn, ports chan<- netip.AddrPort) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(c, "220 xlb scripted ftp\r\n")
	r := bufio.NewReader(c)
	var pasv net.Listener // set by PASV, used by the next RETR
	var active netip.AddrPort
	defer func() {
		if pasv != nil {
			pasv.Close()
		}
	}()
	content := func() string {
		if pasv != nil {
			return "passive-data\n"
		}
		return "active-data\n"
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch strings.ToUpper(cmd) {
		case "USER":
			fmt.Fprint(c, "331 any password\r\n")
		case "PASS":
			fmt.Fprint(c, "230 logged in\r\n")
		case "PWD":
			fmt.Fprint(c, "257 \"/\"\r\n")
		case "CWD", "TYPE":
			fmt.Fprint(c, "200 ok\r\n")
		case "SIZE":
			fmt.Fprintf(c, "213 %d\r\n", len(content()))
		case "PASV":
			if pasv != nil {
				pasv.Close()
			}
			if err := testutil.Do(ns, func() error {
				var err error
				pasv, err = net.Listen("tcp4", netip.AddrPortFrom(self, 0).String())
				return err
			}); err != nil {
				fmt.Fprint(c, "425 no listener\r\n")
				continue
			}
			_ = pasv.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
			port := netip.MustParseAddrPort(pasv.Addr().String()).Port()
			a := self.As4()
			fmt.Fprintf(c, "227 Entering Passive Mode (%d,%d,%d,%d,%d,%d).\r\n", a[0], a[1], a[2], a[3], port>>8, port&0xff)
		case "PORT":
			ap, err := parseFTPAddr(arg)
			if err != nil {
				fmt.Fprint(c, "501 bad PORT\r\n")
				continue
			}
			ports <- ap
			active = ap
			if pasv != nil {
				pasv.Close()
				pasv = nil
			}
			fmt.Fprint(c, "200 PORT ok\r\n")
		case "RETR":
			body := content()
			fmt.Fprint(c, "150 opening data connection\r\n")
			var d net.Conn
			var err error
			if pasv != nil {
				d, err = pasv.Accept()
				pasv.Close()
				pasv = nil
			} else {
				d, err = testutil.DialTCP(ns, active, 3*time.Second)
			}
			if err != nil {
				fmt.Fprint(c, "425 no data connection\r\n")
				continue
			}
			fmt.Fprint(d, body)
			d.Close()
			fmt.Fprint(c, "226 transfer complete\r\n")
		case "QUIT":
			fmt.Fprint(c, "221 bye\r\n")
			return
		default:
			fmt.Fprint(c, "502 not implemented\r\n")
		}
	}
}

// parseFTPAddr parses "a,b,c,d,p,q" (PORT argument, inside a 227 reply).
func parseFTPAddr(s string) (netip.AddrPort, error) {
	parts := strings.Split(strings.Trim(strings.TrimSpace(s), "()."), ",")
	if len(parts) != 6 {
		return netip.AddrPort{}, fmt.Errorf("ftp address %q", s)
	}
	var n [6]byte
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 8)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("ftp address %q", s)
		}
		n[i] = byte(v)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(n[:4])), uint16(n[4])<<8|uint16(n[5])), nil
}

// runFTP: passive and active FTP through an snat farm with helper ftp. In
// passive mode the backend's 227 reply names its own address; the helper
// must rewrite it to the VIP and let the data connection to the VIP reach
// the backend. In active mode the client's PORT names the client; the
// helper must rewrite it to the LB's address (snat) and let the backend's
// data connection reach the client.
func runFTP(t *testing.T, e *Env, f model.Farm) {
	ports := make(chan netip.AddrPort, 4)
	startFTPServer(t, e.Backends[0], ports)
	e.Put(t, f)
	vip := netip.AddrPortFrom(f.VirtualAddr, ftpVPort)
	c, err := testutil.DialTCP(e.Client.NS, vip, 2*time.Second)
	if err != nil {
		t.Fatalf("ftp control connection: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	reply := func() string {
		t.Helper()
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("ftp reply: %v", err)
		}
		return strings.TrimSpace(l)
	}
	if l := reply(); !strings.HasPrefix(l, "220") {
		t.Fatalf("greeting %q", l)
	}
	// Passive.
	fmt.Fprint(c, "PASV\r\n")
	l := reply()
	i := strings.IndexByte(l, '(')
	if !strings.HasPrefix(l, "227") || i < 0 {
		t.Fatalf("PASV reply %q", l)
	}
	data, err := parseFTPAddr(l[i:])
	if err != nil {
		t.Fatal(err)
	}
	if data.Addr() != f.VirtualAddr {
		t.Errorf("PASV reply names %s, want the VIP %s (helper rewrite)", data.Addr(), f.VirtualAddr)
	}
	pd, err := testutil.DialTCP(e.Client.NS, data, 2*time.Second)
	if err != nil {
		t.Fatalf("passive data connection to %s: %v", data, err)
	}
	fmt.Fprint(c, "RETR file\r\n")
	if l := reply(); !strings.HasPrefix(l, "150") {
		t.Fatalf("RETR reply %q", l)
	}
	if got, err := testutil.ReadLine(pd, 2*time.Second); err != nil || got != "passive-data" {
		t.Errorf("passive data from %s: %q, %v", data, got, err)
	}
	pd.Close()
	if l := reply(); !strings.HasPrefix(l, "226") {
		t.Fatalf("end of passive transfer %q", l)
	}
	// Active.
	var ln net.Listener
	if err := testutil.Do(e.Client.NS, func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(e.Client.IPv4, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lp := netip.MustParseAddrPort(ln.Addr().String())
	a := lp.Addr().As4()
	fmt.Fprintf(c, "PORT %d,%d,%d,%d,%d,%d\r\n", a[0], a[1], a[2], a[3], lp.Port()>>8, lp.Port()&0xff)
	if l := reply(); !strings.HasPrefix(l, "200") {
		t.Fatalf("PORT reply %q", l)
	}
	select {
	case seen := <-ports:
		if seen.Addr() != e.LBBack4 {
			t.Errorf("backend got PORT %s, want the LB's address %s (helper rewrite under snat)", seen, e.LBBack4)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("backend never got the PORT command")
	}
	fmt.Fprint(c, "RETR file\r\n")
	if l := reply(); !strings.HasPrefix(l, "150") {
		t.Fatalf("RETR reply %q", l)
	}
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	d, err := ln.Accept()
	if err != nil {
		t.Fatalf("active data connection never came: %v", err)
	}
	defer d.Close()
	if got, err := testutil.ReadLine(d, 2*time.Second); err != nil || got != "active-data" {
		t.Errorf("active data: %q, %v", got, err)
	}
	if l := reply(); !strings.HasPrefix(l, "226") {
		t.Fatalf("end of active transfer %q", l)
	}
	fmt.Fprint(c, "QUIT\r\n")

	// The same with curl, a real FTP client: passive with PASV
	// (--disable-epsv: EPSV names only a port, so no address to rewrite)
	// and active with PORT naming the client's own address (-P -,
	// --disable-eprt).
	url := fmt.Sprintf("ftp://%s/file", vip)
	for _, m := range []struct {
		name string
		args []string
		want string
	}{
		{"passive", []string{"--disable-epsv"}, "passive-data"},
		{"active", []string{"--disable-eprt", "-P", "-"}, "active-data"},
	} {
		args := append([]string{"curl", "-sS", "--max-time", "8"}, m.args...)
		out, err := testutil.RunErr(e.Client.Name, append(args, url)...)
		if err != nil || strings.TrimSpace(out) != m.want {
			t.Errorf("curl %s FTP through the farm: %q, %v", m.name, out, err)
		}
	}
	select {
	case seen := <-ports:
		if seen.Addr() != e.LBBack4 {
			t.Errorf("curl's PORT reached the backend as %s, want the LB's address %s", seen, e.LBBack4)
		}
	default:
		t.Error("the backend never got curl's PORT command")
	}
}
