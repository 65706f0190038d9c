package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkLBCPU measures the CPU the load balancer spends per packet,
// nft plane against this one, in the same run (the target: at least
// 3x less with eBPF). One UDP flow of 64-byte datagrams, sent with sendmmsg
// in batches of 64, is dropped by the backend at prerouting priority -300
// (an nftables counter: the cheapest sink there is, so the backend adds
// little to the path). Over veth the whole path — the sender's syscall, the
// LB namespace's work, the backend's receive up to the drop — runs on the
// sending thread (softirq in its context) or, when the backlog is deferred,
// in ksoftirqd; the CPU time of both (their CPU clocks: exact ns, see
// testutil.PathCPU) is the path's cost. Systems:
//
//   - local: sent from the LB namespace itself to the backend: the path
//     without the LB's receive and forward (the baseline);
//   - direct: from the client to the backend's address, plain kernel
//     forwarding at the LB;
//   - nft: from the client to a VIP, the nftables plane (dnat), with its
//     traffic counters (the default);
//   - nft-nocount: the same without them (--nft-counters=false): the
//     counters' cost is nft's minus this;
//   - ebpf: from the client to a VIP, this plane (dnat); the next hop is
//     the LB's bridge to the backends (plain bpf_redirect);
//   - ebpf-brport: the same with BridgePortRedirect: the next hop is the
//     bridge port's veth, whose peer is the backend's (bpf_redirect_peer).
//
// The five run in turn, in chunks of lbcpuChunk packets, b.N packets each in
// all, so that load from other work on the machine falls on all of them
// alike. Per chunk, a system's LB cost is its cpu-ns/pkt minus local's; the
// reported values are medians over chunks: cpu-ns/pkt per system, lb-ns/pkt
// (direct, nft, ebpf, ebpf-brport), nft/ebpf and nft/ebpf-brport (the ratios of LB costs), and bpf-ns/pkt, the
// eBPF program's own run time from the kernel's BPF statistics. Run with a
// fixed count (-benchtime 300000x); bench/ebpf-cpu.sh runs it several times.
func BenchmarkLBCPU(b *testing.B) {
	testutil.RequireRoot(b)
	plain := newLBCPUPath(b, "plain")
	nftPath := newLBCPUPath(b, "nft")
	nocountPath := newLBCPUPath(b, "nft-nocount")
	ebpfPath := newLBCPUPath(b, "ebpf")
	brPath := newLBCPUPath(b, "ebpf-brport")
	systems := []struct {
		name string
		path *lbcpuPath
		send func(int)
	}{
		{"local", plain, plain.sender(b, plain.topo.LB.NS, plain.be)},
		{"direct", plain, plain.sender(b, plain.topo.Client.NS, plain.be)},
		{"nft", nftPath, nftPath.sender(b, nftPath.topo.Client.NS, nftPath.vip)},
		{"nft-nocount", nocountPath, nocountPath.sender(b, nocountPath.topo.Client.NS, nocountPath.vip)},
		{"ebpf", ebpfPath, ebpfPath.sender(b, ebpfPath.topo.Client.NS, ebpfPath.vip)},
		{"ebpf-brport", brPath, brPath.sender(b, brPath.topo.Client.NS, brPath.vip)},
	}
	paths := []*lbcpuPath{plain, nftPath, nocountPath, ebpfPath, brPath}
	// Warm up: conntrack entries, neighbours, next hops (and the bridge's
	// forwarding entry of the backend's MAC, which the backend's ARP
	// answers taught it).
	for _, s := range systems {
		s.send(1000)
	}
	for _, p := range paths {
		p.start = p.wait(b, p.warm)
	}
	st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf run time statistics: %v", err)
	}
	defer st.Close()
	prog := ebpfPath.prog
	bpf0, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}

	senders := make([]cpuSender, len(systems))
	for i, s := range systems {
		senders[i] = cpuSender{s.name, s.send}
	}
	per := takeTurns(b, senders)
	bpf1, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range paths {
		want := p.start + int64(b.N)
		if p == plain {
			want += int64(b.N)
		}
		if got := p.wait(b, want); got != want {
			b.Errorf("%s: the sink counted %d of %d packets", p.kind, got-p.start, want-p.start)
		}
	}
	for _, s := range systems {
		b.ReportMetric(median(per[s.name]), s.name+"-cpu-ns/pkt")
	}
	lb := map[string][]float64{}
	var ratio []float64
	var brRatio []float64
	var counting []float64
	for i := range per["local"] {
		for _, s := range []string{"direct", "nft", "nft-nocount", "ebpf", "ebpf-brport"} {
			lb[s] = append(lb[s], per[s][i]-per["local"][i])
		}
		counting = append(counting, per["nft"][i]-per["nft-nocount"][i])
		if e := per["ebpf"][i] - per["local"][i]; e > 0 {
			ratio = append(ratio, (per["nft"][i]-per["local"][i])/e)
		}
		if e := per["ebpf-brport"][i] - per["local"][i]; e > 0 {
			brRatio = append(brRatio, (per["nft"][i]-per["local"][i])/e)
		}
	}
	for _, s := range []string{"direct", "nft", "nft-nocount", "ebpf", "ebpf-brport"} {
		b.ReportMetric(median(lb[s]), s+"-lb-ns/pkt")
	}
	b.ReportMetric(median(counting), "nft-counters-ns/pkt")
	if len(ratio) > 0 {
		b.ReportMetric(median(ratio), "nft/ebpf")
	}
	if len(brRatio) > 0 {
		b.ReportMetric(median(brRatio), "nft/ebpf-brport")
	}
	if runs := bpf1.RunCount - bpf0.RunCount; runs > 0 {
		b.ReportMetric(float64(bpf1.Runtime-bpf0.Runtime)/float64(runs), "bpf-ns/pkt")
	}
	b.ReportMetric(0, "ns/op")
}

