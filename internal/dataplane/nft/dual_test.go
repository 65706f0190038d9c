package nft

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestDualChanges: a dual farm serves both VIPs; becoming a single-family
// farm removes its IPv6 half (and only that) in one change, becoming dual
// again brings it back; Reconcile keeps both halves; deleting the farm
// removes both.
func TestDualChanges(t *testing.T) {
	e := newEnv(t, 2, true)
	t.Parallel()
	e.startServers(t, 8080)
	vip4, vip6 := testutil.VIP4(1), testutil.VIP6(1)
	dual := e.farm("web", vip4, 80, model.ProtoTCP, 8080)
	dual.Family, dual.VirtualAddr2 = model.FamilyDual, vip6
	for i, b := range e.Backends {
		b6 := model.NewBackend(fmt.Sprintf("b%d-v6", i))
		b6.Addr, b6.Port = b.IPv6, 8080
		dual.Backends = append(dual.Backends, b6)
	}
	v4only := dual.Clone()
	v4only.Family, v4only.VirtualAddr2 = model.FamilyIPv4, netip.Addr{}
	v4only.Backends = v4only.Backends[:2]
	prev := map[string]*model.Farm{}
	both := func(want6 bool) {
		t.Helper()
		if _, from := e.askTCP(t, netip.AddrPortFrom(vip4, 80)); from.Addr() != e.LBBack4 {
			t.Errorf("ipv4 VIP: backend saw %s", from)
		}
		_, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(vip6, 80))
		if want6 && err != nil {
			t.Errorf("ipv6 VIP: %v", err)
		}
		if !want6 && err == nil {
			t.Errorf("ipv6 VIP still served")
		}
	}
	e.put(t, prev, dual)
	both(true)
	e.put(t, prev, v4only)
	both(false)
	if out := e.nft(t, "list", "table", "inet", "xlb"); hasFarmRules(out, "web/ipv6") || !hasFarmRules(out, "web") {
		t.Errorf("after dual -> ipv4: want farm web's rules only:\n%s", out)
	}
	e.put(t, prev, dual)
	both(true)
	if err := e.p.Reconcile(context.Background(), []*model.Farm{prev["web"]}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	both(true)
	if err := e.p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: prev["web"]}}}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if out := e.nft(t, "list", "table", "inet", "xlb"); strings.Contains(out, "chain f-") {
		t.Errorf("deleted dual farm left chains:\n%s", out)
	}
}

// TestStlsIPv6Listing: the IPv6 stateless rewrite (checksum offset inside
// the written address, see writeAddrPort) lists as plain payload writes.
func TestStlsIPv6Listing(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	name, ns := testutil.NewNetNS(t)
	p := newPlane(t, ns)
	f := model.NewFarm("stls6")
	f.Family, f.VirtualAddr = model.FamilyIPv6, netip.MustParseAddr("fd00:99::6")
	f.VirtualPorts = []model.PortRange{{First: 53, Last: 53}}
	f.Protocol, f.Mode = model.ProtoUDP, model.ModeStlsDNAT
	f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP
	b := model.NewBackend("a")
	b.Addr, b.Port = netip.MustParseAddr("fd00:200::11"), 5353
	f.Backends = []model.Backend{b}
	nf := mustValid(t, p, &f)
	if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: nf}}}); err != nil {
		t.Fatal(err)
	}
	out := testutil.Run(t, name, "nft", "list", "table", "inet", "xlb")
	for _, want := range []string{"ip6 daddr set jhash ip6 saddr", "th dport set 5353", "ip6 saddr set fd00:99::6 th sport set 53"} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}
}
