package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// trafficSetup builds client -> lb -> 3 backends, starts TCP and UDP
// servers on every backend (answering "be<i> <peer>") and an eBPF plane on
// every interface of the LB namespace.
func trafficSetup(t *testing.T) (*testutil.Topology, *Plane, string) {
	t.Helper()
	topo := trafficTopology(t)
	pin := mountBPFFS(t)
	return topo, newPlane(t, topo.LB.NS, pin, nil, 16384), pin
}

// trafficTopology is trafficSetup's topology and servers, without a plane.
func trafficTopology(t *testing.T) *testutil.Topology {
	t.Helper()
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3})
	for i, b := range topo.Backends {
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), fmt.Sprintf("be%d", i))
		testutil.StartUDPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8053), fmt.Sprintf("be%d", i))
	}
	return topo
}

func backendsOf(topo *testutil.Topology, port uint16) []string {
	var out []string
	for _, b := range topo.Backends {
		out = append(out, netip.AddrPortFrom(b.IPv4, port).String())
	}
	return out
}

// ask sends n requests and counts answers per backend; it checks that each
// backend saw the expected source address.
func ask(t *testing.T, n int, askFn func() (string, error), wantFrom netip.Addr) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := range n {
		s, err := askFn()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		name, from, err := testutil.ParseReply(s)
		if err != nil {
			t.Fatal(err)
		}
		if from.Addr() != wantFrom {
			t.Fatalf("request %d: backend %s saw source %s, want %s", i, name, from, wantFrom)
		}
		counts[name]++
	}
	return counts
}

// checkSpread: rr uses one atomic counter per service, so n requests over
// k backends give each n/k exactly; allow +-1 for the odd retransmitted SYN
// that makes a new flow.
func checkSpread(t *testing.T, counts map[string]int, n, k int) {
	t.Helper()
	if len(counts) != k {
		t.Fatalf("answers from %d backends, want %d: %v", len(counts), k, counts)
	}
	for name, c := range counts {
		if d := c - n/k; d < -1 || d > 1 {
			t.Errorf("backend %s answered %d of %d, want %d +-1: %v", name, c, n, n/k, counts)
		}
	}
}

func TestTrafficTCPDNAT(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	f := farm(t, "web", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)...)
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	counts := ask(t, n, func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) }, topo.Client.IPv4)
	checkSpread(t, counts, n, 3)
	st, _ := p.Stats()
	t.Logf("answers %v; counters %v", counts, st)
}

func TestTrafficTCPSNAT(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	vip := netip.AddrPortFrom(testutil.VIP4(2), 80)
	f := farm(t, "web", vip.Addr().String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR, backendsOf(topo, 8080)...)
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	counts := ask(t, n, func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) }, topo.LBBack4)
	checkSpread(t, counts, n, 3)
}

func TestTrafficUDP(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	vip := netip.AddrPortFrom(testutil.VIP4(3), 53)
	dnat := farm(t, "dns", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8053)...)
	snatVIP := netip.AddrPortFrom(testutil.VIP4(4), 53)
	snat := farm(t, "dns-snat", snatVIP.Addr().String(), 53, model.ProtoUDP, model.ModeSNAT, model.SchedRR, backendsOf(topo, 8053)...)
	if err := p.Reconcile(context.Background(), []*model.Farm{dnat, snat}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	counts := ask(t, n, func() (string, error) { return testutil.AskUDP(topo.Client.NS, vip) }, topo.Client.IPv4)
	checkSpread(t, counts, n, 3)
	counts = ask(t, n, func() (string, error) { return testutil.AskUDP(topo.Client.NS, snatVIP) }, topo.LBBack4)
	checkSpread(t, counts, n, 3)
}

