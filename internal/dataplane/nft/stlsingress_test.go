package nft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// setForwarding turns the LB's IP forwarding on or off: a routed
// stlsdnat farm needs it, one at ingress does not.
func (e *env) setForwarding(t *testing.T, on bool) {
	t.Helper()
	v := map[bool]string{true: "1", false: "0"}[on]
	for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := testutil.WriteSysctl(e.LB.NS, k, v); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStlsIngressChanges moves a stlsdnat farm from routed to ingress and
// back, changing responsettl on the way (and leaving oface for the plane
// to find), with traffic after each step:
// the farm's chains move between the inet and netdev tables, the map of
// clients' MACs holds the client with the farm's responsettl, and nothing
// of the farm is left in the table it left.
func TestStlsIngressChanges(t *testing.T) {
	e := newEnv(t, 2, false)
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	f := e.farm("st", testutil.VIP4(1), 80, model.ProtoUDP, 8080)
	f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP|model.KeySrcPort
	vip := netip.AddrPortFrom(f.VirtualAddr, 80)
	check := func(step string) {
		t.Helper()
		for range 4 {
			if _, from := e.askUDP(t, vip); from.Addr() != e.Client.IPv4 {
				t.Errorf("%s: backend saw %s, want the client's %s", step, from, e.Client.IPv4)
			}
		}
	}
	e.put(t, prev, f)
	check("routed")

	e.setForwarding(t, false)
	f.Iface, f.Oface, f.ResponseTTL = e.LB.Link, "br0", 7
	e.put(t, prev, f)
	check("at ingress")
	learnt := "cm-" + nameHash("st") + "-4-7"
	m := e.nft(t, "list", "map", "netdev", "xlb", learnt)
	if !strings.Contains(m, "timeout 7s") || !strings.Contains(m, e.Client.IPv4.String()+" expires") {
		t.Errorf("map of clients' MACs after traffic, want the client with responsettl 7s:\n%s", m)
	}
	if rs := e.nft(t, "list", "table", "inet", "xlb"); strings.Contains(rs, nameHash("st")) {
		t.Errorf("the routed farm's objects are left in the inet table:\n%s", rs)
	}

	// oface left to the plane: the interface the backends are routed to.
	f.ResponseTTL, f.Oface = 9, ""
	e.put(t, prev, f)
	check("responsettl 9, oface found")
	ns := e.nft(t, "list", "table", "netdev", "xlb")
	if strings.Contains(ns, learnt) || !strings.Contains(ns, "cm-"+nameHash("st")+"-4-9") || !strings.Contains(ns, "timeout 9s") {
		t.Errorf("after responsettl 9, want only the map cm-...-4-9 with timeout 9s:\n%s", ns)
	}

	e.setForwarding(t, true)
	f.Iface, f.Oface = "", ""
	e.put(t, prev, f)
	check("routed again")
	if ns := e.nft(t, "list", "table", "netdev", "xlb"); strings.Contains(ns, nameHash("st")) || strings.Contains(ns, "in-br0") {
		t.Errorf("the farm at ingress left objects in the netdev table:\n%s", ns)
	}
}

// TestStlsIngressBadInput: an interface that does not exist (iface or
// oface) is refused naming the field and the value, and the kernel is left
// as it was; the farm that serves keeps serving.
func TestStlsIngressBadInput(t *testing.T) {
	e := newEnv(t, 1, false)
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	f := e.farm("st", testutil.VIP4(1), 80, model.ProtoUDP, 8080)
	f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP|model.KeySrcPort
	f.Iface, f.Oface = e.LB.Link, "br0"
	e.put(t, prev, f)
	before := e.nft(t, "list", "ruleset")
	for _, c := range []struct{ iface, oface, want string }{
		{"nope0", "br0", `"iface" value "nope0": no such interface`},
		{e.LB.Link, "nope1", `"oface" value "nope1": no such interface`},
		{"lo", "br0", `"iface" value "lo": has no Ethernet address`},
	} {
		g := f.Clone()
		g.Iface, g.Oface = c.iface, c.oface
		if err := g.Validate(); err != nil {
			t.Fatal(err)
		}
		err := e.p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: prev["st"], New: &g}}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("iface %s, oface %s: %v, want an error with %s", c.iface, c.oface, err, c.want)
		}
	}
	if after := e.nft(t, "list", "ruleset"); after != before {
		t.Errorf("a refused farm changed the ruleset:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, from := e.askUDP(t, netip.AddrPortFrom(f.VirtualAddr, 80)); from.Addr() != e.Client.IPv4 {
		t.Errorf("after the refusals the backend saw %s, want the client's %s", from, e.Client.IPv4)
	}
}

