package ebpf

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkTablesHit is the program's own cost per packet of a tracked
// flow (BPF_PROG_TEST_RUN, BenchmarkConntrack's chained hits over 1,000
// connections) with a deny list of n /24 prefixes attached to the farm,
// which none of the clients is in: list=0 is the farm without a policy
// (no farm has one), list=N the farm with the list, every packet looked
// up. bench/tables.sh runs it for the A/B of the policy check.
func BenchmarkTablesHit(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{0, 1000, 1000000} {
		b.Run(fmt.Sprintf("list=%d", n), func(b *testing.B) { benchTablesHit(b, n) })
	}
}

func benchTablesHit(b *testing.B, n int) {
	const conns = 1000
	ns := fixtureNS(b)
	p, err := New(context.Background(), testLogger(b), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(b), ConnTableSize: 4 * conns, ctRefresh: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	web := farm(b, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	if err := p.Reconcile(context.Background(), append(chainFarms(b), web)); err != nil {
		b.Fatal(err)
	}
	routeClients(b, ns)
	fillConntrack(b, p, ns, conns)
	if n > 0 {
		tb := denyTable(n)
		nf := web.Clone()
		nf.Policies = []model.PolicyRef{{Name: tb.Name}}
		if err := p.ApplyTables(context.Background(), plan.TableDiff{Tables: []plan.TableChange{{New: tb}},
			Slots: []plan.SlotChange{{Slot: tb.Slot, New: tb}}, Farms: []plan.FarmChange{{New: &nf}}}); err != nil {
			b.Fatal(err)
		}
	}
	hit := func(i int) []byte {
		c, port := benchConn(i * chainLen % conns)
		return pktSpec{src: c, sport: port, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK, ttl: 255, payload: []byte("x")}.build()
	}
	before, _ := p.Stats()
	benchRuns(b, p.objs.XlbIngress, hit)
	after, _ := p.Stats()
	b.ReportMetric(100*float64(after["ct_fwd"]-before["ct_fwd"])/float64(b.N*chainLen), "%path")
}