func TestTrafficHashAndWeight(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	hashVIP := netip.AddrPortFrom(testutil.VIP4(5), 80)
	hash := farm(t, "hash", hashVIP.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedHash, backendsOf(topo, 8080)...)
	wVIP := netip.AddrPortFrom(testutil.VIP4(6), 80)
	weight := farm(t, "weight", wVIP.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedWeight, backendsOf(topo, 8080)...)
	weight.Backends[0].Weight = 0 // takes no new connections
	weight.Backends[2].State = model.StateOff
	if err := p.Reconcile(context.Background(), []*model.Farm{hash, weight}); err != nil {
		t.Fatal(err)
	}
	// hash over srcip: every connection from one client lands on one backend.
	counts := ask(t, 10, func() (string, error) { return testutil.AskTCP(topo.Client.NS, hashVIP) }, topo.Client.IPv4)
	if len(counts) != 1 {
		t.Errorf("hash srcip spread one client over %v", counts)
	}
	counts = ask(t, 10, func() (string, error) { return testutil.AskTCP(topo.Client.NS, wVIP) }, topo.Client.IPv4)
	if counts["be1"] != 10 {
		t.Errorf("weight: only be1 is serving, got %v", counts)
	}
}

// TestTrafficApplyAndDown changes a farm with Apply while traffic flows:
// new connections follow the new backend set; a farm set down stops
// taking new connections but its established ones keep working.
func TestTrafficApplyAndDown(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	ctx := context.Background()
	vip := netip.AddrPortFrom(testutil.VIP4(7), 80)
	f1 := farm(t, "web", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)...)
	if err := p.Apply(ctx, diffOf(nil, f1)); err != nil {
		t.Fatal(err)
	}
	conn, err := testutil.DialTCP(topo.Client.NS, vip, testutil.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first, err := testutil.ReadLine(conn, testutil.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}

	f2 := farm(t, "web", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)[2])
	if err := p.Apply(ctx, diffOf(f1, f2)); err != nil {
		t.Fatal(err)
	}
	counts := ask(t, 6, func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) }, topo.Client.IPv4)
	if counts["be2"] != 6 {
		t.Errorf("after the update only be2 should answer: %v", counts)
	}
	echo(t, conn, "still there", first)

	f3 := f2.Clone()
	f3.State = model.StateDown
	if err := p.Apply(ctx, diffOf(f2, &f3)); err != nil {
		t.Fatal(err)
	}
	if s, err := testutil.AskTCP(topo.Client.NS, vip); err == nil {
		t.Errorf("farm is down but a new connection got %q", s)
	}
	echo(t, conn, "after down", first)

	if err := p.Apply(ctx, diffOf(&f3, nil)); err != nil {
		t.Fatal(err)
	}
	if n := countMap(t, p); n.services != 0 || n.slots != 0 {
		// Freed lazily: the deleted generations go at the next change.
		if err := p.Reconcile(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if n := countMap(t, p); n.services != 0 || n.slots != 0 || n.backends != 0 {
			t.Errorf("maps not empty after deleting every farm: %+v", n)
		}
	}
}

// echo sends a line on an established connection and expects it back.
func echo(t *testing.T, c interface {
	Write([]byte) (int, error)
}, line, ctxt string) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("write on connection to %s: %v", ctxt, err)
	}
	nc, ok := c.(interface {
		SetReadDeadline(time.Time) error
		Read([]byte) (int, error)
	})
	if !ok {
		t.Fatal("not a connection")
	}
	_ = nc.SetReadDeadline(time.Now().Add(testutil.DefaultTimeout))
	buf := make([]byte, len(line)+1)
	got := 0
	for got < len(buf) {
		n, err := nc.Read(buf[got:])
		if err != nil {
			t.Fatalf("read echo on connection to %s: %v", ctxt, err)
		}
		got += n
	}
	if string(buf[:len(line)]) != line {
		t.Fatalf("echo %q, want %q", buf, line)
	}
}

func diffOf(old, cur *model.Farm) dataplaneDiff {
	return dataplaneDiff{Changes: []dataplaneChange{{Old: old, New: cur}}}
}

type mapCounts struct{ services, slots, backends, ct int }