// lbcpuChunk is how many packets one system sends before the next takes
// its turn.
const lbcpuChunk = 10000

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// lbcpuPath is one client -> LB -> backend topology with a UDP sink in the
// backend and, for kind nft or ebpf, that data plane balancing a VIP.
type lbcpuPath struct {
	kind        string
	topo        *testutil.Topology
	be, vip     netip.AddrPort
	prog        *ebpf.Program
	warm, start int64
}

var reSinkCounter = regexp.MustCompile(`counter packets (\d+)`)

func newLBCPUPath(b *testing.B, kind string) *lbcpuPath {
	p := &lbcpuPath{kind: kind}
	p.topo = testutil.NewTopology(b, testutil.TopologyOptions{Backends: 1})
	p.be = netip.AddrPortFrom(p.topo.Backends[0].IPv4, 8053)
	p.vip = netip.AddrPortFrom(testutil.VIP4(81), 53)
	f := farm(b, "udp", p.vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, p.be.String())
	switch kind {
	case "nft", "nft-nocount":
		pl, err := nft.New(context.Background(), testLogger(b), nft.Options{NetNS: p.topo.LB.NS, NoCounters: kind == "nft-nocount"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pl.Close() })
		if err := pl.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
			b.Fatal(err)
		}
	case "ebpf", "ebpf-brport":
		pl, err := New(context.Background(), testLogger(b), Options{NetNS: p.topo.LB.NS, PinPath: mountBPFFS(b),
			ConnTableSize: 16384, BridgePortRedirect: kind == "ebpf-brport"})
		if err != nil {
			b.Fatalf("new ebpf plane: %v", err)
		}
		b.Cleanup(func() { pl.Close() })
		if err := pl.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
			b.Fatal(err)
		}
		p.prog = pl.objs.XlbIngress
	}
	ns := p.topo.Backends[0].Name
	testutil.Run(b, ns, "nft", "add table ip sink")
	testutil.Run(b, ns, "nft", "add chain ip sink pre { type filter hook prerouting priority -300; policy accept; }")
	testutil.Run(b, ns, "nft", fmt.Sprintf("add rule ip sink pre udp dport %d counter drop", p.be.Port()))
	return p
}

