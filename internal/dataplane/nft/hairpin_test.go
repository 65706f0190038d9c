package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestHairpin: a backend of a dnat farm connecting to the farm's VIP and
// given itself is masqueraded (it sees the LB's address, and the connection
// completes); two farms sharing the backend hold one element, which stays
// until the last of them lets the backend go.
func TestHairpin(t *testing.T) {
	testutil.RequireRoot(t)
	// The bridge port in hairpin mode, as on a node (see TopologyOptions).
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 1, IPv6: true, Hairpin: true})
	e := &env{Topology: topo, p: newPlane(t, topo.LB.NS)}
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	vip := testutil.VIP4(1)
	a := e.farm("a", vip, 80, model.ProtoTCP, 8080)
	a.Mode = model.ModeDNAT
	b := e.farm("b", testutil.VIP4(2), 80, model.ProtoTCP, 8080)
	b.Mode = model.ModeDNAT
	b6 := e.farm("b6", testutil.VIP6(2), 80, model.ProtoTCP, 8080)
	b6.Mode = model.ModeDNAT
	e.put(t, prev, a, b, b6)

	be := e.Backends[0]
	for _, to := range []netip.AddrPort{netip.AddrPortFrom(vip, 80), netip.AddrPortFrom(testutil.VIP6(2), 80)} {
		c, err := testutil.DialTCPFrom(be.NS, netip.AddrPortFrom(be.Addr(to.Addr().Is6()), 0), to, 2*time.Second)
		if err != nil {
			t.Log(testutil.Run(t, e.LB.Name, "nft", "list", "ruleset"))
			t.Log(testutil.Run(t, e.LB.Name, "conntrack", "-L"))
			t.Log(testutil.Run(t, e.LB.Name, "ip", "-d", "link"))
			t.Log(testutil.Run(t, e.LB.Name, "ip", "addr"))
			t.Fatalf("hairpin connection to %s: %v", to, err)
		}
		got, err := testutil.ReadLine(c, 2*time.Second)
		c.Close()
		if err != nil {
			t.Fatalf("hairpin reply from %s: %v", to, err)
		}
		name, from, err := testutil.ParseReply(got)
		if err != nil {
			t.Fatal(err)
		}
		if name != "b0" || from.Addr() == be.Addr(to.Addr().Is6()) {
			t.Errorf("hairpin to %s: answered by %s seeing %s, want b0 seeing the LB's address", to, name, from)
		}
	}
	// A client that is not the chosen backend keeps its address.
	if _, from := e.askTCP(t, netip.AddrPortFrom(vip, 80)); from.Addr() != e.Client.IPv4 {
		t.Errorf("client seen as %s, want its own %s", from.Addr(), e.Client.IPv4)
	}

	elems := func() string {
		return testutil.Run(t, e.LB.Name, "nft", "list", "set", "inet", "xlb", "hairpin4")
	}
	want := be.IPv4.String() + " . " + be.IPv4.String()
	if !strings.Contains(elems(), want) {
		t.Fatalf("hairpin4 lacks %s:\n%s", want, elems())
	}
	del := func(name string) {
		t.Helper()
		d := plan.Diff{Changes: []plan.FarmChange{{Old: prev[name]}}}
		if err := e.p.Apply(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		delete(prev, name)
	}
	del("a")
	if !strings.Contains(elems(), want) {
		t.Errorf("hairpin4 lost %s while farm b still has it:\n%s", want, elems())
	}
	// Mode snat needs no hairpin element.
	b.Mode = model.ModeSNAT
	e.put(t, prev, b)
	if strings.Contains(elems(), want) {
		t.Errorf("hairpin4 keeps %s with no dnat farm using it:\n%s", want, elems())
	}
	// A reconcile counts afresh: deleting the IPv6 farm then empties
	// hairpin6.
	if err := e.p.Reconcile(context.Background(), []*model.Farm{prev["b"], prev["b6"]}); err != nil {
		t.Fatal(err)
	}
	del("b6")
	if got := testutil.Run(t, e.LB.Name, "nft", "list", "set", "inet", "xlb", "hairpin6"); strings.Contains(got, "elements") {
		t.Errorf("hairpin6 not empty after its farm went:\n%s", got)
	}
}
