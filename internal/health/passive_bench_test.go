package health

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkPassiveNftConnection is what passive checks cost the nft plane
// per client connection: connections through a farm, one at a time, with
// and without a passive check (conntrack's events read and matched by
// conntrack.Passive, the namespace's accounting on), as this process's
// CPU (user + system, getrusage: the client, the server and the kernel's
// work in their context, the same in both, and the watcher) per
// connection: cpu-µs/conn. Run with -benchtime 3000x -count 3 and compare
// the two.
func BenchmarkPassiveNftConnection(b *testing.B) {
	testutil.RequireRoot(b)
	topo := testutil.NewTopology(b, testutil.TopologyOptions{Backends: 1})
	be := topo.Backends[0]
	testutil.StartTCPServer(b, be.NS, netip.AddrPortFrom(be.IPv4, 8080), "be0")
	ctx := context.Background()
	dp, err := nft.New(ctx, quiet, nft.Options{NetNS: topo.LB.NS})
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	vip := netip.AddrPortFrom(testutil.VIP4(7), 80)
	var cur *model.Farm
	for _, passive := range []bool{false, true} {
		b.Run(fmt.Sprintf("passive=%v", passive), func(b *testing.B) {
			check := ""
			if passive {
				check = `"check":{"passive":{"failures":"5"}},`
			}
			fs, err := model.DecodeFarms([]byte(fmt.Sprintf(`{"name":"web","virtual-addr":"%s","virtual-ports":"80",%s
				"backends":[{"name":"be0","ip-addr":"%s","port":"8080"}]}`, vip.Addr(), check, be.IPv4)),
				func(string) (*model.Farm, bool) { return nil, false })
			if err != nil {
				b.Fatal(err)
			}
			if err := dp.Apply(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: cur, New: &fs[0]}}}); err != nil {
				b.Fatal(err)
			}
			cur = &fs[0]
			conns := make([]net.Conn, 0, 64)
			var r0, r1 syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
			t0 := time.Now()
			for b.Loop() {
				c, err := testutil.DialTCP(topo.Client.NS, vip, 5*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				c.(*net.TCPConn).SetLinger(0) // no TIME_WAIT: thousands of connections
				conns = append(conns, c)
				if len(conns) == cap(conns) {
					for _, c := range conns {
						c.Close()
					}
					conns = conns[:0]
				}
			}
			for _, c := range conns {
				c.Close()
			}
			syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
			cpu := time.Duration(r1.Utime.Nano()-r0.Utime.Nano()+r1.Stime.Nano()-r0.Stime.Nano()) * time.Nanosecond
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/conn")
			b.ReportMetric(float64(r1.Utime.Nano()-r0.Utime.Nano())/1e3/float64(b.N), "user-µs/conn")
			b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "conn/s")
			if passive {
				// The watcher saw them: every connection a success.
				time.Sleep(200 * time.Millisecond)
				counts, err := dp.PassiveCounts(ctx)
				if err != nil || len(counts) != 1 || counts[0].Successes == 0 {
					b.Fatalf("passive counts %+v, %v: the watcher saw no handshake", counts, err)
				}
			}
		})
	}
}
