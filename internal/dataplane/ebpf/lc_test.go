package ebpf

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// lc and wlc are refused where the program cannot count connections (udp,
// stlsdnat) or its bounded loop would not see every backend.
func TestCheckLeastConn(t *testing.T) {
	base := func(sched model.Scheduler, n int) model.Farm {
		f := model.NewFarm("lc")
		f.VirtualAddr = netip.MustParseAddr("10.0.0.1")
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		f.Protocol = model.ProtoTCP
		f.Scheduler = sched
		for i := range n {
			b := model.NewBackend(fmt.Sprintf("b%d", i))
			b.Addr = netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(1 + i%250)})
			f.Backends = append(f.Backends, b)
		}
		return f
	}
	for _, s := range []model.Scheduler{model.SchedLC, model.SchedWLC} {
		ok := base(s, int(lcMaxBackends))
		if err := check(&ok); err != nil {
			t.Fatalf("%s farm of %d backends: %v", s, lcMaxBackends, err)
		}
		for name, c := range map[string]struct {
			edit func(*model.Farm)
			want string
		}{
			"udp":      {func(f *model.Farm) { f.Protocol = model.ProtoUDP }, "protocol udp"},
			"stlsdnat": {func(f *model.Farm) { f.Mode = model.ModeStlsDNAT }, "stlsdnat"},
			"too many": {func(f *model.Farm) {
				b := model.NewBackend("extra")
				b.Addr = netip.MustParseAddr("10.2.0.1")
				f.Backends = append(f.Backends, b)
			}, fmt.Sprintf("at most %d backends", lcMaxBackends)},
		} {
			f := base(s, int(lcMaxBackends))
			c.edit(&f)
			var fe *model.FieldError
			err := check(&f)
			if !errors.As(err, &fe) || fe.Field != "scheduler" || fe.Value != s.String() || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s %s: check = %v, want a FieldError on scheduler %q containing %q", s, name, err, s, c.want)
			}
		}
	}
}

// activeConns reads the program's active-connection count of each backend
// of farm name, by the backend's reply name (be<i>: the index of its
// address among topo's backends).
func activeConns(t *testing.T, p *Plane, topo *testutil.Topology, name string) map[string]int64 {
	t.Helper()
	g := p.farms[name]
	if g == nil {
		t.Fatalf("farm %s has no generation", name)
	}
	out := map[string]int64{}
	for i, id := range g.ids {
		var n int64
		if err := p.objs.XlbBeActive.Lookup(id, &n); err != nil {
			t.Fatalf("read active connections of backend id %d: %v", id, err)
		}
		addr := netip.AddrFrom4(ne4(g.bes[i].Addr[0]))
		for j, b := range topo.Backends {
			if b.IPv4 == addr {
				out[fmt.Sprintf("be%d", j)] = n
			}
		}
	}
	return out
}

// openConn connects to vip and returns the connection and the backend that
// answered. A lost SYN on a loaded machine is retried by the kernel.
func openConn(t *testing.T, topo *testutil.Topology, vip netip.AddrPort) (net.Conn, string) {
	t.Helper()
	c, err := testutil.DialTCP(topo.Client.NS, vip, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	line, err := testutil.ReadLine(c, 5*time.Second)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	name, _, err := testutil.ParseReply(line)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c, name
}

// waitActive polls the counts until they equal want (closes are processed
// as the FINs pass), for at most 5 s.
func waitActive(t *testing.T, p *Plane, topo *testutil.Topology, name string, want map[string]int64) {
	t.Helper()
	var got map[string]int64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got = activeConns(t, p, topo, name)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
	}
	t.Fatalf("farm %s: active connections %v, want %v", name, got, want)
}