func countMap(t *testing.T, p *Plane) mapCounts {
	t.Helper()
	var c mapCounts
	count := func(it interface {
		Next(k, v any) bool
		Err() error
	}, k, v any) int {
		n := 0
		for it.Next(k, v) {
			n++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var sk xlbSvcKey
	var sv xlbSvcVal
	c.services = count(p.objs.XlbServices.Iterate(), &sk, &sv)
	var lk xlbSlotKey
	var lv uint32
	c.slots = count(p.objs.XlbSlots.Iterate(), &lk, &lv)
	var bk uint32
	var bv xlbBackend
	c.backends = count(p.objs.XlbBackends.Iterate(), &bk, &bv)
	var ck xlbCtKey
	var cv xlbCtVal
	c.ct = count(p.objs.XlbCt.Iterate(), &ck, &cv)
	return c
}

// TestTrafficRestart: a long-lived connection survives Close (program and
// maps stay pinned and keep working without the daemon) and a new Plane
// adopting the pins.
func TestTrafficRestart(t *testing.T) {
	topo, p, pin := trafficSetup(t)
	ctx := context.Background()
	vip := netip.AddrPortFrom(testutil.VIP4(8), 80)
	f := farm(t, "web", vip.Addr().String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR, backendsOf(topo, 8080)...)
	if err := p.Reconcile(ctx, []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	conn, err := testutil.DialTCP(topo.Client.NS, vip, testutil.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first, err := testutil.ReadLine(conn, testutil.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, conn, "before restart", first)
	before := countMap(t, p)

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	echo(t, conn, "while no daemon runs", first)
	if _, err := testutil.AskTCP(topo.Client.NS, vip); err != nil {
		t.Errorf("new connection while no daemon runs: %v", err)
	}

	p2 := newPlane(t, topo.LB.NS, pin, nil, 16384)
	if err := p2.Reconcile(ctx, []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	after := countMap(t, p2)
	if after.services != before.services || after.slots != before.slots || after.backends != before.backends {
		t.Errorf("restart did not adopt the farm as it was: before %+v after %+v", before, after)
	}
	echo(t, conn, "after restart", first)
	counts := ask(t, 6, func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) }, topo.LBBack4)
	if len(counts) != 3 {
		t.Errorf("after restart: %v", counts)
	}
	// The counters are pinned: the connections before, while no daemon
	// ran, and after are all counted.
	if fc, err := p2.Counters(ctx, f); err != nil || fc.Connections != 8 {
		t.Errorf("counters after restart: %+v, %v; want 8 connections", fc, err)
	}
}

// TestTrafficSchedulers: symhash and maglev spread one client's
// connections (their keys include the port); persistence srcip keeps them
// on one backend.
func TestTrafficSchedulers(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	bes := backendsOf(topo, 8080)
	vips := map[string]netip.AddrPort{}
	var farms []*model.Farm
	for i, c := range []struct {
		name  string
		sched model.Scheduler
		param model.HashKey
		pers  model.HashKey
	}{
		{"sym", model.SchedSymhash, model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort, 0},
		{"mag", model.SchedMaglev, 0, 0},
		{"persist", model.SchedRR, 0, model.KeySrcIP},
	} {
		vip := netip.AddrPortFrom(testutil.VIP4(30+i), 80)
		f := farm(t, c.name, vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, c.sched, bes...)
		if c.param != 0 {
			f.SchedParam = c.param
		}
		f.Persistence = c.pers
		if err := check(f); err != nil {
			t.Fatal(err)
		}
		vips[c.name] = vip
		farms = append(farms, f)
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"sym": 3, "mag": 3, "persist": 1} {
		vip := vips[name]
		counts := ask(t, 30, func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) }, topo.Client.IPv4)
		if len(counts) != want {
			t.Errorf("%s: 30 connections from one client reached %v, want %d backends", name, counts, want)
		}
	}
}

// TestTrafficICMPPortUnreachable: a backend's ICMP port unreachable about a
// NATed UDP flow reaches the client translated, so the client's connected
// socket sees "connection refused" (untranslated, it would quote the
// backend's address and the client would wait for a timeout).
func TestTrafficICMPPortUnreachable(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	var farms []*model.Farm
	vips := map[model.Mode]netip.AddrPort{}
	for i, mode := range []model.Mode{model.ModeDNAT, model.ModeSNAT} {
		vip := netip.AddrPortFrom(testutil.VIP4(40+i), 53)
		vips[mode] = vip
		farms = append(farms, farm(t, "closed-"+mode.String(), vip.Addr().String(), 53, model.ProtoUDP, mode, model.SchedRR, backendsOf(topo, 8099)...))
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	for mode, vip := range vips {
		err := testutil.Do(topo.Client.NS, func() error {
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(vip))
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Write([]byte("hello\n")); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 64))
			return err
		})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			st, _ := p.Stats()
			t.Errorf("%s: read from a VIP whose backends have no server: %v, want connection refused (counters %v)", mode, err, st)
		}
	}
	if st, _ := p.Stats(); st["icmp_nat"] < 2 {
		t.Errorf("icmp_nat = %d, want 2", st["icmp_nat"])
	}
}

