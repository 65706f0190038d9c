package nft

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestTCPAndUDP sends TCP and UDP through IPv4 VIPs in snat and dnat mode
// and checks which backend answered and which source address it saw.
func TestTCPAndUDP(t *testing.T) {
	e := newEnv(t, 2, false)
	t.Parallel()
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	snatVIP, dnatVIP := testutil.VIP4(1), testutil.VIP4(2)
	tcp := e.farm("tcp", snatVIP, 80, model.ProtoTCP, 8080)
	udp := e.farm("udp", snatVIP, 53, model.ProtoUDP, 8080)
	dn := e.farm("dnat.tcp-1", dnatVIP, 80, model.ProtoTCP, 8080)
	dn.Mode = model.ModeDNAT
	dnu := e.farm("dnat.udp", dnatVIP, 53, model.ProtoUDP, 8080)
	dnu.Mode = model.ModeDNAT
	e.put(t, prev, tcp, udp, dn, dnu)

	seen := map[string]bool{}
	for range 4 {
		name, from := e.askTCP(t, netip.AddrPortFrom(snatVIP, 80))
		seen[name] = true
		if from.Addr() != e.LBBack4 {
			t.Errorf("snat tcp: backend saw %s, want the LB's %s", from, e.LBBack4)
		}
		name, from = e.askUDP(t, netip.AddrPortFrom(snatVIP, 53))
		seen[name] = true
		if from.Addr() != e.LBBack4 {
			t.Errorf("snat udp: backend saw %s, want the LB's %s", from, e.LBBack4)
		}
		_, from = e.askTCP(t, netip.AddrPortFrom(dnatVIP, 80))
		if from.Addr() != e.Client.IPv4 {
			t.Errorf("dnat tcp: backend saw %s, want the client's %s", from, e.Client.IPv4)
		}
		_, from = e.askUDP(t, netip.AddrPortFrom(dnatVIP, 53))
		if from.Addr() != e.Client.IPv4 {
			t.Errorf("dnat udp: backend saw %s, want the client's %s", from, e.Client.IPv4)
		}
	}
	if !seen["b0"] || !seen["b1"] {
		t.Errorf("answers came from %v, want both backends", seen)
	}
	// A port the farms do not cover is not handled (the LB has no route
	// to the VIP, so the connection fails).
	if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(snatVIP, 81)); err == nil {
		t.Errorf("port 81 answered, want no service")
	}
}

// TestLocalClient reaches a VIP from the LB's own namespace (nat output).
func TestLocalClient(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	e.put(t, map[string]*model.Farm{}, e.farm("local", vip, 80, model.ProtoTCP, 8080))
	// A local socket needs a route to the VIP before nat output runs
	// (real LBs have a default route).
	testutil.Run(t, e.LB.Name, "ip", "route", "add", testutil.VIPNet4.String(), "dev", "br0")
	got, err := testutil.AskTCP(e.LB.NS, netip.AddrPortFrom(vip, 80))
	if err != nil {
		t.Fatalf("from the LB: %v", err)
	}
	if name, _, _ := testutil.ParseReply(got); name != "b0" {
		t.Fatalf("reply %q", got)
	}
}

// count asks n times (new connection each time) and counts answers per backend.
func (e *env) count(t *testing.T, n int, ask func() string) map[string]int {
	t.Helper()
	c := map[string]int{}
	for range n {
		c[ask()]++
	}
	return c
}

// TestRRSpread: 300 TCP connections over 3 backends; each gets 100 ± 10.
// numgen inc is exact when nothing else uses the farm, so the tolerance
// only absorbs retransmitted SYNs.
func TestRRSpread(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	e.put(t, map[string]*model.Farm{}, e.farm("rr", vip, 80, model.ProtoTCP, 8080))
	c := e.count(t, 300, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n })
	for _, b := range []string{"b0", "b1", "b2"} {
		if c[b] < 90 || c[b] > 110 {
			t.Errorf("rr: %s got %d of 300, want 100 ± 10 (all: %v)", b, c[b], c)
		}
	}
}