// sunk returns the packets the sink dropped so far.
func (p *lbcpuPath) sunk(b *testing.B) int64 {
	m := reSinkCounter.FindStringSubmatch(testutil.Run(b, p.topo.Backends[0].Name, "nft", "list table ip sink"))
	if m == nil {
		b.Fatal("no counter in the sink")
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// wait waits (at most 3 s) until the sink counted want packets.
func (p *lbcpuPath) wait(b *testing.B, want int64) int64 {
	deadline := time.Now().Add(3 * time.Second)
	n := p.sunk(b)
	for n < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = p.sunk(b)
	}
	return n
}

// sender returns a function sending n datagrams from namespace ns to dst
// (udpSender); the path's warm-up then waits for 1000 more at the sink.
func (p *lbcpuPath) sender(b *testing.B, ns netns.NsHandle, dst netip.AddrPort) func(int) {
	p.warm += 1000
	return udpSender(b, ns, dst)
}

// BenchmarkLBCPUXDP is BenchmarkLBCPU over a chain of veth pairs (client --
// LB -- backend, no bridge, as native XDP needs), with the XDP fast path:
//
//   - local: sent from the LB namespace straight to the backend (baseline);
//   - nft: client -> VIP, the nftables plane (dnat);
//   - ebpf-tcx: client -> VIP, this plane in dsr mode, tcx only;
//   - ebpf-xdp: the same with --xdp native (the fast path forwards the
//     tracked flow's packets; about one a second goes through tcx).
//
// Every chain has transmit checksum offload off on the client and GRO on
// the backend's veth (native XDP on veth needs both; the others get the
// same, to compare like with like). The backend drops at prerouting -300.
func BenchmarkLBCPUXDP(b *testing.B) {
	testutil.RequireRoot(b)
	vip := netip.AddrPortFrom(testutil.VIP4(82), 53)
	type system struct {
		name  string
		chain *xdpChain
		send  func(int)
		progs []*ebpf.Program
	}
	var systems []*system
	for _, name := range []string{"local", "nft", "ebpf-tcx", "ebpf-xdp"} {
		c := newXDPChain(b, vip.Addr())
		setTxChecksum(b, c.client, "c0", false)
		setGRO(b, c.backend, "b0", true)
		be := netip.AddrPortFrom(c.beIP, 53)
		s := &system{name: name, chain: c}
		switch name {
		case "local":
			s.send = udpSender(b, c.lb, be)
		case "nft":
			f := farm(b, "udp", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, be.String())
			pl, err := nft.New(context.Background(), testLogger(b), nft.Options{NetNS: c.lb})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { pl.Close() })
			if err := pl.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
				b.Fatal(err)
			}
			s.send = udpSender(b, c.client, vip)
		default:
			mode := XDPOff
			if name == "ebpf-xdp" {
				mode = XDPNative
			}
			f := farm(b, "udp", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDSR, model.SchedRR, netip.AddrPortFrom(c.beIP, 0).String())
			pl, err := New(context.Background(), testLogger(b), Options{NetNS: c.lb, PinPath: mountBPFFS(b),
				ConnTableSize: 16384, Interfaces: []string{"lc", "lb"}, XDP: mode})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { pl.Close() })
			if err := pl.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
				b.Fatal(err)
			}
			s.progs = []*ebpf.Program{pl.objs.XlbIngress}
			if mode != XDPOff {
				s.progs = append(s.progs, pl.objs.XlbXdp)
			}
			s.send = udpSender(b, c.client, vip)
		}
		sinkRules(b, c.backendName, 53)
		systems = append(systems, s)
	}
	start := map[string]int64{}
	for _, s := range systems {
		s.send(1000)
	}
	for _, s := range systems {
		start[s.name] = sinkWait(b, s.chain.backendName, 1000)
	}
	st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf run time statistics: %v", err)
	}
	defer st.Close()
	progStats := func(s *system) (time.Duration, uint64) {
		var d time.Duration
		var n uint64
		for _, p := range s.progs {
			ps, err := p.Stats()
			if err != nil {
				b.Fatal(err)
			}
			d += ps.Runtime
			if p.Type() == ebpf.XDP || len(s.progs) == 1 {
				n += ps.RunCount // packets: each meets the first program once
			}
		}
		return d, n
	}
	bpf0 := map[string][2]float64{}
	for _, s := range systems {
		d, n := progStats(s)
		bpf0[s.name] = [2]float64{float64(d), float64(n)}
	}

	senders := make([]cpuSender, len(systems))
	for i, s := range systems {
		senders[i] = cpuSender{s.name, s.send}
	}
	per := takeTurns(b, senders)
	for _, s := range systems {
		if len(s.progs) > 0 {
			d, n := progStats(s)
			if runs := float64(n) - bpf0[s.name][1]; runs > 0 {
				b.ReportMetric((float64(d)-bpf0[s.name][0])/runs, s.name+"-bpf-ns/pkt")
			}
		}
		want := start[s.name] + int64(b.N)
		if got := sinkWait(b, s.chain.backendName, want); got != want {
			b.Errorf("%s: the sink counted %d of %d packets", s.name, got-start[s.name], b.N)
		}
		b.ReportMetric(median(per[s.name]), s.name+"-cpu-ns/pkt")
	}
	lb := map[string][]float64{}
	ratio := map[string][]float64{}
	for i := range per["local"] {
		for _, s := range []string{"nft", "ebpf-tcx", "ebpf-xdp"} {
			lb[s] = append(lb[s], per[s][i]-per["local"][i])
		}
		for _, s := range []string{"ebpf-tcx", "ebpf-xdp"} {
			if e := per[s][i] - per["local"][i]; e > 0 {
				ratio[s] = append(ratio[s], (per["nft"][i]-per["local"][i])/e)
			}
		}
	}
	for _, s := range []string{"nft", "ebpf-tcx", "ebpf-xdp"} {
		b.ReportMetric(median(lb[s]), s+"-lb-ns/pkt")
	}
	for _, s := range []string{"ebpf-tcx", "ebpf-xdp"} {
		if len(ratio[s]) > 0 {
			b.ReportMetric(median(ratio[s]), "nft/"+s)
		}
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkLBCPUVeth is BenchmarkLBCPU over a chain of veth pairs (client
// -- LB -- backend, no bridge), where the LB's next hop towards the backend
// is a veth whose peer is in the backend's namespace, as a pod's is:
//
//   - local: sent from the LB namespace straight to the backend (baseline);
//   - nft: client -> VIP, the nftables plane (dnat);
//   - ebpf: client -> VIP, this plane (dnat): bpf_redirect_peer to the
//     backend's veth;
//   - ebpf-plain: the same with plain bpf_redirect (xlb_peer_tx left
//     empty), what this plane did before the peer redirect.
//
// The systems take turns as in BenchmarkLBCPU; the backend drops at
// prerouting -300.
func BenchmarkLBCPUVeth(b *testing.B) {
	testutil.RequireRoot(b)
	vip := netip.AddrPortFrom(testutil.VIP4(83), 53)
	type system struct {
		name  string
		chain *xdpChain
		send  func(int)
		prog  *ebpf.Program
	}
	names := []string{"local", "nft", "ebpf", "ebpf-plain"}
	var systems []*system
	for _, name := range names {
		c := newXDPChain(b, vip.Addr())
		be := netip.AddrPortFrom(c.beIP, 53)
		s := &system{name: name, chain: c, send: udpSender(b, c.client, vip)}
		f := farm(b, "udp", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, be.String())
		switch name {
		case "local":
			s.send = udpSender(b, c.lb, be)
		case "nft":
			pl, err := nft.New(context.Background(), testLogger(b), nft.Options{NetNS: c.lb})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { pl.Close() })
			if err := pl.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
				b.Fatal(err)
			}
		default:
			pl, err := New(context.Background(), testLogger(b), Options{NetNS: c.lb, PinPath: mountBPFFS(b),
				ConnTableSize: 16384, Interfaces: []string{"lc", "lb"}, noPeerRedirect: name == "ebpf-plain"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { pl.Close() })
			if err := pl.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
				b.Fatal(err)
			}
			s.prog = pl.objs.XlbIngress
		}
		sinkRules(b, c.backendName, 53)
		systems = append(systems, s)
	}
	start := map[string]int64{}
	for _, s := range systems {
		s.send(1000)
	}
	for _, s := range systems {
		start[s.name] = sinkWait(b, s.chain.backendName, 1000)
	}
	st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("enable bpf run time statistics: %v", err)
	}
	defer st.Close()
	bpf0 := map[string]*ebpf.ProgramStats{}
	for _, s := range systems {
		if s.prog != nil {
			if bpf0[s.name], err = s.prog.Stats(); err != nil {
				b.Fatal(err)
			}
		}
	}

	senders := make([]cpuSender, len(systems))
	for i, s := range systems {
		senders[i] = cpuSender{s.name, s.send}
	}
	per := takeTurns(b, senders)
	for _, s := range systems {
		if s.prog != nil {
			ps, err := s.prog.Stats()
			if err != nil {
				b.Fatal(err)
			}
			if runs := ps.RunCount - bpf0[s.name].RunCount; runs > 0 {
				b.ReportMetric(float64(ps.Runtime-bpf0[s.name].Runtime)/float64(runs), s.name+"-bpf-ns/pkt")
			}
		}
		want := start[s.name] + int64(b.N)
		if got := sinkWait(b, s.chain.backendName, want); got != want {
			b.Errorf("%s: the sink counted %d of %d packets", s.name, got-start[s.name], b.N)
		}
		b.ReportMetric(median(per[s.name]), s.name+"-cpu-ns/pkt")
	}
	lb := map[string][]float64{}
	ratio := map[string][]float64{}
	for i := range per["local"] {
		for _, s := range names[1:] {
			lb[s] = append(lb[s], per[s][i]-per["local"][i])
		}
		for _, s := range names[2:] {
			if e := per[s][i] - per["local"][i]; e > 0 {
				ratio[s] = append(ratio[s], (per["nft"][i]-per["local"][i])/e)
			}
		}
	}
	for _, s := range names[1:] {
		b.ReportMetric(median(lb[s]), s+"-lb-ns/pkt")
	}
	for _, s := range names[2:] {
		if len(ratio[s]) > 0 {
			b.ReportMetric(median(ratio[s]), "nft/"+s)
		}
	}
	b.ReportMetric(0, "ns/op")
}

