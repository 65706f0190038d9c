package ebpf

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestModeLocal: nftlb's mode local on this plane. The farm's packets pass
// to the node's own socket on the VIP (TCP and UDP), not to its backends;
// the same farm in mode dnat sends them to the backends. A local farm with
// log or persistence is refused.
func TestModeLocal(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	vip := testutil.VIP4(51)
	topo.LB.AddAddr(t, netip.PrefixFrom(vip, 32))
	tcp, udp := netip.AddrPortFrom(vip, 8080), netip.AddrPortFrom(vip, 8053)
	testutil.StartTCPServer(t, topo.LB.NS, tcp, "lb")
	testutil.StartUDPServer(t, topo.LB.NS, udp, "lb")
	web := farm(t, "own", vip.String(), 8080, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)...)
	dns := farm(t, "own-dns", vip.String(), 8053, model.ProtoUDP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8053)...)
	answer := func(step string, want string) {
		t.Helper()
		for _, ask := range []func() (string, error){
			func() (string, error) { return testutil.AskTCP(topo.Client.NS, tcp) },
			func() (string, error) { return testutil.AskUDP(topo.Client.NS, udp) },
		} {
			got, err := ask()
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			if name, _, _ := testutil.ParseReply(got); !strings.HasPrefix(name, want) {
				t.Errorf("%s: answered by %q, want %s", step, got, want)
			}
		}
	}
	apply := func() {
		t.Helper()
		for _, f := range []*model.Farm{web, dns} {
			if err := p.Check(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Reconcile(context.Background(), []*model.Farm{web, dns}); err != nil {
			t.Fatal(err)
		}
	}
	apply()
	answer("mode dnat", "be")
	web.Mode, dns.Mode = model.ModeLocal, model.ModeLocal
	apply()
	answer("mode local", "lb")
	g := web.Clone()
	g.Log = model.LogInput
	if err := p.Check(&g); err == nil || !strings.Contains(err.Error(), `"mode"`) {
		t.Errorf("local farm with log: %v, want a refusal", err)
	}
}
