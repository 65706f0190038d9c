package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestHashFixtures checks with BPF_PROG_TEST_RUN that the hash scheduler
// sends each flow, for every sched-param this plane takes (IPv4 and IPv6),
// to the backend plan.HashTable and plan.FlowSlot name: the Go model the
// nft plane's `jhash ... mod N seed` follows too. Weighted backends, listed
// out of address order, so the table's layout is checked as well.
func TestHashFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	a := netip.MustParseAddr
	type hashFarm struct {
		f       *model.Farm
		clients []netip.Addr
	}
	var farms []hashFarm
	mk := func(i int, keys model.HashKey, v6 bool) {
		vip, bes, clients := fmt.Sprintf("10.99.1.%d", i), []string{"10.200.0.13:8080", "10.200.0.11:8080", "10.200.0.12:8080"},
			[]netip.Addr{client, a("10.100.0.3"), a("10.100.0.77")}
		if v6 {
			vip, bes, clients = fmt.Sprintf("fd00:99::1:%d", i), []string{"[fd00:200::13]:8080", "[fd00:200::11]:8080", "[fd00:200::12]:8080"},
				[]netip.Addr{a("fd00:100::2"), a("fd00:100::3"), a("fd00:100::77")}
		}
		f := farm(t, fmt.Sprintf("hash%d", i), vip, uint16(80+i), model.ProtoTCP, model.ModeDNAT, model.SchedHash, bes...)
		f.SchedParam = keys
		f.Backends[0].Weight, f.Backends[1].Weight, f.Backends[2].Weight = 1, 2, 3
		if err := f.Validate(); err != nil {
			t.Fatal(err)
		}
		if err := check(f); err != nil {
			t.Fatal(err)
		}
		farms = append(farms, hashFarm{f, clients})
	}
	const sip, dip, sp, dp = model.KeySrcIP, model.KeyDstIP, model.KeySrcPort, model.KeyDstPort
	for i, k := range []model.HashKey{sip, dip, sp, dp, sip | sp, sip | dp, dip | dp, sip | dip, sip | dip | sp | dp} {
		mk(i, k, false)
		mk(20+i, k, true)
	}
	var all []*model.Farm
	for _, h := range farms {
		all = append(all, h.f)
	}
	if err := p.Reconcile(context.Background(), all); err != nil {
		t.Fatal(err)
	}
	for _, h := range farms {
		f := h.f
		active := f.ActiveBackends()
		table := plan.HashTable(active)
		if len(table) != 6 {
			t.Fatalf("farm %s: %d slots, want 6 (weights 1, 2, 3)", f.Name, len(table))
		}
		used := map[netip.Addr]bool{}
		for i := range 30 {
			src, sport := h.clients[i%len(h.clients)], uint16(30000+i*7)
			dport := f.VirtualPorts[0].First
			_, out := runProg(t, ns, p.objs.XlbIngress, pktSpec{src: src, sport: sport, dst: f.VirtualAddr, dport: dport, proto: protoTCP, tcpFlags: tcpSYN}.build())
			got, err := parse(out)
			if err != nil {
				t.Fatalf("farm %s (%s): %v", f.Name, f.SchedParam, err)
			}
			fl := plan.Flow{Src: src, Dst: f.VirtualAddr, SPort: sport, DPort: dport}
			want := active[table[plan.FlowSlot(f.SchedParam, fl, len(table))]].Addr
			if got.dst != want {
				t.Errorf("hash %s: flow %s:%d went to %s, the plan says %s", f.SchedParam, src, sport, got.dst, want)
			}
			used[got.dst] = true
		}
		if k := f.SchedParam; k&(sip|sp) != 0 && len(used) < 2 {
			t.Errorf("hash %s: 30 flows all went to %v", k, used)
		}
	}
}
