package ebpf

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestTrafficHairpin: a backend of a dnat farm connecting to the farm's VIP
// and given itself is masqueraded (it sees the LB's address, and the TCP
// connection completes); another client keeps its own address.
func TestTrafficHairpin(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	vip := netip.AddrPortFrom(testutil.VIP4(3), 80)
	f := farm(t, "web", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)[:1]...)
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	be := topo.Backends[0]
	for i := range 3 {
		c, err := testutil.DialTCPFrom(be.NS, netip.AddrPortFrom(be.IPv4, 0), vip, 2*time.Second)
		if err != nil {
			t.Fatalf("hairpin connection %d: %v", i, err)
		}
		got, err := testutil.ReadLine(c, 2*time.Second)
		c.Close()
		if err != nil {
			t.Fatalf("hairpin reply %d: %v", i, err)
		}
		name, from, err := testutil.ParseReply(got)
		if err != nil {
			t.Fatal(err)
		}
		if name != "be0" || from.Addr() != topo.LBBack4 {
			t.Errorf("hairpin %d: answered by %s seeing %s, want be0 seeing %s", i, name, from, topo.LBBack4)
		}
	}
	ask(t, 3, func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) }, topo.Client.IPv4)
}