// TestWeightSpread: weights 1, 2, 3 over 600 UDP flows (numgen random):
// expected 100, 200, 300; each within ± 45 (about 4.5 standard deviations
// of the binomial count, so a false failure is about 1 in 100,000).
func TestWeightSpread(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	f := e.farm("weight", vip, 53, model.ProtoUDP, 8080)
	f.Scheduler = model.SchedWeight
	for i := range f.Backends {
		f.Backends[i].Weight = uint32(i + 1)
	}
	e.put(t, map[string]*model.Farm{}, f)
	c := e.count(t, 600, func() string { n, _ := e.askUDP(t, netip.AddrPortFrom(vip, 53)); return n })
	for i, b := range []string{"b0", "b1", "b2"} {
		want := 100 * (i + 1)
		if c[b] < want-45 || c[b] > want+45 {
			t.Errorf("weight: %s got %d of 600, want %d ± 45 (all: %v)", b, c[b], want, c)
		}
	}
}

// flushConntrack forgets every connection in the LB, so the next packet of
// a flow is scheduled again (hash tests must not be fooled by conntrack).
func (e *env) flushConntrack(t *testing.T) {
	t.Helper()
	_, _ = testutil.RunErr(e.LB.Name, "conntrack", "-F")
}

// TestHash checks stickiness: sched-param srcip sends every source port of
// a client to one backend and spreads clients; srcip srcport sends the same
// address and port to the same backend every time, also after conntrack
// forgot the flow.
func TestHash(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	f := e.farm("hash-ip", vip, 53, model.ProtoUDP, 8080)
	f.Scheduler = model.SchedHash
	f.SchedParam = model.KeySrcIP
	g := e.farm("hash-ipport", vip, 54, model.ProtoUDP, 8080)
	g.Scheduler = model.SchedHash
	g.SchedParam = model.KeySrcIP | model.KeySrcPort
	e.put(t, map[string]*model.Farm{}, f, g)

	clients := []netip.Addr{e.Client.IPv4}
	for i := range 15 {
		a := netip.AddrFrom4([4]byte{10, 100, 0, byte(100 + i)})
		e.Client.AddAddr(t, netip.PrefixFrom(a, 24))
		clients = append(clients, a)
	}
	ask := func(local netip.AddrPort, port uint16) string {
		got, err := testutil.AskUDPFrom(e.Client.NS, local, netip.AddrPortFrom(vip, port))
		if err != nil {
			t.Fatalf("udp from %s: %v", local, err)
		}
		n, _, _ := testutil.ParseReply(got)
		return n
	}
	// srcip: every source port of one client lands on one backend.
	spread := map[string]bool{}
	for _, c := range clients {
		first := ""
		for range 5 {
			n := ask(netip.AddrPortFrom(c, 0), 53)
			if first == "" {
				first = n
			} else if n != first {
				t.Fatalf("hash srcip: client %s went to %s and %s", c, first, n)
			}
		}
		spread[first] = true
	}
	if len(spread) < 2 {
		t.Errorf("hash srcip: %d clients all went to %v", len(clients), spread)
	}
	// srcip srcport: the same address and port always land on the same
	// backend, even when conntrack has forgotten the flow.
	spread = map[string]bool{}
	for i := range 12 {
		local := netip.AddrPortFrom(e.Client.IPv4, uint16(40000+i))
		first := ask(local, 54)
		e.flushConntrack(t)
		if again := ask(local, 54); again != first {
			t.Fatalf("hash srcip srcport: %s went to %s then %s", local, first, again)
		}
		spread[first] = true
	}
	if len(spread) < 2 {
		t.Errorf("hash srcip srcport: 12 source ports all went to %v", spread)
	}
}

