package ebpf

import (
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkTablesStateless is the program's own cost per packet of a
// stateless farm's policy check, paid on every packet (no conntrack entry
// to cache the verdict in): BenchmarkSchedStateless's chain of stlsdnat
// farms (farm k's one backend is farm k+1's VIP, chainLen hops a test
// run), every farm with the deny list of n /24 prefixes as its blacklist,
// which the client is not in. list=none: no farm has policies; list=0: an
// empty deny list. bench/tables-ab.sh runs it for the A/B of the
// stateless policy check.
func BenchmarkTablesStateless(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{-1, 0, 1000, 1000000} {
		name := fmt.Sprintf("list=%d", n)
		if n < 0 {
			name = "list=none"
		}
		b.Run(name, func(b *testing.B) { benchTablesStateless(b, n) })
	}
}

func benchTablesStateless(b *testing.B, n int) {
	p, pkt := stlsChain(b, n) // one hop passes the policy
	benchRuns(b, p.objs.XlbIngress, func(int) []byte { return pkt })
}

// BenchmarkTablesStatelessPair is BenchmarkTablesStateless's ratio measured
// in pairs: two planes made once (farms without policies, and the same
// farms with the deny list of n /24 prefixes), then runs of the two taking
// turns (the order alternating), so a change in the machine's load falls
// on both alike. Reports each plane's ns per packet and none/list, the
// rate with the list against the rate without it in the program's own
// time.
func BenchmarkTablesStatelessPair(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{0, 1000000} {
		b.Run(fmt.Sprintf("list=%d", n), func(b *testing.B) {
			none, pkt := stlsChain(b, -1)
			list, _ := stlsChain(b, n)
			progs := [2]*ebpf.Program{none.objs.XlbIngress, list.objs.XlbIngress}
			var total [2]time.Duration
			for i := 0; b.Loop(); i++ {
				for j := range 2 {
					w := (i + j) % 2
					_, d, err := progs[w].Benchmark(pkt, chainLen, nil)
					if err != nil {
						b.Fatal(err)
					}
					total[w] += d
				}
			}
			b.ReportMetric(float64(total[0].Nanoseconds())/float64(b.N), "none-ns/pkt")
			b.ReportMetric(float64(total[1].Nanoseconds())/float64(b.N), "list-ns/pkt")
			b.ReportMetric(float64(total[0])/float64(total[1]), "none/list")
		})
	}
}

// stlsChain is benchTablesStateless's plane: a chain of stlsdnat farms
// (n < 0: no policies, else each with a deny list of n /24 prefixes),
// checked to pass one hop, and the packet that does.
func stlsChain(b *testing.B, n int) (*Plane, []byte) {
	ns := fixtureNS(b)
	p := newPlane(b, ns, mountBPFFS(b), []string{"front"}, 4096)
	var farms []*model.Farm
	for k := range chainLen + 1 {
		farms = append(farms, farm(b, fmt.Sprintf("chain%d", k), chainVIP(k).String(), 80, model.ProtoUDP,
			model.ModeStlsDNAT, model.SchedRR, fmt.Sprintf("%s:80", chainVIP(k+1))))
	}
	if n >= 0 {
		tb := denyTable(n)
		d := created(tb)
		for _, f := range farms {
			f.Policies = []model.PolicyRef{{Name: tb.Name}}
			d.Farms = append(d.Farms, plan.FarmChange{New: f})
		}
		applyTables(b, p, d)
	}
	return p, chainPacket(b, ns, p, farms)
}
