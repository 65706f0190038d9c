package ebpf

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkForwardUDP sends b.N UDP datagrams of one flow from the client
// through the LB to a backend, with
//   - direct: to the backend's address, plain kernel forwarding at the LB
//     (the baseline),
//   - nft: to a VIP, the nftables data plane (dnat),
//   - ebpf: to a VIP, this data plane (dnat),
//
// and reports the CPU time of the whole path per packet (client send, LB,
// backend receive: veth runs them all in this process's context), so the
// differences between the three are the balancer's cost. Run with a fixed
// count (-benchtime 200000x): each run builds its own namespaces.
func BenchmarkForwardUDP(b *testing.B) {
	testutil.RequireRoot(b)
	for _, plane := range []string{"direct", "nft", "ebpf"} {
		b.Run("plane="+plane, func(b *testing.B) { benchForward(b, plane) })
	}
}

func benchForward(b *testing.B, plane string) {
	topo := testutil.NewTopology(b, testutil.TopologyOptions{Backends: 1})
	be := netip.AddrPortFrom(topo.Backends[0].IPv4, 8053)
	vip := netip.AddrPortFrom(testutil.VIP4(80), 53)
	f := farm(b, "udp", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, be.String())
	dst := vip
	switch plane {
	case "direct":
		dst = be
	case "nft":
		p, err := nft.New(context.Background(), testLogger(b), nft.Options{NetNS: topo.LB.NS})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
			b.Fatal(err)
		}
	case "ebpf":
		p := newPlane(b, topo.LB.NS, mountBPFFS(b), nil, 16384)
		if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
			b.Fatal(err)
		}
	}
	var sink *net.UDPConn
	if err := testutil.Do(topo.Backends[0].NS, func() error {
		var err error
		sink, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(be))
		if err == nil {
			err = sink.SetReadBuffer(32 << 20)
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	var got atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, err := sink.Read(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	var c *net.UDPConn
	if err := testutil.Do(topo.Client.NS, func() error {
		var err error
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, 64)
	// Warm up: conntrack entries, neighbours, next hops.
	for range 100 {
		if _, err := c.Write(payload); err != nil {
			b.Fatal(err)
		}
	}
	wait := func(want int64) {
		deadline := time.Now().Add(3 * time.Second)
		for last := int64(-1); time.Now().Before(deadline); {
			n := got.Load()
			if n >= want || n == last {
				return
			}
			last = n
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait(100)
	start := got.Load()
	var r0, r1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(payload); err != nil {
			b.Fatal(err)
		}
	}
	wait(start + int64(b.N))
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(syscall.TimevalToNsec(r1.Utime)-syscall.TimevalToNsec(r0.Utime)) +
		time.Duration(syscall.TimevalToNsec(r1.Stime)-syscall.TimevalToNsec(r0.Stime))
	recv := got.Load() - start
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/pkt")
	b.ReportMetric(100*float64(recv)/float64(b.N), "%recv")
}
