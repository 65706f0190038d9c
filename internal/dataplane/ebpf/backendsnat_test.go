package ebpf

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestBackendSourceAddr: nftlb's backend source-addr on this plane. In an
// snat farm, connections to a backend with a source-addr leave the LB from
// that address (its snat source), the others from the LB's address
// towards them, then from the farm's source-addr; TCP and UDP. Refused
// outside snat farms.
func TestBackendSourceAddr(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	own := netip.MustParseAddr("10.200.0.250")
	farmSrc := netip.MustParseAddr("10.200.0.251")
	for _, a := range []netip.Addr{own, farmSrc} {
		testutil.Run(t, topo.LB.Name, "ip", "addr", "add", a.String()+"/24", "dev", "br0")
	}
	vip := netip.AddrPortFrom(testutil.VIP4(41), 80)
	dns := netip.AddrPortFrom(testutil.VIP4(42), 53)
	f := farm(t, "bsrc", vip.Addr().String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR, backendsOf(topo, 8080)...)
	u := farm(t, "bsrc-udp", dns.Addr().String(), 53, model.ProtoUDP, model.ModeSNAT, model.SchedRR, backendsOf(topo, 8053)...)
	f.Backends[1].SourceAddr, u.Backends[1].SourceAddr = own, own
	check := func(step string, others netip.Addr) {
		t.Helper()
		for _, g := range []*model.Farm{f, u} {
			if err := p.Check(g); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Reconcile(context.Background(), []*model.Farm{f, u}); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for range 6 {
			for _, ask := range []func() (string, error){
				func() (string, error) { return testutil.AskTCP(topo.Client.NS, vip) },
				func() (string, error) { return testutil.AskUDP(topo.Client.NS, dns) },
			} {
				got, err := ask()
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				name, from, err := testutil.ParseReply(got)
				if err != nil {
					t.Fatal(err)
				}
				seen[name] = true
				want := others
				if name == "be1" {
					want = own
				}
				if from.Addr() != want {
					t.Errorf("%s: %s saw %s, want %s", step, name, from.Addr(), want)
				}
			}
		}
		if len(seen) != 3 {
			t.Errorf("%s: answers from %v, want all three backends", step, seen)
		}
	}
	check("masquerade and a backend source-addr", topo.LBBack4)
	f.SourceAddr, u.SourceAddr = farmSrc, farmSrc
	check("farm and backend source-addr", farmSrc)
	d := f.Clone()
	d.Mode = model.ModeDNAT
	if err := p.Check(&d); err == nil || !strings.Contains(err.Error(), `"source-addr"`) {
		t.Errorf("dnat farm with a backend source-addr: %v, want a refusal naming source-addr", err)
	}
}
