package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestSocketLBIntraConnect: nftlb's intra-connect on this plane. On (the
// default) the node's own connections to the VIP are balanced at the
// socket; off the socket programs leave them alone (the LB namespace has
// no route to the VIP: the connection fails, and xlate does not count it),
// while a client's connections are still balanced by the tc program; on
// again, the node's are balanced again.
func TestSocketLBIntraConnect(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 2})
	var bes []string
	for i, b := range topo.Backends {
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), fmt.Sprintf("be%d", i))
		bes = append(bes, netip.AddrPortFrom(b.IPv4, 8080).String())
	}
	cg := testutil.NewCgroup(t)
	p, err := New(context.Background(), testLogger(t), Options{NetNS: topo.LB.NS, PinPath: mountBPFFS(t), ConnTableSize: 16384, SocketCgroup: cg.Dir})
	if err != nil {
		t.Fatalf("new ebpf plane: %v", err)
	}
	defer p.Close()
	web := netip.AddrPortFrom(testutil.VIP4(31), 80)
	f := farm(t, "web", web.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, bes...)
	put := func(off bool) {
		t.Helper()
		g := f.Clone()
		g.IntraConnectOff = off
		if err := p.Check(&g); err != nil {
			t.Fatal(err)
		}
		if err := p.Reconcile(context.Background(), []*model.Farm{&g}); err != nil {
			t.Fatal(err)
		}
	}
	xlate := func() uint64 {
		t.Helper()
		ss, err := p.SockStats()
		if err != nil {
			t.Fatal(err)
		}
		return ss["xlate"]
	}
	put(false)
	checkSpread(t, answeredBy(t, cg.Ask(t, topo.LB.Name, testutil.AskTCPMode, web, 4), web, topo.LBBack4), 4, 2)

	put(true)
	before := xlate()
	if a := cg.Ask(t, topo.LB.Name, testutil.AskTCPMode, web, 1)[0]; a.Err == "" {
		t.Errorf("intra-connect off: the node's own connection reached %q, want it left alone (no route to the VIP)", a.Reply)
	}
	if after := xlate(); after != before {
		t.Errorf("intra-connect off: xlate went from %d to %d", before, after)
	}
	if s, err := testutil.AskTCP(topo.Client.NS, web); err != nil {
		t.Errorf("intra-connect off: a client's connection: %v", err)
	} else if name, _, _ := testutil.ParseReply(s); name != "be0" && name != "be1" {
		t.Errorf("intra-connect off: a client answered by %q", s)
	}

	put(false)
	checkSpread(t, answeredBy(t, cg.Ask(t, topo.LB.Name, testutil.AskTCPMode, web, 4), web, topo.LBBack4), 4, 2)
}
