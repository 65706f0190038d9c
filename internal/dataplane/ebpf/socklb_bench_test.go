package ebpf

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkSocketLBCPU measures what a node's own connection to a service
// costs per packet (testutil.PathCPU, as BenchmarkLBCPU), one UDP flow of
// 64-byte datagrams from the LB namespace (the node) to a sink in the
// backend, sent three ways in turns:
//
//   - direct: to the backend's address (no service: the baseline);
//   - socklb: to a VIP of this plane with socket-level balancing on (the
//     sending socket belongs to the plane's cgroup): connect() is
//     translated once, then the datagrams leave as direct's do;
//   - nft: to a VIP of the nft plane, which DNATs the node's own traffic
//     in its output hook (a conntrack lookup and NAT per packet).
//
// Reported: cpu-ns/pkt per system; socklb-direct-ns/pkt and
// nft-direct-ns/pkt (medians over chunks of the difference to direct); and
// from the kernel's BPF statistics, how often the tc program and the
// socket programs ran per packet of socklb's flow (tc-runs/pkt,
// sock-runs/pkt: 0 means nothing of xlb on the established path). Run with
// a fixed count (-benchtime 300000x).
func BenchmarkSocketLBCPU(b *testing.B) {
	testutil.RequireRoot(b)
	plain := newLBCPUPath(b, "plain")
	nftPath := newLBCPUPath(b, "nft")
	// The node's own packets are routed before the output hook's DNAT:
	// the VIPs need a route (a node has a default route).
	testutil.Run(b, nftPath.topo.LB.Name, "ip", "route", "add", testutil.VIPNet4.String(), "dev", "br0")
	cg := testutil.NewCgroup(b)
	pl, err := New(context.Background(), testLogger(b), Options{NetNS: plain.topo.LB.NS, PinPath: mountBPFFS(b),
		ConnTableSize: 16384, SocketCgroup: cg.Dir})
	if err != nil {
		b.Fatalf("new ebpf plane: %v", err)
	}
	b.Cleanup(func() { pl.Close() })
	f := farm(b, "udp", plain.vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, plain.be.String())
	if err := pl.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		b.Fatal(err)
	}
	var direct, socklb func(int)
	cg.Enter(b, func() {
		direct = udpSender(b, plain.topo.LB.NS, plain.be)
		socklb = udpSender(b, plain.topo.LB.NS, plain.vip)
	})
	nftSend := udpSender(b, nftPath.topo.LB.NS, nftPath.vip)
	systems := []cpuSender{{"direct", direct}, {"socklb", socklb}, {"nft", nftSend}}
	for _, s := range systems {
		s.send(1000)
	}
	plain.start = plain.wait(b, 2000)
	nftPath.start = nftPath.wait(b, 1000)
	if plain.start != 2000 || nftPath.start != 1000 {
		b.Fatalf("warm-up: the sinks counted %d and %d packets, want 2000 and 1000", plain.start, nftPath.start)
	}

	st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf run time statistics: %v", err)
	}
	defer st.Close()
	progs := []*ebpf.Program{pl.objs.XlbIngress, pl.sock.XlbSockConnect4, pl.sock.XlbSockSendmsg4, pl.sock.XlbSockRecvmsg4, pl.sock.XlbSockGetpeername4}
	runs := func() []uint64 {
		out := make([]uint64, len(progs))
		for i, p := range progs {
			s, err := p.Stats()
			if err != nil {
				b.Fatal(err)
			}
			out[i] = s.RunCount
		}
		return out
	}
	runs0 := runs()
	per := takeTurns(b, systems)
	runs1 := runs()
	if got := plain.wait(b, plain.start+2*int64(b.N)); got != plain.start+2*int64(b.N) {
		b.Errorf("direct and socklb: the sink counted %d of %d packets", got-plain.start, 2*b.N)
	}
	if got := nftPath.wait(b, nftPath.start+int64(b.N)); got != nftPath.start+int64(b.N) {
		b.Errorf("nft: the sink counted %d of %d packets", got-nftPath.start, b.N)
	}
	for _, s := range systems {
		b.ReportMetric(median(per[s.name]), s.name+"-cpu-ns/pkt")
	}
	for _, s := range []string{"socklb", "nft"} {
		var d []float64
		for i := range per["direct"] {
			d = append(d, per[s][i]-per["direct"][i])
		}
		b.ReportMetric(median(d), s+"-direct-ns/pkt")
	}
	// The tc program is attached to every interface of the namespace and
	// ran for packets of both direct's and socklb's flows, if any.
	b.ReportMetric(float64(runs1[0]-runs0[0])/float64(2*b.N), "tc-runs/pkt")
	var sock uint64
	for i := 1; i < len(progs); i++ {
		sock += runs1[i] - runs0[i]
	}
	b.ReportMetric(float64(sock)/float64(b.N), "sock-runs/pkt")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkNotVIP is the tc program's cost for a packet that is neither a
// tracked flow's nor a service's: what each reply of a connection the node
// balanced at the socket pays on arrival (the backend answers the node's
// own address), and what any other traffic through an interface with the
// program pays. Compare with BenchmarkConntrack's path=hit and path=reply
// (what a flow NATed by the tc program pays per packet, each direction)
// and BenchmarkBaseline (an empty program), in the same run.
func BenchmarkNotVIP(b *testing.B) {
	testutil.RequireRoot(b)
	ns := fixtureNS(b)
	p := newPlane(b, ns, mountBPFFS(b), []string{"back"}, 4096)
	web := farm(b, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	if err := p.Reconcile(context.Background(), []*model.Farm{web}); err != nil {
		b.Fatal(err)
	}
	node := netip.MustParseAddr("10.200.0.1")
	pkt := pktSpec{src: benchBackend(0), sport: 8080, dst: node, dport: 40000, proto: protoTCP, tcpFlags: tcpACK,
		ttl: 255, payload: []byte("y"), srcMAC: macBackend(0), dstMAC: macBack}.build()
	before, _ := p.Stats()
	benchRuns(b, p.objs.XlbIngress, func(int) []byte { return pkt })
	after, _ := p.Stats()
	b.ReportMetric(100*float64(after["not_vip"]-before["not_vip"])/float64(b.N*chainLen), "%path")
}
