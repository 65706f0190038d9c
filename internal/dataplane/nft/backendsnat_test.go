package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestBackendSourceAddr: in an snat farm, connections to a backend with
// its own source-addr leave the LB from that address; the other backends
// see the farm's source (masquerade here, then the farm's source-addr).
func TestBackendSourceAddr(t *testing.T) {
	e := newEnv(t, 2, false)
	t.Parallel()
	e.startServers(t, 8080)
	// A second address of the LB on the backends' side.
	own := netip.MustParseAddr("10.200.0.250")
	testutil.Run(t, e.LB.Name, "ip", "addr", "add", own.String()+"/24", "dev", "br0")
	prev := map[string]*model.Farm{}
	vip := testutil.VIP4(1)
	f := e.farm("bsrc", vip, 80, model.ProtoTCP, 8080)
	f.Backends[1].SourceAddr = own
	u := e.farm("bsrc-udp", vip, 53, model.ProtoUDP, 8080)
	u.Backends[1].SourceAddr = own
	e.put(t, prev, f, u)
	out := e.nft(t, "list", "table", "inet", "xlb")
	for _, want := range []string{
		"snat ip to ct original ip daddr . meta l4proto . ct original proto-dst . ip daddr map @snatb4",
		"10.99.0.1 . tcp . 80 . 10.200.0.12 : 10.200.0.250",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}
	check := func(step string, want map[string]netip.Addr) {
		t.Helper()
		seen := map[string]bool{}
		for range 8 {
			name, from := e.askTCP(t, netip.AddrPortFrom(vip, 80))
			seen[name] = true
			if from.Addr() != want[name] {
				t.Errorf("%s: tcp: %s saw %s, want %s", step, name, from.Addr(), want[name])
			}
			name, from = e.askUDP(t, netip.AddrPortFrom(vip, 53))
			if from.Addr() != want[name] {
				t.Errorf("%s: udp: %s saw %s, want %s", step, name, from.Addr(), want[name])
			}
		}
		if len(seen) != 2 {
			t.Errorf("%s: answers from %v, want both backends", step, seen)
		}
	}
	check("masquerade and a backend source-addr", map[string]netip.Addr{"b0": e.LBBack4, "b1": own})
	// With the farm's own source-addr, the backend's still wins for b1.
	farmSrc := netip.MustParseAddr("10.200.0.251")
	testutil.Run(t, e.LB.Name, "ip", "addr", "add", farmSrc.String()+"/24", "dev", "br0")
	f.SourceAddr, u.SourceAddr = farmSrc, farmSrc
	e.put(t, prev, f, u)
	check("farm and backend source-addr", map[string]netip.Addr{"b0": farmSrc, "b1": own})
	// Dropping the backend's source-addr removes its element.
	f.Backends[1].SourceAddr = netip.Addr{}
	e.put(t, prev, f)
	if out := e.nft(t, "list", "map", "inet", "xlb", "snatb4"); strings.Contains(out, "10.99.0.1 . tcp . 80") {
		t.Errorf("element of b1 still in snatb4:\n%s", out)
	}
	e.del(t, prev, "bsrc", "bsrc-udp")
	if out := e.nft(t, "list", "map", "inet", "xlb", "snatb4"); strings.Contains(out, "10.99.0.1") {
		t.Errorf("elements left after delete:\n%s", out)
	}
	// Refused where nftlb ignores it.
	d := e.farm("bsrc-dnat", vip, 81, model.ProtoTCP, 8080)
	d.Mode = model.ModeDNAT
	d.Backends[0].SourceAddr = own
	if err := e.p.Check(&d); err == nil || !strings.Contains(err.Error(), `"source-addr"`) {
		t.Errorf("dnat farm with a backend source-addr: %v, want a refusal naming source-addr", err)
	}
}
