package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestIntraConnect: nftlb's intra-connect. On (xlb's default) a connection
// the LB host itself opens to the VIP goes to a backend; off it is left
// alone and reaches the LB's own socket on the VIP, while clients are
// balanced either way; on again, the host is balanced again. A
// firewall-mark farm refuses off.
func TestIntraConnect(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	e.LB.AddAddr(t, netip.PrefixFrom(vip, 32))
	testutil.StartTCPServer(t, e.LB.NS, netip.AddrPortFrom(vip, 80), "lb")
	to := netip.AddrPortFrom(vip, 80)
	fromLB := func() string {
		t.Helper()
		got, err := testutil.AskTCP(e.LB.NS, to)
		if err != nil {
			t.Fatalf("tcp from the LB to %s: %v", to, err)
		}
		name, _, _ := testutil.ParseReply(got)
		return name
	}
	prev := map[string]*model.Farm{}
	f := e.farm("intra", vip, 80, model.ProtoTCP, 8080)
	e.put(t, prev, f)
	if name := fromLB(); name != "b0" {
		t.Errorf("intra-connect on: the LB's own connection answered by %q, want the backend b0", name)
	}
	f = f.Clone()
	f.IntraConnectOff = true
	e.put(t, prev, f)
	if name := fromLB(); name != "lb" {
		t.Errorf("intra-connect off: the LB's own connection answered by %q, want the LB's own socket", name)
	}
	if name, _ := e.askTCP(t, to); name != "b0" {
		t.Errorf("intra-connect off: a client answered by %q, want the backend b0", name)
	}
	if out := e.nft(t, "list", "chain", "inet", "xlb", "output"); !strings.Contains(out, "@nolocal4 accept") {
		t.Errorf("output chain:\n%s", out)
	}
	if out := e.nft(t, "list", "set", "inet", "xlb", "nolocal4"); !strings.Contains(out, vip.String()+" . tcp . 80") {
		t.Errorf("nolocal4:\n%s", out)
	}
	f = f.Clone()
	f.IntraConnectOff = false
	e.put(t, prev, f)
	if name := fromLB(); name != "b0" {
		t.Errorf("intra-connect on again: the LB's own connection answered by %q, want the backend b0", name)
	}
	if out := e.nft(t, "list", "set", "inet", "xlb", "nolocal4"); strings.Contains(out, vip.String()) {
		t.Errorf("nolocal4 after on again:\n%s", out)
	}
	m := f.Clone()
	m.VirtualAddr, m.Mark, m.IntraConnectOff = netip.Addr{}, 7, true
	if err := e.p.Check(&m); err == nil || !strings.Contains(err.Error(), `"intra-connect"`) {
		t.Errorf("firewall-mark farm with intra-connect off: %v, want a refusal", err)
	}
	e.del(t, prev, "intra")
}
