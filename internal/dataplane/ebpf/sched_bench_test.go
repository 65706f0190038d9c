package ebpf

import (
	"fmt"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkSchedStateless is the per-packet cost of a scheduler where it is
// paid on every packet: a chain of stlsdnat farms (no conntrack; every
// packet is scheduled), farm k's one backend being farm k+1's VIP, so one
// BPF_PROG_TEST_RUN runs chainLen hops (service lookup, scheduler, slot and
// backend lookups, rewrite, FIB lookup). rr and maglev are the controls of
// an A/B of the hash path (bench/results/hash-ab.md).
func BenchmarkSchedStateless(b *testing.B) {
	testutil.RequireRoot(b)
	for _, s := range []struct {
		name  string
		sched model.Scheduler
		keys  model.HashKey
	}{
		{"rr", model.SchedRR, 0},
		{"maglev", model.SchedMaglev, 0},
		{"hash-srcip", model.SchedHash, model.KeySrcIP},
		{"hash-srcip-srcport", model.SchedHash, model.KeySrcIP | model.KeySrcPort},
	} {
		b.Run("sched="+s.name, func(b *testing.B) {
			ns := fixtureNS(b)
			p := newPlane(b, ns, mountBPFFS(b), []string{"front"}, 4096)
			var farms []*model.Farm
			for k := range chainLen + 1 {
				// UDP: stlsdnat takes rr only without TCP.
				f := farm(b, fmt.Sprintf("chain%d", k), chainVIP(k).String(), 80, model.ProtoUDP, model.ModeStlsDNAT,
					s.sched, fmt.Sprintf("%s:80", chainVIP(k+1)))
				if s.keys != 0 {
					f.SchedParam = s.keys
				}
				farms = append(farms, f)
			}
			benchChain(b, ns, p, farms)
		})
	}
}
