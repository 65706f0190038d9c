package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestSNATPorts: with Options.SNATPorts (--snat-ports), snat connections
// leave the node from source ports of that range only, masqueraded or
// from the farm's source-addr: nodes that share a source-addr (docs/ha.md)
// never pick the same port. Without it, the kernel keeps the client's
// ports (outside this range here).
func TestSNATPorts(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 1})
	p, err := New(context.Background(), testLogger(), Options{NetNS: topo.LB.NS, SNATPorts: model.PortRange{First: 20000, Last: 20099}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e := &env{Topology: topo, p: p}
	e.startServers(t, 8080)
	shared := netip.MustParseAddr("10.200.0.251")
	testutil.Run(t, e.LB.Name, "ip", "addr", "add", shared.String()+"/24", "dev", "br0")
	vip := testutil.VIP4(1)
	masq := e.farm("masq", vip, 80, model.ProtoTCP, 8080)
	fixed := e.farm("fixed", vip, 81, model.ProtoTCP, 8080)
	fixed.SourceAddr = shared
	prev := map[string]*model.Farm{}
	e.put(t, prev, masq, fixed)
	if out := e.nft(t, "list", "chain", "inet", "xlb", "postrouting"); strings.Count(out, ":20000-20099") < 2 {
		t.Errorf("postrouting lacks the port range:\n%s", out)
	}
	for _, c := range []struct {
		port uint16
		from netip.Addr
	}{{80, e.LBBack4}, {81, shared}} {
		for range 6 {
			_, from := e.askTCP(t, netip.AddrPortFrom(vip, c.port))
			if from.Addr() != c.from || from.Port() < 20000 || from.Port() > 20099 {
				t.Errorf("port %d: the backend saw %s, want %s with a port in 20000-20099", c.port, from, c.from)
			}
		}
	}
}