// TestTrafficDSR: direct server return. The backends hold the VIP on
// loopback and answer the client themselves (their route to the client
// passes the LB's stack, not the program); the LB only rewrites MACs.
func TestTrafficDSR(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3})
	vip := netip.AddrPortFrom(testutil.VIP4(60), 80)
	for i, b := range topo.Backends {
		err := testutil.Do(b.NS, func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: vip.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}})
		})
		if err != nil {
			t.Fatalf("VIP on the loopback of backend %d: %v", i, err)
		}
		testutil.StartTCPServer(t, b.NS, vip, fmt.Sprintf("be%d", i))
	}
	p := newPlane(t, topo.LB.NS, mountBPFFS(t), nil, 16384)
	var bes []string
	for _, b := range topo.Backends {
		bes = append(bes, netip.AddrPortFrom(b.IPv4, 0).String())
	}
	f := farm(t, "dsr", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDSR, model.SchedRR, bes...)
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	counts := ask(t, n, func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) }, topo.Client.IPv4)
	checkSpread(t, counts, n, 3)
	if st, _ := p.Stats(); st["ct_reply"] != 0 {
		t.Errorf("dsr replies went through the program: %v", st)
	}
}

// TestTrafficStateless: stlsdnat with real TCP (hash over the client's
// address and port: each connection stays on one backend) and UDP (rr per
// packet), no conntrack entries made.
func TestTrafficStateless(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	tcpVIP := netip.AddrPortFrom(testutil.VIP4(70), 80)
	udpVIP := netip.AddrPortFrom(testutil.VIP4(71), 53)
	tcpFarm := farm(t, "stl-tcp", tcpVIP.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedHash, backendsOf(topo, 8080)...)
	tcpFarm.SchedParam = model.KeySrcIP | model.KeySrcPort
	tcpFarm.Mode = model.ModeStlsDNAT
	udpFarm := farm(t, "stl-udp", udpVIP.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8053)...)
	udpFarm.Mode = model.ModeStlsDNAT
	for _, f := range []*model.Farm{tcpFarm, udpFarm} {
		if err := check(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Reconcile(context.Background(), []*model.Farm{tcpFarm, udpFarm}); err != nil {
		t.Fatal(err)
	}
	counts := ask(t, 30, func() (string, error) { return testutil.AskTCP(topo.Client.NS, tcpVIP) }, topo.Client.IPv4)
	if len(counts) != 3 {
		t.Errorf("30 stlsdnat connections reached %v, want all 3 backends", counts)
	}
	counts = ask(t, 30, func() (string, error) { return testutil.AskUDP(topo.Client.NS, udpVIP) }, topo.Client.IPv4)
	checkSpread(t, counts, 30, 3)
	if n := countMap(t, p).ct; n != 0 {
		t.Errorf("stlsdnat traffic made %d conntrack entries", n)
	}
}

// TestTrafficBackendDownExpiresFlows: tracked flows of a backend that goes
// down expire (IPVS expire_nodest_conn): a UDP socket's next datagram is
// scheduled to another backend and an established TCP connection is cut;
// a drained backend (weight 0) keeps its connection, and the flows of
// backends still up survive the changes.
func TestTrafficBackendDownExpiresFlows(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	ctx := context.Background()
	uvip := netip.AddrPortFrom(testutil.VIP4(80), 53)
	tvip := netip.AddrPortFrom(testutil.VIP4(81), 80)
	uf := farm(t, "udp", uvip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8053)...)
	tf := farm(t, "tcp", tvip.Addr().String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR, backendsOf(topo, 8080)...)
	if err := p.Apply(ctx, dataplaneDiff{Changes: []dataplaneChange{{New: uf}, {New: tf}}}); err != nil {
		t.Fatal(err)
	}
	index := func(name string) int {
		var i int
		if _, err := fmt.Sscanf(name, "be%d", &i); err != nil {
			t.Fatalf("answer from %q", name)
		}
		return i
	}

	// UDP: one socket (one flow) keeps its backend until it goes down.
	var uc *net.UDPConn
	if err := testutil.Do(topo.Client.NS, func() (err error) {
		uc, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(uvip))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	askUDP := func() string {
		t.Helper()
		_ = uc.SetDeadline(time.Now().Add(testutil.DefaultTimeout))
		if _, err := uc.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		n, err := uc.Read(buf)
		if err != nil {
			t.Fatalf("udp flow: %v", err)
		}
		name, _, err := testutil.ParseReply(string(buf[:n]))
		if err != nil {
			t.Fatal(err)
		}
		return name
	}
	first := askUDP()
	if again := askUDP(); again != first {
		t.Fatalf("one udp flow answered by %s, then %s", first, again)
	}

	// TCP: three connections, one per backend (rr).
	conns := map[int]net.Conn{}
	for range 3 {
		c, err := testutil.DialTCP(topo.Client.NS, tvip, testutil.DefaultTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		line, err := testutil.ReadLine(c, testutil.DefaultTimeout)
		if err != nil {
			t.Fatal(err)
		}
		name, _, err := testutil.ParseReply(line)
		if err != nil {
			t.Fatal(err)
		}
		conns[index(name)] = c
	}
	if len(conns) != 3 {
		t.Fatalf("3 connections reached %d backends", len(conns))
	}

	// The UDP flow's backend goes down; TCP: be0 down, be1 drained.
	uf2 := uf.Clone()
	uf2.Backends[index(first)].State = model.StateDown
	tf2 := tf.Clone()
	tf2.Backends[0].State = model.StateDown
	tf2.Backends[1].Weight = 0
	if err := p.Apply(ctx, dataplaneDiff{Changes: []dataplaneChange{{Old: uf, New: &uf2}, {Old: tf, New: &tf2}}}); err != nil {
		t.Fatal(err)
	}
	if now := askUDP(); now == first {
		t.Errorf("udp flow still answered by %s, which is down", now)
	}
	echo(t, conns[1], "drained", "be1 (drained)")
	echo(t, conns[2], "up", "be2")
	if _, err := conns[0].Write([]byte("down\n")); err != nil {
		t.Fatal(err)
	}
	_ = conns[0].SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := conns[0].Read(make([]byte, 16)); err == nil {
		t.Errorf("connection to be0 (down) still answers (%d bytes)", n)
	}
	if st, _ := p.Stats(); st["ct_nodest"] < 2 {
		t.Errorf("ct_nodest = %d, want the udp flow and the tcp connection", st["ct_nodest"])
	}

	// Unrelated changes (twice, so the first generation is freed) keep the
	// flows of the backends still up.
	tf3 := tf2.Clone()
	tf3.Backends[2].Weight = 3
	tf4 := tf3.Clone()
	tf4.Backends[2].Weight = 4
	for _, d := range []dataplaneDiff{diffOf(&tf2, &tf3), diffOf(&tf3, &tf4)} {
		if err := p.Apply(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	echo(t, conns[1], "drained again", "be1 (drained)")
	echo(t, conns[2], "up again", "be2")

	// A restarted daemon (Reconcile) writes these farms anew, sharing the
	// backend entries in the maps: flows keep following their backend's
	// state, so be2 going down afterwards still cuts its connection.
	if err := p.Reconcile(ctx, []*model.Farm{&uf2, &tf4}); err != nil {
		t.Fatal(err)
	}
	echo(t, conns[1], "after reconcile", "be1 (drained)")
	echo(t, conns[2], "after reconcile", "be2")
	tf5 := tf4.Clone()
	tf5.Backends[2].State = model.StateDown
	if err := p.Apply(ctx, diffOf(&tf4, &tf5)); err != nil {
		t.Fatal(err)
	}
	if _, err := conns[2].Write([]byte("down\n")); err != nil {
		t.Fatal(err)
	}
	_ = conns[2].SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := conns[2].Read(make([]byte, 16)); err == nil {
		t.Errorf("after reconcile: connection to be2 (down) still answers (%d bytes)", n)
	}
}
