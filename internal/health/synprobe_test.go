package health

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netns"
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
	// The first SYN to a backend goes through the stack, which resolves
	// its neighbour; the next ones go as frames (synbypass.go).
	if r := run(8080, 2*time.Second); !r.OK || r.Detail != "SYN-ACK" {
		t.Errorf("listening port, first check: %+v", r)
	}
	time.Sleep(50 * time.Millisecond)
	for range 3 {
		if r := run(8080, 2*time.Second); !r.OK || r.Detail != "SYN-ACK" {
			t.Errorf("listening port: %+v", r)
		}
	}
	if r := run(8099, 2*time.Second); r.OK || r.Detail != "connect refused" {
		t.Errorf("closed port: %+v", r)
	}
	// While the SYN to the blackholed port waits, SYN-ACKs from there
	// to each of our ports with an acknowledgement number not a check's
	// (forged) reach the engine and are ignored: the check times out.
	e := d.syn
	e.mu.Lock()
	before := e.stats.RingReplies
	e.mu.Unlock()
	stop := make(chan struct{})
	forged := make(chan error, 1)
	go func() {
		forged <- forgeSynAcks(be.NS, netip.AddrPortFrom(be.IPv4, 8098), topo.LBBack4, e.ports[:], stop)
	}()
	r := run(8098, 300*time.Millisecond)
	close(stop)
	if err := <-forged; err != nil {
		t.Fatal(err)
	}
	if r.OK || r.Detail != "timeout after 300ms" {
		t.Errorf("blackholed port, forged SYN-ACKs: %+v", r)
	}
	e.mu.Lock()
	if got := e.stats.RingReplies - before; got < synPorts {
		t.Errorf("%d forged SYN-ACKs reached the engine, want at least %d", got, synPorts)
	}
	e.mu.Unlock()
	if d.syn == nil {
		t.Fatal("no half-open prober was opened: the checks connected")
	}
	requireBypass(t, d.syn, 4)
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
// check is answered by the engine but those that found its 64 source ports
// busy towards their backend (they connect, without a goroutine: a CI run
// on a loaded machine had 133 such); the backends keep no half-open
// connection.
func TestHalfOpenBatched(t *testing.T) { batchedChecks(t, true) }

// Plain connect checks (half-open off) of a monitor run without a
// goroutine each (connprobe.go), with the same outcomes: connected,
// connect refused, timeout after 200ms.
func TestConnectChecksBatched(t *testing.T) { batchedChecks(t, false) }