// TestTrafficLeastConn: with real TCP connections through the program, lc
// sends new connections to the backends with the fewest open ones, wlc
// splits by active/weight, and a closed connection is no longer counted.
func TestTrafficLeastConn(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	ctx := context.Background()
	bes := backendsOf(topo, 8080)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()

	// lc: be0 alone takes 4 long-lived connections...
	vip := netip.AddrPortFrom(testutil.VIP4(90), 80)
	f1 := farm(t, "lc", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedLC, bes[0])
	if err := p.Apply(ctx, diffOf(nil, f1)); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		c, name := openConn(t, topo, vip)
		open = append(open, c)
		if name != "be0" {
			t.Fatalf("one-backend farm answered from %s", name)
		}
	}
	waitActive(t, p, topo, "lc", map[string]int64{"be0": 4})
	// ...then be1 and be2 join: the next 6 go to them, alternately
	// (ties go to the first in the farm's order), none to be0.
	f2 := farm(t, "lc", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedLC, bes...)
	if err := p.Apply(ctx, diffOf(f1, f2)); err != nil {
		t.Fatal(err)
	}
	waitActive(t, p, topo, "lc", map[string]int64{"be0": 4, "be1": 0, "be2": 0})
	var got []string
	for range 6 {
		c, name := openConn(t, topo, vip)
		open = append(open, c)
		got = append(got, name)
	}
	if want := "be1 be2 be1 be2 be1 be2"; strings.Join(got, " ") != want {
		t.Errorf("lc: new connections went to %v, want %s", got, want)
	}
	waitActive(t, p, topo, "lc", map[string]int64{"be0": 4, "be1": 3, "be2": 3})
	// Closed, none is counted any more (the first FIN takes it out).
	for _, c := range open {
		c.Close()
	}
	open = nil
	waitActive(t, p, topo, "lc", map[string]int64{"be0": 0, "be1": 0, "be2": 0})

	// wlc, weights 1 and 3: 8 long-lived connections split 2 and 6.
	wvip := netip.AddrPortFrom(testutil.VIP4(91), 80)
	w := farm(t, "wlc", wvip.Addr().String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedWLC, bes[0], bes[1])
	w.Backends[0].Weight, w.Backends[1].Weight = 1, 3
	if err := p.Apply(ctx, diffOf(nil, w)); err != nil {
		t.Fatal(err)
	}
	split := map[string]int{}
	for range 8 {
		c, name := openConn(t, topo, wvip)
		open = append(open, c)
		split[name]++
	}
	if split["be0"] != 2 || split["be1"] != 6 {
		t.Errorf("wlc 1:3 over 8 connections: %v, want be0 2, be1 6", split)
	}
	waitActive(t, p, topo, "wlc", map[string]int64{"be0": 2, "be1": 6})
	// An abortive close (RST) takes a connection out too.
	if tc, ok := open[0].(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	for _, c := range open {
		c.Close()
	}
	open = nil
	waitActive(t, p, topo, "wlc", map[string]int64{"be0": 0, "be1": 0})
}

