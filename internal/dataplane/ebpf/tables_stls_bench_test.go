package ebpf

import (
	"fmt"
	"testing"

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
	benchChain(b, ns, p, farms) // one hop passes the policy
}