// TestDrainAndStates: new connections avoid backends that are down, off or
// at weight 0, while a connection established to the weight-0 backend
// keeps working (drain).
func TestDrainAndStates(t *testing.T) {
	e := newEnv(t, 4, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	prev := map[string]*model.Farm{}
	f := e.farm("drain", vip, 80, model.ProtoTCP, 8080)
	e.put(t, prev, f)

	// Hold one connection to b0.
	var held net.Conn
	for range 8 {
		c, err := testutil.DialTCP(e.Client.NS, netip.AddrPortFrom(vip, 80), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		line, err := testutil.ReadLine(c, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if n, _, _ := testutil.ParseReply(line); n == "b0" {
			held = c
			break
		}
		c.Close()
	}
	if held == nil {
		t.Fatal("no connection reached b0")
	}
	defer held.Close()

	f = f.Clone()
	f.Backends[0].Weight = 0
	f.Backends[1].State = model.StateDown
	f.Backends[2].State = model.StateOff
	e.put(t, prev, f)
	c := e.count(t, 30, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n })
	if c["b3"] != 30 {
		t.Errorf("new connections went to %v, want all 30 to b3", c)
	}
	if _, err := io.WriteString(held, "still there\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := testutil.ReadLine(held, time.Second); err != nil || line != "still there" {
		t.Fatalf("drained connection: %q, %v", line, err)
	}
}

// TestPriorityGroups: backends above the farm's priority level stand by;
// as backends of level 1 go down the level rises (nftlb's rule,
// model.Farm.PriorityLevel) and the spare takes traffic; with no serving
// backend at all new connections are refused.
func TestPriorityGroups(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	prev := map[string]*model.Farm{}
	f := e.farm("prio", vip, 80, model.ProtoTCP, 8080)
	f.Backends[2].Priority = 2
	e.put(t, prev, f)
	c := e.count(t, 20, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n })
	if c["b0"] != 10 || c["b1"] != 10 {
		t.Errorf("priority 1 level: got %v, want 10 each on b0 and b1", c)
	}
	f = f.Clone()
	f.Backends[0].State = model.StateDown
	e.put(t, prev, f)
	c = e.count(t, 20, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n })
	if c["b1"] != 10 || c["b2"] != 10 {
		t.Errorf("one of level 1 down, level 2: got %v, want 10 each on b1 and the spare b2", c)
	}
	f = f.Clone()
	f.Backends[1].State = model.StateDown
	e.put(t, prev, f)
	c = e.count(t, 10, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n })
	if c["b2"] != 10 {
		t.Errorf("priority 2 level: got %v, want all on b2", c)
	}
	f = f.Clone()
	f.Backends[2].State = model.StateDown
	e.put(t, prev, f)
	// No serving backend: the client is refused at once (a TCP reset, as
	// IPVS answers), not left to time out.
	conn, err := testutil.DialTCP(e.Client.NS, netip.AddrPortFrom(vip, 80), 2*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("no serving backend: connection accepted, want it refused")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("no serving backend: %v, want connection refused (a reset)", err)
	}
	if out := e.nft(t, "list", "chain", "inet", "xlb", chainName("prio")); !strings.Contains(out, "reject with tcp reset") {
		t.Errorf("farm chain without backends:\n%s", out)
	}
}

// TestIPv6: an IPv6 farm in snat and dnat mode over TCP and UDP.
func TestIPv6(t *testing.T) {
	e := newEnv(t, 2, true)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP6(1)
	prev := map[string]*model.Farm{}
	sn := e.farm("v6-snat", vip, 80, model.ProtoTCP, 8080)
	dn := e.farm("v6-dnat", vip, 53, model.ProtoUDP, 8080)
	dn.Mode = model.ModeDNAT
	e.put(t, prev, sn, dn)
	seen := map[string]bool{}
	for range 4 {
		n, from := e.askTCP(t, netip.AddrPortFrom(vip, 80))
		seen[n] = true
		if from.Addr() != e.LBBack6 {
			t.Errorf("v6 snat: backend saw %s, want %s", from, e.LBBack6)
		}
		n, from = e.askUDP(t, netip.AddrPortFrom(vip, 53))
		seen[n] = true
		if from.Addr() != e.Client.IPv6 {
			t.Errorf("v6 dnat: backend saw %s, want %s", from, e.Client.IPv6)
		}
	}
	if len(seen) != 2 {
		t.Errorf("answers from %v, want both backends", seen)
	}
}