// TestLeastConnExpiry (BPF_PROG_TEST_RUN): a flow whose entry expires is
// taken out of its backend's count when the program removes the entry (at
// the flow's next packet), and lc then sends the next flow back to it.
func TestLeastConnExpiry(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(t), ConnTableSize: 4096, Timeouts: Timeouts{SYN: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	f := farm(t, "lc", vip1.String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedLC, "10.200.0.11:80", "10.200.0.12:80")
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	g := p.farms["lc"]
	active := func() [2]int64 {
		t.Helper()
		var out [2]int64
		for i := range out {
			if err := p.objs.XlbBeActive.Lookup(g.ids[i], &out[i]); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	send := func(sport uint16, flags uint8) (uint32, netip.Addr) {
		t.Helper()
		verdict, out := runProg(t, ns, p.objs.XlbIngress, pktSpec{src: client, sport: sport, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: flags}.build())
		if verdict != verdictRedirect {
			return verdict, netip.Addr{}
		}
		got, err := parse(out)
		if err != nil {
			t.Fatal(err)
		}
		return verdict, got.dst
	}
	if _, dst := send(7000, tcpSYN); dst != be1 {
		t.Fatalf("first flow to %s, want %s", dst, be1)
	}
	if _, dst := send(7001, tcpSYN); dst != be2 {
		t.Fatalf("second flow to %s, want %s (be1 has one)", dst, be2)
	}
	if _, dst := send(7002, tcpSYN); dst != be1 {
		t.Fatalf("third flow to %s, want %s (a tie: the first)", dst, be1)
	}
	if a := active(); a != [2]int64{2, 1} {
		t.Fatalf("active %v, want [2 1]", a)
	}
	// Past the SYN timeout (1 s; entries are checked at most once per
	// refresh interval, 1 s): the next packet of flow 7000 finds it expired.
	time.Sleep(2500 * time.Millisecond)
	if v, _ := send(7000, tcpACK); v == verdictRedirect {
		t.Fatal("an ACK of an expired flow was forwarded")
	}
	if a := active(); a != [2]int64{1, 1} {
		t.Fatalf("after one expiry: active %v, want [1 1]", a)
	}
	// A SYN on an expired tuple: the old flow (be2's) is taken out, so
	// be2 has none and lc sends the new flow there.
	if _, dst := send(7001, tcpSYN); dst != be2 {
		t.Fatalf("flow 7001 again to %s, want %s", dst, be2)
	}
	if a := active(); a != [2]int64{1, 1} {
		t.Fatalf("after the port's reuse: active %v, want [1 1]", a)
	}
	// xlb connections delete: removed through the program, counted out.
	n, err := p.DeleteConnections(context.Background(), []*model.Farm{f}, dataplane.ConnFilter{Client: client})
	if err != nil || n != 2 {
		t.Fatalf("DeleteConnections = %d, %v; want 2 (flows 7001 and 7002)", n, err)
	}
	if a := active(); a != [2]int64{0, 0} {
		t.Fatalf("after deleting the connections: active %v, want [0 0]", a)
	}
	var v xlbCtVal
	if err := p.objs.XlbCt.Lookup(ctKey(client, 7002, vip1, 80, protoTCP), &v); err == nil {
		t.Error("a deleted connection is still tracked")
	}
}

// TestCountConnsActiveFromProgram: CountConns (xlb list --conns, /metrics)
// takes each backend's ActiveConn from the program's own count
// (xlb_be_active), not from a walk of the conntrack table: with real TCP
// connections held open it shows them per backend, it shows a count that
// exists only in the map (which a walk cannot see), and after the
// connections close it shows none active.
func TestCountConnsActiveFromProgram(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	ctx := context.Background()
	bes := backendsOf(topo, 8080)
	vip := netip.AddrPortFrom(testutil.VIP4(92), 80)
	f := farm(t, "cnt", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, bes...)
	if err := p.Apply(ctx, diffOf(nil, f)); err != nil {
		t.Fatal(err)
	}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	held := map[string]uint64{}
	for range 5 {
		c, name := openConn(t, topo, vip)
		open = append(open, c)
		held[name]++
	}
	// be<i> (the reply's name) is backend i of the farm: bes is in
	// topo's order.
	active := func() map[string]uint64 {
		t.Helper()
		tb, err := p.CountConns(ctx, []*model.Farm{f}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for i, c := range tb.Backends["cnt"] {
			if c.Active > 0 {
				out[fmt.Sprintf("be%d", i)] = c.Active
			}
		}
		return out
	}
	waitCounts := func(want map[string]uint64) {
		t.Helper()
		var got map[string]uint64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if got = active(); fmt.Sprint(got) == fmt.Sprint(want) {
				return
			}
		}
		t.Fatalf("CountConns active %v, want %v", got, want)
	}
	waitCounts(held)

	// A count only the program's map holds: 40 more on be2's id. A walk
	// of xlb_ct would still say what is held.
	id := p.farms["cnt"].ids[slices.IndexFunc(p.farms["cnt"].names, func(n string) bool { return n == f.Backends[2].Name })]
	var n int64
	if err := p.objs.XlbBeActive.Lookup(id, &n); err != nil {
		t.Fatal(err)
	}
	if err := p.objs.XlbBeActive.Update(id, n+40, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(held)
	want["be2"] += 40
	waitCounts(want)
	if err := p.objs.XlbBeActive.Update(id, n, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}

	for _, c := range open {
		c.Close()
	}
	open = nil
	waitCounts(map[string]uint64{})
}