// TestStlsIngressReconcile: a new plane on the namespace (a restarted
// daemon) reconciles a stlsdnat farm at ingress: same ruleset, the
// clients' MACs kept (their map is not rebuilt), traffic on.
func TestStlsIngressReconcile(t *testing.T) {
	e := newEnv(t, 2, false)
	e.startServers(t, 8080)
	e.setForwarding(t, false)
	prev := map[string]*model.Farm{}
	f := e.farm("st", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP|model.KeySrcPort
	f.Iface, f.Oface = e.LB.Link, "br0"
	e.put(t, prev, f)
	vip := netip.AddrPortFrom(f.VirtualAddr, 80)
	if _, from := e.askTCP(t, vip); from.Addr() != e.Client.IPv4 {
		t.Fatalf("backend saw %s, want the client's %s", from, e.Client.IPv4)
	}
	// The ruleset's lines, sorted (a rebuilt farm's maps and elements are
	// listed in another order), without the generation in map names and
	// the elements' expiry.
	norm := func() string {
		out := e.nft(t, "-s", "list", "ruleset")
		out = regexp.MustCompile(`\b(m|hw)-([0-9a-f]{16})-[0-9a-z]+`).ReplaceAllString(out, "$1-$2-GEN")
		var lines []string
		for _, l := range strings.Split(regexp.MustCompile(`expires \S+ `).ReplaceAllString(out, ""), "\n") {
			// An element per line, wherever the map listed it.
			l = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(l), "elements = { "), " }"), ",")
			if l != "" {
				lines = append(lines, l)
			}
		}
		slices.Sort(lines)
		return strings.Join(lines, "\n")
	}
	before := norm()
	p2 := newPlane(t, e.LB.NS)
	if err := p2.Reconcile(context.Background(), []*model.Farm{prev["st"]}); err != nil {
		t.Fatal(err)
	}
	if after := norm(); after != before {
		t.Errorf("reconcile changed the ruleset:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if !strings.Contains(before, e.Client.IPv4.String()+" ") {
		t.Errorf("the client's MAC was not learnt:\n%s", before)
	}
	if _, from := e.askTCP(t, vip); from.Addr() != e.Client.IPv4 {
		t.Errorf("after reconcile the backend saw %s, want the client's %s", from, e.Client.IPv4)
	}
}

// udpIn opens a UDP socket bound to addr in namespace ns.
func udpIn(t *testing.T, ns netns.NsHandle, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := testutil.Do(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestStlsIngressResponseTTL: a backend's packet to a client goes back to
// the client (from the VIP) while the client's MAC is known, and is
// dropped once the client has sent nothing for responsettl seconds.
func TestStlsIngressResponseTTL(t *testing.T) {
	e := newEnv(t, 1, false)
	e.setForwarding(t, false)
	prev := map[string]*model.Farm{}
	f := e.farm("st", testutil.VIP4(1), 80, model.ProtoUDP, 8080)
	f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP|model.KeySrcPort
	f.Iface, f.Oface, f.ResponseTTL = e.LB.Link, "br0", 1
	e.put(t, prev, f)
	vip := netip.AddrPortFrom(f.VirtualAddr, 80)
	cl := udpIn(t, e.Client.NS, netip.AddrPortFrom(e.Client.IPv4, 5000))
	be := udpIn(t, e.Backends[0].NS, netip.AddrPortFrom(e.Backends[0].IPv4, 8080))
	client := netip.AddrPortFrom(e.Client.IPv4, 5000)
	// The client speaks: the backend gets it from the client's address.
	if _, err := cl.WriteToUDPAddrPort([]byte("hello"), vip); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	be.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, from, err := be.ReadFromUDPAddrPort(buf); err != nil || from != client {
		t.Fatalf("backend: %v from %s, want a datagram from %s", err, from, client)
	}
	recv := func(within time.Duration) (netip.AddrPort, error) {
		cl.SetReadDeadline(time.Now().Add(within))
		_, from, err := cl.ReadFromUDPAddrPort(buf)
		return from, err
	}
	// Within responsettl: the backend's datagram reaches the client from
	// the VIP.
	if _, err := be.WriteToUDPAddrPort([]byte("answer"), client); err != nil {
		t.Fatal(err)
	}
	if from, err := recv(5 * time.Second); err != nil || from != vip {
		t.Fatalf("client within responsettl: %v from %s, want a datagram from %s", err, from, vip)
	}
	// Three times responsettl later, with nothing from the client: the
	// backend's datagram is dropped by the reply chain.
	time.Sleep(3 * time.Second)
	if _, err := be.WriteToUDPAddrPort([]byte("late"), client); err != nil {
		t.Fatal(err)
	}
	if from, err := recv(time.Second); err == nil {
		t.Errorf("client got a datagram from %s after responsettl without a packet of its own", from)
	}
	if out := e.nft(t, "list", "chain", "netdev", "xlb", farmL2Rev+nameHash("st")); !strings.Contains(out, "counter packets 1 bytes") {
		t.Errorf("the reply chain did not drop the late datagram:\n%s", out)
	}
}

// TestStlsIngressDual: a family dual stlsdnat farm at ingress (its two
// halves share the interfaces) serves TCP on both VIPs.
func TestStlsIngressDual(t *testing.T) {
	e := newEnv(t, 2, true)
	e.startServers(t, 8080)
	e.setForwarding(t, false)
	f := e.farm("dual", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	f.Family, f.VirtualAddr2 = model.FamilyDual, testutil.VIP6(1)
	for i, b := range e.Backends {
		b6 := model.NewBackend(fmt.Sprintf("b%d-v6", i))
		b6.Addr, b6.Port = b.IPv6, 8080
		f.Backends = append(f.Backends, b6)
	}
	f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP|model.KeySrcPort
	f.Iface, f.Oface = e.LB.Link, "br0"
	e.put(t, map[string]*model.Farm{}, f)
	for _, c := range []struct{ vip, client netip.Addr }{{testutil.VIP4(1), e.Client.IPv4}, {testutil.VIP6(1), e.Client.IPv6}} {
		if _, from := e.askTCP(t, netip.AddrPortFrom(c.vip, 80)); from.Addr() != c.client {
			t.Errorf("to %s: backend saw %s, want the client's %s", c.vip, from, c.client)
		}
	}
}