// TestPorts: several ports and a range with backend port 0 (the client's
// port is kept); a farm without ports covers every port; protocol all
// covers TCP and UDP; snat to a fixed source-addr.
func TestPorts(t *testing.T) {
	e := newEnv(t, 2, false)
	t.Parallel()
	for _, port := range []uint16{80, 443, 1000, 1005, 1010, 5555} {
		e.startServers(t, port)
	}
	prev := map[string]*model.Farm{}
	multi := e.farm("multi", testutil.VIP4(1), 0, model.ProtoTCP, 0)
	multi.VirtualPorts = []model.PortRange{{First: 80, Last: 80}, {First: 443, Last: 443}, {First: 1000, Last: 1010}}
	every := e.farm("every", testutil.VIP4(2), 0, model.ProtoTCP, 0)
	all := e.farm("all", testutil.VIP4(3), 0, model.ProtoAll, 0)
	src := e.farm("srcaddr", testutil.VIP4(4), 80, model.ProtoTCP, 0)
	src.SourceAddr = testutil.VIP4(200)
	e.put(t, prev, multi, every, all, src)

	check := func(vip netip.Addr, port uint16, udp bool) netip.AddrPort {
		t.Helper()
		to := netip.AddrPortFrom(vip, port)
		var got string
		var err error
		if udp {
			got, err = testutil.AskUDP(e.Client.NS, to)
		} else {
			got, err = testutil.AskTCP(e.Client.NS, to)
		}
		if err != nil {
			t.Fatalf("%s (udp %v): %v", to, udp, err)
		}
		_, from, err := testutil.ParseReply(got)
		if err != nil {
			t.Fatal(err)
		}
		return from
	}
	for _, port := range []uint16{80, 443, 1000, 1005, 1010} {
		check(testutil.VIP4(1), port, false)
	}
	for _, port := range []uint16{81, 999, 1011} {
		if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(testutil.VIP4(1), port)); err == nil {
			t.Errorf("port %d of farm multi answered", port)
		}
	}
	check(testutil.VIP4(2), 5555, false)
	check(testutil.VIP4(3), 1005, false)
	check(testutil.VIP4(3), 1005, true)
	if from := check(testutil.VIP4(4), 80, false); from.Addr() != testutil.VIP4(200) {
		t.Errorf("source-addr: backend saw %s, want %s", from, testutil.VIP4(200))
	}
}

// TestFarmState: a farm that is down or off has nothing in the kernel; up
// again, it serves.
func TestFarmState(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	prev := map[string]*model.Farm{}
	f := e.farm("state", vip, 80, model.ProtoTCP, 8080)
	e.put(t, prev, f)
	e.askTCP(t, netip.AddrPortFrom(vip, 80))
	for _, st := range []model.State{model.StateDown, model.StateOff} {
		g := f.Clone()
		g.State = st
		e.put(t, prev, g)
		if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(vip, 80)); err == nil {
			t.Errorf("farm %s: VIP answered", st)
		}
		out := e.nft(t, "list", "table", "inet", "xlb")
		if hasFarmRules(out, "state") || strings.Contains(out, "10.99.0.1") {
			t.Errorf("farm %s still in the kernel:\n%s", st, out)
		}
	}
	e.put(t, prev, f)
	e.askTCP(t, netip.AddrPortFrom(vip, 80))
}

// TestPersistenceSurvivesRestart: sessions live in the kernel, so a new
// plane that reconciles the same farms keeps every client on its backend
// (a fresh rr would hand them out again from the first backend).
func TestPersistenceSurvivesRestart(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	prev := map[string]*model.Farm{}
	f := e.farm("sticky", vip.Addr(), 80, model.ProtoTCP, 8080)
	f.Persistence, f.PersistTTL = model.KeySrcIP, 300
	e.put(t, prev, f)
	e.askTCP(t, vip) // the client's own address takes b0: the others get b1, b2, b0
	var clients []netip.Addr
	want := map[netip.Addr]string{}
	for i := range 3 {
		a := netip.AddrFrom4([4]byte{10, 100, 0, byte(20 + i)})
		e.Client.AddAddr(t, netip.PrefixFrom(a, 24))
		clients = append(clients, a)
		got, err := testutil.AskTCPFrom(e.Client.NS, netip.AddrPortFrom(a, 0), vip)
		if err != nil {
			t.Fatal(err)
		}
		want[a], _, _ = testutil.ParseReply(got)
	}
	if want[clients[0]] != "b1" || want[clients[1]] != "b2" || want[clients[2]] != "b0" {
		t.Fatalf("rr before restart: %v", want)
	}
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	p2 := newPlane(t, e.LB.NS)
	if err := p2.Reconcile(context.Background(), []*model.Farm{prev["sticky"]}); err != nil {
		t.Fatal(err)
	}
	for _, a := range clients {
		got, err := testutil.AskTCPFrom(e.Client.NS, netip.AddrPortFrom(a, 0), vip)
		if err != nil {
			t.Fatal(err)
		}
		if name, _, _ := testutil.ParseReply(got); name != want[a] {
			t.Errorf("after restart client %s went to %s, before to %s", a, name, want[a])
		}
	}
	out := e.nft(t, "list", "map", "inet", "xlb", persistName(prev["sticky"]))
	if n := strings.Count(out, "expires"); n != 4 {
		t.Errorf("persistence map holds %d sessions, want 4:\n%s", n, out)
	}
}

