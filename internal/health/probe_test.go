package health

import (
	"bufio"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
)

// Probes run against servers on loopback. Timeouts are generous: these
// tests check outcomes, never how long a check took.

func runProbe(t *testing.T, dst netip.AddrPort, c model.Check) Result {
	t.Helper()
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	c.Port = dst.Port()
	f := &model.Farm{Name: "f", Backends: []model.Backend{{Name: "b", Addr: dst.Addr(), Port: dst.Port()}}}
	p, err := compile(f, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	return p.run(context.Background(), &dialer{})
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T, network string) netip.AddrPort {
	t.Helper()
	if network == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		return netip.MustParseAddrPort(pc.LocalAddr().String())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// lineServer answers every TCP connection with answer (after reading a
// line, if readFirst).
func lineServer(t *testing.T, answer string, readFirst bool) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
			go func() {
				defer c.Close()
				if readFirst {
					bufio.NewReader(c).ReadString('\n')
				}
				c.Write([]byte(answer))
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

func addrOf(t *testing.T, url string) netip.AddrPort {
	t.Helper()
	return netip.MustParseAddrPort(strings.TrimPrefix(strings.TrimPrefix(url, "http://"), "https://"))
}

func TestProbeTCP(t *testing.T) {
	if r := runProbe(t, freePort(t, "tcp"), model.Check{Type: model.CheckTCP}); r.OK || r.Detail != "connect refused" {
		t.Errorf("closed port: %+v", r)
	}
	ok := lineServer(t, "SSH-2.0-test\r\n", false)
	if r := runProbe(t, ok, model.Check{Type: model.CheckTCP}); !r.OK || r.Detail != "connected" {
		t.Errorf("open port: %+v", r)
	}
	if r := runProbe(t, ok, model.Check{Type: model.CheckTCP, Expect: "SSH-"}); !r.OK {
		t.Errorf("banner: %+v", r)
	}
	if r := runProbe(t, ok, model.Check{Type: model.CheckTCP, Expect: "SMTP"}); r.OK || !strings.Contains(r.Detail, `answer without "SMTP"`) {
		t.Errorf("wrong banner: %+v", r)
	}
	// A listener that never accepts still completes the handshake (the
	// kernel does); one that never answers times out.
	silent := lineServer(t, "", true)
	if r := runProbe(t, silent, model.Check{Type: model.CheckTCP, Expect: "x", Timeout: 200 * time.Millisecond}); r.OK || r.Detail != "timeout after 200ms" {
		t.Errorf("silent: %+v", r)
	}
}

func TestProbeHTTP(t *testing.T) {
	status := 200
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" || r.Host != "web.example" {
			w.WriteHeader(404)
			return
		}
		w.WriteHeader(status)
		fmt.Fprint(w, "status: ok\n")
	}))
	defer srv.Close()
	dst := addrOf(t, srv.URL)
	base := model.Check{Type: model.CheckHTTP, Method: "GET", Path: "/health", Host: "web.example"}
	if r := runProbe(t, dst, base); !r.OK || r.Detail != "HTTP 200" {
		t.Errorf("200: %+v", r)
	}
	status = 503
	if r := runProbe(t, dst, base); r.OK || r.Detail != "HTTP 503" {
		t.Errorf("503: %+v", r)
	}
	status = 200
	re := base
	re.BodyRegex = "status: (ok|fine)"
	if r := runProbe(t, dst, re); !r.OK {
		t.Errorf("regex: %+v", r)
	}
	re.BodyRegex = "^down"
	if r := runProbe(t, dst, re); r.OK || r.Detail != "HTTP 200, body does not match ^down" {
		t.Errorf("regex mismatch: %+v", r)
	}
	sum := md5.Sum([]byte("status: ok\n"))
	dg := base
	dg.BodyDigest = hex.EncodeToString(sum[:])
	if r := runProbe(t, dst, dg); !r.OK {
		t.Errorf("digest: %+v", r)
	}
	dg.BodyDigest = strings.Repeat("0", 32)
	if r := runProbe(t, dst, dg); r.OK || !strings.Contains(r.Detail, "body digest") {
		t.Errorf("digest mismatch: %+v", r)
	}
	st := base
	st.Status = []model.StatusRange{{First: 503, Last: 503}}
	status = 503
	if r := runProbe(t, dst, st); !r.OK {
		t.Errorf("expected 503: %+v", r)
	}
	// A TCP listener that answers garbage.
	bad := lineServer(t, "hello\r\n\r\n", true)
	if r := runProbe(t, bad, base); r.OK {
		t.Errorf("not HTTP: %+v", r)
	}
}

func TestProbeHTTPS(t *testing.T) {
	var sni string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sni = r.TLS.ServerName
		w.WriteHeader(204)
	}))
	srv.StartTLS()
	defer srv.Close()
	r := runProbe(t, addrOf(t, srv.URL), model.Check{Type: model.CheckHTTPS, Method: "GET", Path: "/", Host: "secure.example"})
	if !r.OK || r.Detail != "HTTP 204" || sni != "secure.example" {
		t.Errorf("https: %+v, SNI %q", r, sni)
	}
	// Plain HTTP on the TLS port fails the handshake.
	plain := lineServer(t, "HTTP/1.0 200 OK\r\n\r\n", false)
	if r := runProbe(t, plain, model.Check{Type: model.CheckHTTPS, Method: "GET", Path: "/"}); r.OK || !strings.HasPrefix(r.Detail, "TLS handshake") {
		t.Errorf("https to plain: %+v", r)
	}
}

