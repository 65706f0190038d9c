package ebpf

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestTableXDPCountsOnce: with the XDP program in front of tcx, a packet
// an allow list passes is counted once, by the tcx program it goes on to
// (both counted it: one packet, two in the entry's counters); a packet a
// deny list drops in XDP is counted there, once.
func TestTableXDPCountsOnce(t *testing.T) {
	wl := addrTable(t, "wl", model.ListAllow, 1, 1, client.String(), other.String())
	bl := addrTable(t, "bl", model.ListDeny, 2, 2, other.String())
	ns, p := policyFixture(t, wl, bl)
	syn := func(src netip.Addr) []byte {
		return pktSpec{src: src, dst: vip1, sport: 41000, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build()
	}
	if v, _ := runProg(t, ns, p.objs.XlbXdp, syn(client)); v != xdpPass {
		t.Fatalf("xdp: allowed client: verdict %d, want XDP_PASS", v)
	}
	if v, _ := runProg(t, ns, p.objs.XlbIngress, syn(client)); v != verdictRedirect {
		t.Fatalf("tcx: allowed client: verdict %d, want redirect", v)
	}
	if v, _ := runProg(t, ns, p.objs.XlbXdp, syn(other)); v != xdpDrop {
		t.Fatalf("xdp: denied client: verdict %d, want XDP_DROP", v)
	}
	count := func(tb *model.Table, a netip.Addr) uint64 {
		cs, err := p.TableCounters(context.Background(), tb)
		if err != nil {
			t.Fatal(err)
		}
		return cs[model.AddrKey(netip.PrefixFrom(a, 32))].Packets
	}
	if n := count(wl, client); n != 1 {
		t.Errorf("allow list, one packet passed by XDP and tcx: counted %d, want 1", n)
	}
	if n := count(bl, other); n != 1 {
		t.Errorf("deny list, one packet dropped in XDP: counted %d, want 1", n)
	}
}

// policyFixture is the fixture namespace and plane with the fixture farms,
// the first (web, 10.99.0.1:80) attaching tables as its policies in their
// order.
func policyFixture(t *testing.T, tables ...*model.Table) (netns.NsHandle, *Plane) {
	t.Helper()
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	farms := fixtureFarms(t)
	web := farms[0].Clone()
	for _, tb := range tables {
		web.Policies = append(web.Policies, model.PolicyRef{Name: tb.Name})
	}
	d := created(tables...)
	d.Farms = []plan.FarmChange{{New: &web}}
	applyTables(t, p, d)
	farms[0] = &web
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	return ns, p
}
