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

// A monitor's half-open checks go out in batches through the engine and
// keep their meaning: of 100 farms, the backends on a listening port stay
// up (SYN-ACK), those on a closed port go down (connect refused), and in
// 20 of them a third whose SYNs are dropped goes down (timeout after
// 200ms); at 2,200 checks a second SYNs leave several to a sendmmsg; every
// check is answered by the engine (none connects); the backends keep no
// half-open connection.
func TestHalfOpenBatched(t *testing.T) { batchedChecks(t, true) }

// Plain connect checks (half-open off) of a monitor run without a
// goroutine each (connprobe.go), with the same outcomes: connected,
// connect refused, timeout after 200ms.
func TestConnectChecksBatched(t *testing.T) { batchedChecks(t, false) }

func batchedChecks(t *testing.T, halfOpen bool) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3})
	testutil.StartTCPServer(t, topo.Backends[0].NS, netip.AddrPortFrom(topo.Backends[0].IPv4, 8080), "be0")
	testutil.Run(t, topo.Backends[2].Name, "nft", "add table inet bh; add chain inet bh in { type filter hook input priority 0 ; } ; add rule inet bh in tcp dport 8080 drop")
	// Silent ones in 20 farms only: each keeps a SYN in flight most of
	// the time, and one backend address and port takes at most synPorts.
	const nFarms, nSilent = 100, 20
	onOff := map[bool]string{true: "on", false: "off"}
	var farms []*model.Farm
	for i := range nFarms {
		silent := ""
		if i < nSilent {
			silent = fmt.Sprintf(`,{"name":"silent","ip-addr":"%s","port":"8080"}`, topo.Backends[2].IPv4)
		}
		js := fmt.Sprintf(`{"name":"f%d","virtual-addr":"10.99.%d.%d","virtual-ports":"80",
			"check":{"type":"tcp","half-open":%q,"inter":"100ms","timeout":"200ms","rise":"2","fall":"2"},
			"backends":[{"name":"up","ip-addr":"%s","port":"8080"},{"name":"refused","ip-addr":"%s","port":"8080"}%s]}`,
			i, i/200, i%200+1, onOff[halfOpen], topo.Backends[0].IPv4, topo.Backends[1].IPv4, silent)
		fs, err := model.DecodeFarms([]byte(js), func(string) (*model.Farm, bool) { return nil, false })
		if err != nil {
			t.Fatal(err)
		}
		farms = append(farms, &fs[0])
	}
	sink := &sinkRecorder{got: make(chan struct{}, 1)}
	m := New(quiet, sink, Options{NetNS: topo.LB.NS})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	m.Sync(farms)
	want := map[string]struct {
		up     bool
		detail string
	}{"up": {true, "SYN-ACK"}, "refused": {false, "connect refused"}, "silent": {false, "timeout after 200ms"}}
	if !halfOpen {
		want["up"] = struct {
			up     bool
			detail string
		}{true, "connected"}
	}
	var bad string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		bad = ""
		for i := range nFarms {
			for be, w := range want {
				if be == "silent" && i >= nSilent {
					continue
				}
				st, ok := m.Status(fmt.Sprintf("f%d", i), be)
				if !ok || !st.Checked || st.Up != w.up || st.Last.Detail != w.detail || st.Checks < 3 {
					bad = fmt.Sprintf("f%d %s: %+v, want up %v after %q", i, be, st, w.up, w.detail)
				}
			}
		}
		if bad == "" {
			break
		}
	}
	if bad != "" {
		t.Fatal(bad)
	}
	m.mu.Lock()
	e, spawned := m.syn, m.spawned
	m.mu.Unlock()
	_, checks, _ := m.Totals()
	if spawned != 0 {
		t.Errorf("%d of %d checks ran in goroutines of their own", spawned, checks)
	}
	if halfOpen {
		if e == nil {
			t.Fatal("no half-open engine: the checks connected")
		}
		e.mu.Lock()
		st := e.stats
		e.mu.Unlock()
		t.Logf("%d checks; engine: %+v", checks, st)
		// Every check went through the engine (none connected): at
		// most the ones in flight now are not counted yet.
		if st.SYNs+uint64(2*nFarms+nSilent) < checks {
			t.Errorf("%d checks but %d SYNs sent by the engine: some connected", checks, st.SYNs)
		}
		if st.SendCalls == 0 || 2*st.SYNs < 3*st.SendCalls {
			t.Errorf("%d SYNs in %d sendmmsg calls: not batched", st.SYNs, st.SendCalls)
		}
	} else if e != nil {
		t.Error("connect checks opened the half-open engine")
	}
	time.Sleep(100 * time.Millisecond)
	if out := testutil.Run(t, topo.Backends[0].Name, "ss", "-Htn", "state", "syn-recv"); out != "" {
		t.Errorf("backend holds half-open connections:\n%s", out)
	}
}