func TestProbeUDP(t *testing.T) {
	if r := runProbe(t, freePort(t, "udp"), model.Check{Type: model.CheckUDP, Send: "ping"}); r.OK || r.Detail != "port unreachable" {
		t.Errorf("closed port: %+v", r)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) == "ping" {
				pc.WriteTo([]byte("pong"), from)
			}
		}
	}()
	dst := netip.MustParseAddrPort(pc.LocalAddr().String())
	if r := runProbe(t, dst, model.Check{Type: model.CheckUDP, Send: "ping", Expect: "pong"}); !r.OK {
		t.Errorf("ping/pong: %+v", r)
	}
	if r := runProbe(t, dst, model.Check{Type: model.CheckUDP, Send: "hex:00ff", Expect: "pong", Timeout: 200 * time.Millisecond}); r.OK || r.Detail != "no answer (timeout after 200ms)" {
		t.Errorf("no answer: %+v", r)
	}
	// keepalived's UDP_CHECK without an expected reply: silence is up.
	if r := runProbe(t, dst, model.Check{Type: model.CheckUDP, Send: "other", Timeout: 200 * time.Millisecond}); !r.OK || r.Detail != "no ICMP error" {
		t.Errorf("silence: %+v", r)
	}
}

func TestProbeExec(t *testing.T) {
	dst := netip.MustParseAddrPort("127.0.0.1:80")
	if r := runProbe(t, dst, model.Check{Type: model.CheckExec, Command: `test "$XLB_BACKEND_ADDR" = 127.0.0.1`}); !r.OK || r.Detail != "exit 0" || r.Weight != -1 {
		t.Errorf("exit 0: %+v", r)
	}
	if r := runProbe(t, dst, model.Check{Type: model.CheckExec, Command: "echo overloaded; exit 1"}); r.OK || r.Detail != "exit 1: overloaded" {
		t.Errorf("exit 1: %+v", r)
	}
	if r := runProbe(t, dst, model.Check{Type: model.CheckExec, Command: "echo weight 7"}); !r.OK || r.Weight != 7 {
		t.Errorf("weight: %+v", r)
	}
	if r := runProbe(t, dst, model.Check{Type: model.CheckExec, Command: "sleep 5", Timeout: 100 * time.Millisecond}); r.OK || r.Detail != "timeout after 100ms" {
		t.Errorf("timeout: %+v", r)
	}
}

func TestProbeAgent(t *testing.T) {
	for answer, want := range map[string]Result{
		"up\n":              {OK: true, Percent: -1, Detail: "agent up"},
		"ready 75%\n":       {OK: true, Percent: 75, Detail: "agent ready 75%"},
		"drain\n":           {OK: true, Percent: 0, Detail: "agent drain"},
		"down #disk full\n": {OK: false, Now: true, Percent: -1, Detail: "agent down (disk full)"},
		"maint":             {OK: false, Now: true, Percent: -1, Detail: "agent maint"},
		"hello\n":           {OK: false, Percent: -1, Detail: `agent: no known word in "hello"`},
		"up, 50%\r\n":       {OK: true, Percent: 50, Detail: "agent up 50%"},
		"":                  {OK: false, Percent: -1, Detail: "agent closed without an answer"},
	} {
		r := runProbe(t, lineServer(t, answer, false), model.Check{Type: model.CheckAgent})
		if r.OK != want.OK || r.Percent != want.Percent || r.Detail != want.Detail || r.Now != want.Now {
			t.Errorf("agent %q: %+v, want %+v", answer, r, want)
		}
	}
}

// verify on: the certificate must chain to the CA file and name the host.
func TestProbeHTTPSVerify(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
	srv.StartTLS()
	defer srv.Close()
	dst := addrOf(t, srv.URL)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	// httptest's certificate names example.com and 127.0.0.1.
	for _, c := range []struct {
		check model.Check
		ok    bool
		want  string
	}{
		{model.Check{Type: model.CheckHTTPS, Verify: true, CAFile: ca}, true, "HTTP 200"},
		{model.Check{Type: model.CheckHTTPS, Verify: true, CAFile: ca, Host: "example.com"}, true, "HTTP 200"},
		{model.Check{Type: model.CheckHTTPS, Verify: true, CAFile: ca, Host: "other.example"}, false, "TLS handshake: tls: failed to verify certificate: x509: certificate is valid for example.com"},
		{model.Check{Type: model.CheckHTTPS, Verify: true}, false, "TLS handshake: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{model.Check{Type: model.CheckHTTPS, Verify: true, CAFile: "/nonexistent/ca.pem"}, false, "TLS: CA file: open /nonexistent/ca.pem: no such file or directory"},
		{model.Check{Type: model.CheckHTTPS}, true, "HTTP 200"},
	} {
		c.check.Method, c.check.Path = "GET", "/"
		r := runProbe(t, dst, c.check)
		if r.OK != c.ok || !strings.HasPrefix(r.Detail, c.want) {
			t.Errorf("%+v: %+v, want ok %v %q", c.check, r, c.ok, c.want)
		}
	}
}
