package ebpf

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkNewFlowPersist: the tc program's cost of a new TCP flow (a SYN
// of a client not seen before: schedule, persistence, both conntrack
// entries, next hop) to a farm with persistence srcip, as the kernel times
// one BPF_PROG_TEST_RUN. Each op is one new client. The A/B of static
// sessions' check (lb4_pick) compares this on the old and the new object.
func BenchmarkNewFlowPersist(b *testing.B) {
	testutil.RequireRoot(b)
	ns := fixtureNS(b)
	p := newPlane(b, ns, mountBPFFS(b), []string{"front"}, 1<<20)
	f := farm(b, "persist", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	f.Persistence, f.PersistTTL = model.KeySrcIP, 300
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		c := 0x0c000000 + uint32(i)
		src := netip.AddrFrom4([4]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)})
		pkt := pktSpec{src: src, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build()
		var d time.Duration
		err := testutil.Do(ns, func() error {
			var err error
			_, d, err = p.objs.XlbIngress.Benchmark(pkt, 1, nil)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		total += d
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/flow")
}