// udpSender returns a function sending n 64-byte datagrams from namespace
// ns to dst with sendmmsg, 64 at a time.
//
// The socket is a plain blocking one, not a net.UDPConn: Go's poller
// registers a net.UDPConn with epoll, and every datagram freed after its
// transmit then signals write space (EPOLLOUT) there. As soon as any
// goroutine of the process waits in the poller (the plane's link watch, a
// ring buffer reader, an API server), each signal wakes the poller's thread,
// and the sender pays the wakeups: measured, 1,000 - 1,400 ns per packet
// more for every system, the baseline included.
func udpSender(b *testing.B, ns netns.NsHandle, dst netip.AddrPort) func(int) {
	return udpSenderFrom(b, ns, netip.Addr{}, dst)
}

// udpSenderFrom is udpSender from source address src (any if not valid).
func udpSenderFrom(b *testing.B, ns netns.NsHandle, src netip.Addr, dst netip.AddrPort) func(int) {
	af := unix.AF_INET
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	if dst.Addr().Is6() {
		af = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
	}
	fd := -1
	if err := testutil.Do(ns, func() error {
		var err error
		if fd, err = unix.Socket(af, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if src.IsValid() {
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: src.As4()}); err != nil {
				return err
			}
		}
		return unix.Connect(fd, sa)
	}); err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		b.Fatalf("udp socket to %s: %v", dst, err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	const batch = 64
	// struct mmsghdr (64-bit Linux): a msghdr and the bytes sent.
	type mmsghdr struct {
		hdr unix.Msghdr
		len uint32
		_   [4]byte
	}
	payload := make([]byte, 64)
	iov := unix.Iovec{Base: &payload[0]}
	iov.SetLen(len(payload))
	msgs := make([]mmsghdr, batch)
	for i := range msgs {
		msgs[i].hdr.Iov = &iov
		msgs[i].hdr.SetIovlen(1)
	}
	return func(n int) {
		for n > 0 {
			k, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])),
				uintptr(min(n, batch)), 0, 0, 0)
			if errno != 0 {
				b.Fatalf("sendmmsg: %v", errno)
			}
			n -= int(k)
		}
		runtime.KeepAlive(payload)
		runtime.KeepAlive(&iov)
	}
}