// TestSessions lists a farm's sessions, deletes one client's (its next
// connection is scheduled again) and one backend's.
func TestSessions(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	prev := map[string]*model.Farm{}
	f := e.farm("sticky", vip.Addr(), 80, model.ProtoTCP, 8080)
	f.Persistence, f.PersistTTL = model.KeySrcIP|model.KeyDstPort, 300
	e.put(t, prev, f)
	ask := func(a netip.Addr) string {
		t.Helper()
		got, err := testutil.AskTCPFrom(e.Client.NS, netip.AddrPortFrom(a, 0), vip)
		if err != nil {
			t.Fatal(err)
		}
		name, _, _ := testutil.ParseReply(got)
		return name
	}
	var clients []netip.Addr
	for i := range 3 {
		a := netip.AddrFrom4([4]byte{10, 100, 0, byte(20 + i)})
		e.Client.AddAddr(t, netip.PrefixFrom(a, 24))
		clients = append(clients, a)
	}
	got := map[string]string{} // client key -> backend
	for _, a := range clients {
		got[a.String()+"-80"] = ask(a) // rr: b0, b1, b2
	}
	ctx := context.Background()
	ss, err := e.p.Sessions(ctx, prev["sticky"])
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 3 {
		t.Fatalf("sessions %+v, want 3", ss)
	}
	for _, s := range ss {
		if got[s.Client] != s.Backend || s.Expires <= 290*time.Second || s.Expires > 300*time.Second {
			t.Errorf("session %+v, want backend %q and about 300s left (all: %v)", s, got[s.Client], got)
		}
	}
	// Delete client 0's session: its next connection is scheduled anew
	// (rr's next slot is b0 again, so first move rr on by one).
	key0 := clients[0].String() + "-80"
	if n, err := e.p.DeleteSessions(ctx, prev["sticky"], key0, ""); err != nil || n != 1 {
		t.Fatalf("delete %s: %d, %v", key0, n, err)
	}
	if b := ask(e.Client.IPv4); b != "b0" {
		t.Fatalf("a new client went to %s, want b0 (rr)", b)
	}
	if b := ask(clients[0]); b != "b1" {
		t.Errorf("after its session was deleted client 0 went to %s, want b1 (rr's next)", b)
	}
	// Delete b2's sessions (client 2): counted and gone from the list.
	if n, err := e.p.DeleteSessions(ctx, prev["sticky"], "", "b2"); err != nil || n != 1 {
		t.Fatalf("delete b2's sessions: %d, %v", n, err)
	}
	ss, err = e.p.Sessions(ctx, prev["sticky"])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if s.Backend == "b2" {
			t.Errorf("b2's session still there: %+v", ss)
		}
	}
	if len(ss) != 3 { // client 0 (b1), client 1 (b1), the LB-side client (b0)
		t.Errorf("sessions %+v, want 3", ss)
	}
}

// TestMarkFarmSourceAddr: a firewall-mark farm in snat mode with
// source-addr: the backends see that address.
func TestMarkFarmSourceAddr(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	src := netip.MustParseAddr("10.200.0.250")
	testutil.Run(t, e.LB.Name, "ip", "addr", "add", src.String()+"/24", "dev", "br0")
	dst := testutil.VIP4(50)
	testutil.Run(t, e.LB.Name, "nft", "add", "table", "ip", "user")
	testutil.Run(t, e.LB.Name, "nft", "add", "chain", "ip", "user", "pre", "{ type filter hook prerouting priority mangle; }")
	testutil.Run(t, e.LB.Name, "nft", "add", "rule", "ip", "user", "pre", "ip", "daddr", dst.String(), "meta", "mark", "set", "0x20")
	f := e.farm("fwm", dst, 0, model.ProtoTCP, 8080)
	f.VirtualAddr, f.VirtualPorts, f.Mark, f.SourceAddr = netip.Addr{}, nil, 0x20, src
	e.put(t, map[string]*model.Farm{}, f)
	if _, from := e.askTCP(t, netip.AddrPortFrom(dst, 80)); from.Addr() != src {
		t.Errorf("backend saw %s, want the farm's source-addr %s", from, src)
	}
}
