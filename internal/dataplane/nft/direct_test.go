package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestDirectFarms: a farm with one serving backend and single ports has no
// chain of its own (setDirect). It carries TCP and UDP, over IPv4 and IPv6;
// it moves to a chain of its own when a second backend comes up and back
// when it goes, without breaking an established connection; a port-0
// backend keeps each virtual port; Reconcile repairs a dst element deleted
// by hand; deleting the farm leaves no element behind.
func TestDirectFarms(t *testing.T) {
	e := newEnv(t, 2, true)
	t.Parallel()
	e.startServers(t, 8080)
	ctx := context.Background()
	prev := map[string]*model.Farm{}
	vip, vip6 := testutil.VIP4(1), testutil.VIP6(1)
	web := e.farm("web", vip, 80, model.ProtoTCP, 8080)
	web.Backends[1].State = model.StateOff
	dns := e.farm("dns", vip, 53, model.ProtoUDP, 8080)
	dns.Mode = model.ModeDNAT
	dns.Backends = dns.Backends[1:]
	v6 := e.farm("web6", vip6, 80, model.ProtoTCP, 8080)
	v6.Backends = v6.Backends[:1]
	// Backend port 0 keeps the client's port: 8080 -> 8080, 9000 -> 9000.
	keep := e.farm("keep", testutil.VIP4(2), 8080, model.ProtoTCP, 0)
	keep.VirtualPorts = append(keep.VirtualPorts, model.PortRange{First: 9000, Last: 9000})
	keep.Backends = keep.Backends[:1]
	e.put(t, prev, web, dns, v6, keep)

	table := e.nft(t, "list", "table", "inet", "xlb")
	for _, name := range []string{"web", "dns", "web6", "keep"} {
		if hasFarmRules(table, name) {
			t.Errorf("direct farm %s has a chain of its own:\n%s", name, table)
		}
	}
	for _, el := range []string{
		vip.String() + " . tcp . 80 : " + e.Backends[0].IPv4.String() + " . 8080",
		vip.String() + " . udp . 53 : " + e.Backends[1].IPv4.String() + " . 8080",
		vip6.String() + " . tcp . 80 : " + e.Backends[0].IPv6.String() + " . 8080",
		testutil.VIP4(2).String() + " . tcp . 9000 : " + e.Backends[0].IPv4.String() + " . 9000",
	} {
		if !strings.Contains(table, el) {
			t.Errorf("dst element %q missing:\n%s", el, table)
		}
	}
	only := func(to netip.AddrPort, udp bool, want string) {
		t.Helper()
		c := e.count(t, 6, func() string {
			if udp {
				n, _ := e.askUDP(t, to)
				return n
			}
			n, _ := e.askTCP(t, to)
			return n
		})
		if c[want] != 6 {
			t.Errorf("%s: answers from %v, want all 6 from %s", to, c, want)
		}
	}
	only(netip.AddrPortFrom(vip, 80), false, "b0")
	only(netip.AddrPortFrom(vip, 53), true, "b1")
	only(netip.AddrPortFrom(vip6, 80), false, "b0")
	only(netip.AddrPortFrom(testutil.VIP4(2), 8080), false, "b0")
	if _, from := e.askUDP(t, netip.AddrPortFrom(vip, 53)); from.Addr() != e.Client.IPv4 {
		t.Errorf("direct dnat farm: backend saw %s, want the client's %s", from, e.Client.IPv4)
	}

	echo := e.holdTCP(t, netip.AddrPortFrom(vip, 80))

	// A second backend: web gets a chain of its own and round-robins.
	web = prev["web"].Clone()
	web.Backends[1].State = model.StateUp
	e.put(t, prev, web)
	if table := e.nft(t, "list", "table", "inet", "xlb"); !hasFarmRules(table, "web") ||
		strings.Contains(table, vip.String()+" . tcp . 80 : "+e.Backends[0].IPv4.String()) {
		t.Errorf("web with two backends: want its own chain and no dst element:\n%s", table)
	}
	if c := e.count(t, 10, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n }); c["b0"] != 5 || c["b1"] != 5 {
		t.Errorf("rr over two backends: %v, want 5 each", c)
	}
	echo("own chain")

	// Back to one backend (b1): direct again, its chain is gone.
	web = prev["web"].Clone()
	web.Backends[0].State = model.StateOff
	e.put(t, prev, web)
	if table := e.nft(t, "list", "table", "inet", "xlb"); hasFarmRules(table, "web") {
		t.Errorf("web back to one backend still has its chain:\n%s", table)
	}
	only(netip.AddrPortFrom(vip, 80), false, "b1")
	echo("direct again")

	// Drift: a dst element deleted by hand comes back with Reconcile.
	e.nft(t, "delete", "element", "inet", "xlb", "dst4", "{", vip.String(), ".", "tcp", ".", "80", "}")
	if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(vip, 80)); err == nil {
		t.Error("a connection succeeded without the dst element (the drop rule should have dropped it)")
	}
	var all []*model.Farm
	for _, f := range prev {
		all = append(all, f)
	}
	if err := e.p.Reconcile(ctx, all); err != nil {
		t.Fatal(err)
	}
	only(netip.AddrPortFrom(vip, 80), false, "b1")
	echo("after reconcile")

	// Deleting the farms leaves nothing of them.
	e.del(t, prev, "web", "dns", "web6", "keep")
	table = e.nft(t, "list", "table", "inet", "xlb")
	for _, a := range []string{vip.String(), vip6.String(), testutil.VIP4(2).String()} {
		if strings.Contains(table, a) {
			t.Errorf("%s still in the table after the farms were deleted:\n%s", a, table)
		}
	}
	if !strings.Contains(table, "chain "+chainDir4) || !strings.Contains(table, "chain "+chainDir6) {
		t.Errorf("the shared direct chains are gone:\n%s", table)
	}
}
