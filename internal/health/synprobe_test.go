package health

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// Half-open checks from the LB's namespace to a backend: a listening port
// answers SYN-ACK (up), a closed one RST (down, connect refused), one whose
// SYNs are dropped nothing (timeout); no socket of the LB ever holds a
// connection, and the backend keeps none half-open.
func TestHalfOpenProbe(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 1})
	be := topo.Backends[0]
	testutil.StartTCPServer(t, be.NS, netip.AddrPortFrom(be.IPv4, 8080), "be0")
	testutil.Run(t, be.Name, "nft", "add table inet bh; add chain inet bh in { type filter hook input priority 0 ; } ; add rule inet bh in tcp dport 8098 drop")
	d := &dialer{ns: topo.LB.NS}
	defer d.close()
	run := func(port uint16, timeout time.Duration) Result {
		t.Helper()
		c := model.Check{Type: model.CheckTCP, HalfOpen: true, Timeout: timeout, Port: port}
		f := &model.Farm{Name: "f", Backends: []model.Backend{{Name: "b", Addr: be.IPv4, Port: port}}}
		p, err := compile(f, 0, c)
		if err != nil {
			t.Fatal(err)
		}
		return p.run(context.Background(), d)
	}
	for range 3 {
		if r := run(8080, 2*time.Second); !r.OK || r.Detail != "SYN-ACK" {
			t.Errorf("listening port: %+v", r)
		}
	}
	if r := run(8099, 2*time.Second); r.OK || r.Detail != "connect refused" {
		t.Errorf("closed port: %+v", r)
	}
	if r := run(8098, 300*time.Millisecond); r.OK || r.Detail != "timeout after 300ms" {
		t.Errorf("blackholed port: %+v", r)
	}
	if d.syn == nil {
		t.Fatal("no half-open prober was opened: the checks connected")
	}
	// The LB answered each SYN-ACK with a RST: the backend holds no
	// half-open (SYN-RECV) connection.
	time.Sleep(100 * time.Millisecond)
	if out := testutil.Run(t, be.Name, "ss", "-Htn", "state", "syn-recv"); out != "" {
		t.Errorf("backend holds half-open connections:\n%s", out)
	}
}

// An exec check runs in the LB's network namespace (Options.NetNS), as the
// other checks' sockets do.
func TestExecInNamespace(t *testing.T) {
	testutil.RequireRoot(t)
	_, ns := testutil.NewNetNS(t)
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	d := &dialer{ns: ns}
	c := model.Check{Type: model.CheckExec, Timeout: 5 * time.Second, Command: `readlink /proc/self/ns/net; test "$(readlink /proc/self/ns/net)" = "` + want + `"`}
	f := &model.Farm{Name: "f", Backends: []model.Backend{{Name: "b", Addr: netip.MustParseAddr("10.0.0.1")}}}
	p, err := compile(f, 0, c)
	if err != nil {
		t.Fatal(err)
	}
	if r := p.run(context.Background(), d); !r.OK {
		t.Errorf("exec ran outside %s: %+v", want, r)
	}
}