// sinkRules makes the namespace nsName drop UDP to port at prerouting
// priority -300, counting.
func sinkRules(b *testing.B, nsName string, port uint16) {
	testutil.Run(b, nsName, "nft", "add table ip sink")
	testutil.Run(b, nsName, "nft", "add chain ip sink pre { type filter hook prerouting priority -300; policy accept; }")
	testutil.Run(b, nsName, "nft", fmt.Sprintf("add rule ip sink pre udp dport %d counter drop", port))
}

// sinkWait waits (at most 3 s) until the sink of nsName counted want
// packets, and returns its count.
func sinkWait(b *testing.B, nsName string, want int64) int64 {
	count := func() int64 {
		m := reSinkCounter.FindStringSubmatch(testutil.Run(b, nsName, "nft", "list table ip sink"))
		if m == nil {
			b.Fatal("no counter in the sink")
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		return n
	}
	deadline := time.Now().Add(3 * time.Second)
	n := count()
	for n < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = count()
	}
	return n
}

// cpuSender is a system of a CPU-per-packet benchmark: its name and a
// function that sends n packets through it.
type cpuSender struct {
	name string
	send func(n int)
}

// takeTurns sends b.N packets through each system, in chunks of lbcpuChunk
// with the systems taking turns (so load from other work falls on all of
// them alike), with the timer running, and returns each system's CPU per
// packet of every chunk (testutil.PathCPU, on this locked OS thread).
func takeTurns(b *testing.B, systems []cpuSender) map[string][]float64 {
	return takeTurnsAlternating(b, systems, false)
}

// takeTurnsAlternating is takeTurns, with the systems' order reversed
// every other chunk if alternate (so neither side of a pair always follows
// the other: the first system of a turn finds the caches the last one
// left).
func takeTurnsAlternating(b *testing.B, systems []cpuSender, alternate bool) map[string][]float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	per := map[string][]float64{}
	b.ResetTimer()
	for chunk, done := 0, 0; done < b.N; chunk, done = chunk+1, done+lbcpuChunk {
		n := min(lbcpuChunk, b.N-done)
		for k := range systems {
			s := systems[k]
			if alternate && chunk%2 == 1 {
				s = systems[len(systems)-1-k]
			}
			c0 := testutil.PathCPU(b)
			s.send(n)
			per[s.name] = append(per[s.name], float64(testutil.PathCPU(b)-c0)/float64(n))
		}
	}
	b.StopTimer()
	return per
}