func batchedChecks(t *testing.T, halfOpen bool) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3})
	// Four ports of each backend, 25 farms' checks each, so that the
	// engine's 64 ports towards one are seldom all busy.
	const nPorts = 4
	for p := range nPorts {
		testutil.StartTCPServer(t, topo.Backends[0].NS, netip.AddrPortFrom(topo.Backends[0].IPv4, uint16(8080+p)), "be0")
	}
	testutil.Run(t, topo.Backends[2].Name, "nft", "add table inet bh; add chain inet bh in { type filter hook input priority 0 ; } ; add rule inet bh in tcp dport 8080-8083 drop")
	// Silent ones in 20 farms only: each keeps a SYN in flight most of
	// the time, and one backend address and port takes at most synPorts.
	const nFarms, nSilent = 100, 20
	onOff := map[bool]string{true: "on", false: "off"}
	var farms []*model.Farm
	for i := range nFarms {
		silent := ""
		if i < nSilent {
			silent = fmt.Sprintf(`,{"name":"silent","ip-addr":"%s","port":"%d"}`, topo.Backends[2].IPv4, 8080+i%nPorts)
		}
		js := fmt.Sprintf(`{"name":"f%d","virtual-addr":"10.99.%d.%d","virtual-ports":"80",
			"check":{"type":"tcp","half-open":%q,"inter":"100ms","timeout":"200ms","rise":"2","fall":"2"},
			"backends":[{"name":"up","ip-addr":"%s","port":"%d"},{"name":"refused","ip-addr":"%s","port":"%d"}%s]}`,
			i, i/200, i%200+1, onOff[halfOpen], topo.Backends[0].IPv4, 8080+i%nPorts, topo.Backends[1].IPv4, 8080+i%nPorts, silent)
		fs, err := model.DecodeFarms([]byte(js), func(string) (*model.Farm, bool) { return nil, false })
		if err != nil {
			t.Fatal(err)
		}
		farms = append(farms, &fs[0])
	}
	m := runMonitor(t, Options{NetNS: topo.LB.NS})
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
		if m.syn != nil {
			m.syn.mu.Lock()
			t.Logf("engine: %+v", m.syn.stats)
			m.syn.mu.Unlock()
		}
		t.Fatal(bad)
	}
	m.mu.Lock()
	e, spawned, halfConns := m.syn, m.spawned, m.halfConns
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
		t.Logf("%d checks (%d connected, the engine's ports busy); engine: %+v", checks, halfConns, st)
		// Every check went through the engine but those that found
		// every port busy: at most the ones in flight now are not
		// counted yet.
		if st.SYNs+halfConns+uint64(2*nFarms+nSilent) < checks {
			t.Errorf("%d checks but %d SYNs sent by the engine and %d connects: others connected", checks, st.SYNs, halfConns)
		}
		if st.SendCalls+st.FrameCalls == 0 || 2*st.SYNs < 3*(st.SendCalls+st.FrameCalls) {
			t.Errorf("%d SYNs in %d+%d sendmmsg calls: not batched", st.SYNs, st.SendCalls, st.FrameCalls)
		}
		// The SYNs went as frames and the answers came from the
		// receive program, but for the silent backend's checks after
		// each timeout (through the stack, see synbypass.go) and the
		// first to each backend (the neighbour unknown yet).
		requireBypass(t, e, checks/2)
	} else if e != nil {
		t.Error("connect checks opened the half-open engine")
	}
	time.Sleep(100 * time.Millisecond)
	if out := testutil.Run(t, topo.Backends[0].Name, "ss", "-Htn", "state", "syn-recv"); out != "" {
		t.Errorf("backend holds half-open connections:\n%s", out)
	}
}

// requireBypass fails unless the engine ran around the IP stack (frames
// out, answers from the receive program on br0) for at least min checks,
// and the raw socket read no answer.
func requireBypass(t *testing.T, e *synEngine, min uint64) {
	t.Helper()
	if e.byp == nil {
		t.Fatal("half-open checks ran on the raw socket engine, not around the IP stack")
	}
	e.mu.Lock()
	st := e.stats
	e.mu.Unlock()
	var ps [3][]uint64
	for k := range uint32(3) {
		_ = e.byp.objs.XlbSynStats.Lookup(k, &ps[k])
	}
	t.Logf("engine: %+v, receive program on %d interfaces, its counters (taken, lost, RSTs sent per CPU) %v", st, e.byp.interfaces(), ps)
	if e.byp.interfaces() != 1 {
		t.Errorf("receive program on %d interfaces, want 1 (br0)", e.byp.interfaces())
	}
	if st.Frames < min || st.RingReplies < min/2 || st.Replies != 0 {
		t.Errorf("%d frames sent, %d answers from the ring, %d from the raw socket: want at least %d frames, %d from the ring, none raw", st.Frames, st.RingReplies, st.Replies, min, min/2)
	}
}

// forgeSynAcks sends, from namespace ns, a SYN-ACK from src to each port
// of dst in ports with a random acknowledgement number every 20ms until
// stop.
func forgeSynAcks(ns netns.NsHandle, src netip.AddrPort, dst netip.Addr, ports []uint16, stop chan struct{}) error {
	return inNS(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for {
			for _, p := range ports {
				var seg [24]byte
				synSegment(&seg, src.Addr(), netip.AddrPortFrom(dst, p), src.Port(), rand.Uint32())
				// A SYN-ACK acking a random number, checksummed
				// again.
				binary.BigEndian.PutUint32(seg[8:], rand.Uint32())
				seg[13] = tcpSYN | tcpACK
				seg[16], seg[17] = 0, 0
				binary.BigEndian.PutUint16(seg[16:], tcpChecksum(src.Addr(), dst, seg[:]))
				if err := unix.Sendto(fd, seg[:], 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
					return fmt.Errorf("forge a SYN-ACK: %w", err)
				}
			}
			select {
			case <-stop:
				return nil
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
}

func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	s, d := src.As4(), dst.As4()
	sum := (uint32(s[0])<<8 | uint32(s[1])) + (uint32(s[2])<<8 | uint32(s[3])) +
		(uint32(d[0])<<8 | uint32(d[1])) + (uint32(d[2])<<8 | uint32(d[3])) +
		unix.IPPROTO_TCP + uint32(len(seg))
	for i := 0; i+1 < len(seg); i += 2 {
		sum += uint32(seg[i])<<8 | uint32(seg[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// More half-open checks of one backend in flight than the engine has
// source ports (70 farms, one silent backend, a 2 s timeout: all 70 in
// flight within the first interval): the 64 go through the engine, the
// others connect through the connect engine, without a goroutine each, and
// all of them time out.
func TestHalfOpenBusyConnects(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 1})
	be := topo.Backends[0]
	testutil.Run(t, be.Name, "nft", "add table inet bh; add chain inet bh in { type filter hook input priority 0 ; } ; add rule inet bh in tcp dport 8080 drop")
	const n = synPorts + 6
	var farms []*model.Farm
	for i := range n {
		fs, err := model.DecodeFarms([]byte(fmt.Sprintf(`{"name":"f%d","virtual-addr":"10.99.0.%d","virtual-ports":"80",
			"check":{"type":"tcp","half-open":"on","inter":"100ms","timeout":"2s","fall":"1"},
			"backends":[{"name":"b","ip-addr":"%s","port":"8080"}]}`, i, i+1, be.IPv4)), func(string) (*model.Farm, bool) { return nil, false })
		if err != nil {
			t.Fatal(err)
		}
		farms = append(farms, &fs[0])
	}
	m := runMonitor(t, Options{NetNS: topo.LB.NS})
	m.Sync(farms)
	var bad string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		bad = ""
		for i := range n {
			if st, _ := m.Status(fmt.Sprintf("f%d", i), "b"); st.Checks < 1 || st.Up || st.Last.Detail != "timeout after 2s" {
				bad = fmt.Sprintf("f%d: %+v, want down after a timeout", i, st)
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
	spawned, halfConns := m.spawned, m.halfConns
	m.mu.Unlock()
	if spawned != 0 || halfConns < n-synPorts {
		t.Errorf("%d checks in goroutines of their own, %d connected: want none, and at least %d connected", spawned, halfConns, n-synPorts)
	}
}

// A monitor synced with half-open checks and never run holds nothing of
// the half-open engine (its sockets, its receive program and ring): the
// engine opens when the monitor runs, and closes when Run returns.
func TestHalfOpenEngineOnlyWhileRunning(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 1})
	be := topo.Backends[0]
	testutil.StartTCPServer(t, be.NS, netip.AddrPortFrom(be.IPv4, 8080), "be0")
	fs, err := model.DecodeFarms([]byte(fmt.Sprintf(`{"name":"f","virtual-addr":"10.99.0.1","virtual-ports":"80",
		"check":{"type":"tcp","half-open":"on","inter":"100ms","timeout":"500ms"},
		"backends":[{"name":"b","ip-addr":"%s","port":"8080"}]}`, be.IPv4)), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	m := New(quiet, &sinkRecorder{got: make(chan struct{}, 1)}, Options{NetNS: topo.LB.NS})
	m.Sync([]*model.Farm{&fs[0]})
	if n := fds(); n != before || m.syn != nil {
		t.Fatalf("synced, not run: %d more descriptors, engine %v", n-before, m.syn != nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	ok := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !ok; time.Sleep(50 * time.Millisecond) {
		st, _ := m.Status("f", "b")
		ok = st.Checks >= 2 && st.Up && st.Last.Detail == "SYN-ACK"
	}
	m.mu.Lock()
	opened := m.syn != nil
	m.mu.Unlock()
	cancel()
	<-done
	if !ok || !opened {
		t.Fatalf("running: checked through the engine %v, engine opened %v", ok, opened)
	}
	if n := fds(); n != before {
		t.Errorf("Run returned: %d descriptors more than before", n-before)
	}
}

// A monitor's half-open checks on the raw socket's engine, the one an
// interface or namespace where the receive program cannot run gets (here
// asked for): the SYNs go through the LB's stack and the answers are read
// from the raw socket; a backend that comes to refuse is taken down
// ("connect refused"), one that goes silent too ("timeout after 200ms").
func TestHalfOpenRawEngine(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 2})
	for i, be := range topo.Backends {
		testutil.StartTCPServer(t, be.NS, netip.AddrPortFrom(be.IPv4, 8080), fmt.Sprint("be", i))
	}
	fs, err := model.DecodeFarms([]byte(fmt.Sprintf(`{"name":"f","virtual-addr":"10.99.0.1","virtual-ports":"80",
		"check":{"type":"tcp","half-open":"on","inter":"100ms","timeout":"200ms","rise":"1","fall":"2"},
		"backends":[{"name":"a","ip-addr":"%s","port":"8080"},{"name":"b","ip-addr":"%s","port":"8080"}]}`,
		topo.Backends[0].IPv4, topo.Backends[1].IPv4)), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	m := runMonitor(t, Options{NetNS: topo.LB.NS, HalfOpenRaw: true})
	m.Sync([]*model.Farm{&fs[0]})
	wait := func(be string, up bool, detail string) {
		t.Helper()
		var st Status
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if st, _ = m.Status("f", be); st.Checked && st.Up == up && st.Last.Detail == detail {
				return
			}
		}
		t.Fatalf("backend %s: %+v, want up %v after %q", be, st, up, detail)
	}
	wait("a", true, "SYN-ACK")
	wait("b", true, "SYN-ACK")
	testutil.Run(t, topo.Backends[0].Name, "nft", "add table inet bh; add chain inet bh in { type filter hook input priority 0 ; } ; add rule inet bh in tcp dport 8080 reject with tcp reset")
	testutil.Run(t, topo.Backends[1].Name, "nft", "add table inet bh; add chain inet bh in { type filter hook input priority 0 ; } ; add rule inet bh in tcp dport 8080 drop")
	wait("a", false, "connect refused")
	wait("b", false, "timeout after 200ms")
	m.mu.Lock()
	e, spawned := m.syn, m.spawned
	m.mu.Unlock()
	if e == nil {
		t.Fatal("no half-open engine: the checks connected")
	}
	e.mu.Lock()
	st := e.stats
	e.mu.Unlock()
	t.Logf("engine: %+v", st)
	if e.byp != nil || st.Frames != 0 || st.RingReplies != 0 {
		t.Errorf("the bypass ran (%d frames, %d answers from its ring)", st.Frames, st.RingReplies)
	}
	if st.Replies == 0 || st.SendCalls == 0 || spawned != 0 {
		t.Errorf("%d answers read from the raw socket, %d sendmmsg calls, %d checks in goroutines: want answers through the raw socket, batched", st.Replies, st.SendCalls, spawned)
	}
}

// runMonitor makes a monitor with opts and runs it until the test ends.
func runMonitor(t *testing.T, opts Options) *Monitor {
	m := New(quiet, &sinkRecorder{got: make(chan struct{}, 1)}, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return m
}
