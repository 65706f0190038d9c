package ebpf

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// Benchmarks of the program's per-packet cost with BPF_PROG_TEST_RUN, as the
// kernel measures it (the syscall is not counted). Run them with
// bench/ebpf.sh, which writes bench/results/ebpf-conntrack.md.
//
// A test run repeats the program on one packet, which the program rewrites
// in place; the benchmark makes every rewrite lead to the next measured
// packet, so one syscall runs the real path chainLen times in a row, each
// time on another conntrack entry (or another new flow):
//   - hit: the forward entry of connection j translates its packet into
//     connection j+1's forward packet (the same helpers as a dnat hit: two
//     field rewrites, TTL, MACs from the cached next hop; no FIB lookup).
//   - hit-cached: the same between two connections only, whose entries
//     stay in the CPU's caches (bursts of packets on few connections).
//   - reply: the same over the reply entries.
//   - new: a chain of services whose backend is the next service's VIP: a
//     SYN becomes chainLen new flows (schedule, both conntrack entries,
//     bpf_fib_lookup).
// Op k starts at connection k*chainLen, so a run walks the whole table and
// a large table's cache misses count.
//
// BenchmarkConntrack/conns=N/table=T/path=P reports ns/pkt for N tracked
// connections (2N entries filled from Go) in a table of 2N ("full": every
// new flow evicts) or 4N ("sized") entries, and %path, the share of runs
// that took the measured path. BenchmarkBaseline is an empty tc program.

// chainLen hops per run: the packet starts with TTL 255 and each hop
// decrements it.
const chainLen = 250

func BenchmarkBaseline(b *testing.B) {
	testutil.RequireRoot(b)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, -1),
			asm.Return(),
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer prog.Close()
	pkt := pktSpec{src: client, sport: 1000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK}.build()
	benchRuns(b, prog, func(int) []byte { return pkt })
}

// benchRuns runs the program chainLen times per op on op i's packet and
// reports the kernel's time per run.
func benchRuns(b *testing.B, prog *ebpf.Program, pkt func(i int) []byte) {
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		_, d, err := prog.Benchmark(pkt(i), chainLen, nil)
		if err != nil {
			b.Fatal(err)
		}
		total += d
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/pkt")
}

// benchConn is connection i of a benchmark: client 11.x.y.z:port -> VIP.
func benchConn(i int) (netip.Addr, uint16) {
	c := 0x0b000000 + uint32(i>>4)
	return netip.AddrFrom4([4]byte{byte(c >> 24), byte(c >> 16), byte(c >> 8), byte(c)}), uint16(10000 + i&15)
}

func BenchmarkConntrack(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []struct {
		name string
		n    int
	}{{"1k", 1000}, {"64k", 65536}, {"1M", 1 << 20}, {"4M", 4 << 20}} {
		b.Run("conns="+n.name, func(b *testing.B) {
			for _, tbl := range []struct {
				name string
				mult int
			}{{"full", 2}, {"sized", 4}} {
				b.Run("table="+tbl.name, func(b *testing.B) { benchTable(b, n.n, n.n*tbl.mult) })
			}
		})
	}
}

func benchTable(b *testing.B, conns, entries int) {
	ns := fixtureNS(b)
	p, err := New(context.Background(), testLogger(b), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(b), ConnTableSize: entries, ctRefresh: time.Hour})
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
	start := time.Now()
	fillConntrack(b, p, ns, conns)
	if info, err := p.objs.XlbCt.Info(); err == nil {
		if ml, ok := info.Memlock(); ok {
			b.Logf("conntrack: %d entries, memlock %d KiB (%d bytes/entry); filled %d connections in %s",
				entries, ml>>10, ml/uint64(entries), conns, time.Since(start).Round(time.Millisecond))
		}
	}
	prog := p.objs.XlbIngress
	hit := func(i int) []byte {
		c, port := benchConn(i * chainLen % conns)
		return pktSpec{src: c, sport: port, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK, ttl: 255, payload: []byte("x")}.build()
	}
	reply := func(i int) []byte {
		j := i * chainLen % conns
		c, port := benchConn(j)
		return pktSpec{src: benchBackend(j), sport: 8080, dst: c, dport: port, proto: protoTCP, tcpFlags: tcpACK, ttl: 255, payload: []byte("y"),
			srcMAC: macBackend(j % 3), dstMAC: macBack}.build()
	}
	next := conns
	fresh := func(int) []byte {
		next++
		c, port := benchConn(next)
		return pktSpec{src: c, sport: port, dst: chainVIP(0), dport: 80, proto: protoTCP, tcpFlags: tcpSYN, ttl: 255}.build()
	}
	// Two connections past the filled ones translate into each other: a
	// burst of packets on few connections, whose entries stay in cache.
	x, y := conns+100, conns+101
	pingPong(b, p, conns, x, y)
	burst := func(int) []byte {
		c, port := benchConn(x)
		return pktSpec{src: c, sport: port, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK, ttl: 255, payload: []byte("x")}.build()
	}
	for _, path := range []struct {
		name string
		pkt  func(int) []byte
		stat string
	}{{"hit", hit, "ct_fwd"}, {"hit-cached", burst, "ct_fwd"}, {"reply", reply, "ct_reply"}, {"new", fresh, "new_flow"}} {
		b.Run("path="+path.name, func(b *testing.B) {
			before, _ := p.Stats()
			benchRuns(b, prog, path.pkt)
			after, _ := p.Stats()
			b.ReportMetric(100*float64(after[path.stat]-before[path.stat])/float64(b.N*chainLen), "%path")
		})
	}
}

// pingPong adds forward entries making connections x and y translate into
// each other.
func pingPong(tb testing.TB, p *Plane, conns, x, y int) {
	// A filled connection's forward entry (some may have been evicted)
	// gives the cached next hop and timestamps.
	var hit xlbCtVal
	found := false
	for j := 0; j < conns && !found; j++ {
		c, port := benchConn(j)
		k := xlbCtKey{Src: [4]uint32{ne32(c)}, Dst: [4]uint32{ne32(vip1)}, Sport: ne16(port), Dport: ne16(80), Proto: protoTCP, Family: afInet}
		found = p.objs.XlbCt.Lookup(k, &hit) == nil
	}
	if !found {
		tb.Fatal("no filled connection left in the table")
	}
	// In a full table an insert evicts the least recently used entry,
	// which may be one just inserted: insert until both are there.
	for try := 0; ; try++ {
		present := 0
		for _, pair := range [][2]int{{x, y}, {y, x}} {
			c, port := benchConn(pair[0])
			nc, nport := benchConn(pair[1])
			k := xlbCtKey{Src: [4]uint32{ne32(c)}, Dst: [4]uint32{ne32(vip1)}, Sport: ne16(port), Dport: ne16(80), Proto: protoTCP, Family: afInet}
			v := hit
			v.Src, v.Sport, v.Dst, v.Dport = [4]uint32{ne32(nc)}, ne16(nport), k.Dst, k.Dport
			var cur xlbCtVal
			if p.objs.XlbCt.Lookup(k, &cur) == nil && cur == v {
				present++
				continue
			}
			if err := p.objs.XlbCt.Update(k, v, ebpf.UpdateAny); err != nil {
				tb.Fatal(err)
			}
		}
		if present == 2 {
			return
		}
		if try == 100 {
			tb.Fatal("ping-pong entries keep being evicted")
		}
	}
}

func benchBackend(j int) netip.Addr { return netip.AddrFrom4([4]byte{10, 200, 0, byte(11 + j%3)}) }

// benchChain puts a chain of farms (each forwarding to the next's VIP,
// chainVIP) in p and benchmarks one UDP packet through the first, after
// checking one hop: the packet leaves for the next VIP.
func benchChain(b *testing.B, ns netns.NsHandle, p *Plane, farms []*model.Farm) {
	b.Helper()
	pkt := chainPacket(b, ns, p, farms)
	benchRuns(b, p.objs.XlbIngress, func(int) []byte { return pkt })
}

// chainPacket puts the chain of farms in p and returns a UDP packet to the
// first, checked to leave for the next VIP.
func chainPacket(b *testing.B, ns netns.NsHandle, p *Plane, farms []*model.Farm) []byte {
	b.Helper()
	if err := p.Reconcile(context.Background(), farms); err != nil {
		b.Fatal(err)
	}
	routeClients(b, ns)
	pkt := pktSpec{src: client, sport: 40000, dst: chainVIP(0), dport: 80, proto: protoUDP, ttl: 255, payload: []byte("x")}.build()
	_, out := runProg(b, ns, p.objs.XlbIngress, pkt)
	if got, err := parse(out); err != nil || got.dst != chainVIP(1) {
		b.Fatalf("one hop: %+v, %v; want the packet sent to %s", got, err, chainVIP(1))
	}
	return pkt
}

// chainVIP is the VIP of service k of the new-flow chain (13.0.0.0/16).
func chainVIP(k int) netip.Addr { return netip.AddrFrom4([4]byte{13, 0, byte(k >> 8), byte(k)}) }

// chainFarms: service k's one backend is service k+1's VIP.
func chainFarms(tb testing.TB) []*model.Farm {
	var out []*model.Farm
	for k := range chainLen + 1 {
		out = append(out, farm(tb, fmt.Sprintf("chain%d", k), chainVIP(k).String(), 80, model.ProtoTCP, model.ModeDNAT,
			model.SchedRR, netip.AddrPortFrom(chainVIP(k+1), 80).String()))
	}
	return out
}

// routeClients routes the benchmark's clients (11.0.0.0/8) via the client
// and the new-flow chain's VIPs (13.0.0.0/16) via backend 1.
func routeClients(tb testing.TB, ns netns.NsHandle) {
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatal(err)
	}
	defer nh.Close()
	front, err := nh.LinkByName("front")
	if err != nil {
		tb.Fatal(err)
	}
	_, dst, _ := net.ParseCIDR("11.0.0.0/8")
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: front.Attrs().Index, Dst: dst, Gw: net.ParseIP("10.100.0.2")}); err != nil {
		tb.Fatal(err)
	}
	back, err := nh.LinkByName("back")
	if err != nil {
		tb.Fatal(err)
	}
	_, dst, _ = net.ParseCIDR("13.0.0.0/16")
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: back.Attrs().Index, Dst: dst, Gw: net.ParseIP("10.200.0.11")}); err != nil {
		tb.Fatal(err)
	}
}

// fillConntrack writes n established connections (both entries, next hop
// cached) into the conntrack table, chained for the benchmark.
func fillConntrack(tb testing.TB, p *Plane, ns netns.NsHandle, n int) {
	tb.Helper()
	g := p.farms["web"]
	ifidx := map[string]uint32{}
	for _, name := range []string{"front", "back"} {
		var idx int
		err := testutil.Do(ns, func() error {
			i, err := net.InterfaceByName(name)
			if err == nil {
				idx = i.Index
			}
			return err
		})
		if err != nil {
			tb.Fatal(err)
		}
		ifidx[name] = uint32(idx)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		tb.Fatal(err)
	}
	now := uint64(ts.Nano())
	const chunk = 1 << 16
	keys := make([]xlbCtKey, 0, 2*chunk)
	vals := make([]xlbCtVal, 0, 2*chunk)
	flush := func() {
		if len(keys) == 0 {
			return
		}
		if _, err := p.objs.XlbCt.BatchUpdate(keys, vals, nil); err != nil {
			tb.Fatalf("fill conntrack: %v", err)
		}
		keys, vals = keys[:0], vals[:0]
	}
	for i := range n {
		// Connection i's entries translate its packets into connection
		// i+1's (see the top of the file).
		c, port := benchConn(i)
		nc, nport := benchConn((i + 1) % n)
		bi := i % len(g.bes)
		be := g.bes[bi]
		fk := xlbCtKey{Src: [4]uint32{ne32(c)}, Dst: [4]uint32{ne32(vip1)}, Sport: ne16(port), Dport: ne16(80), Proto: protoTCP, Family: afInet}
		fv := xlbCtVal{Src: [4]uint32{ne32(nc)}, Dst: fk.Dst, Sport: ne16(nport), Dport: fk.Dport, Dir: ctFwd, State: ctStateEST,
			Svc: g.val.Id, Backend: g.ids[bi], Seen: now, Ifindex: ifidx["back"]}
		copy(fv.Smac[:], macBack)
		copy(fv.Dmac[:], macBackend(bi))
		rk := xlbCtKey{Src: be.Addr, Dst: fk.Src, Sport: be.Port, Dport: fk.Sport, Proto: protoTCP, Family: afInet}
		rv := xlbCtVal{Src: [4]uint32{ne32(benchBackend(i + 1))}, Dst: [4]uint32{ne32(nc)}, Sport: be.Port, Dport: ne16(nport),
			Dir: ctReply, State: ctStateEST, Svc: g.val.Id, Backend: g.ids[bi], Seen: now, Ifindex: ifidx["front"]}
		if (i+1)%n == 0 {
			rv.Src = [4]uint32{ne32(benchBackend(0))}
		}
		copy(rv.Smac[:], macFront)
		copy(rv.Dmac[:], macClient)
		keys = append(keys, fk, rk)
		vals = append(vals, fv, rv)
		if len(keys) >= 2*chunk {
			flush()
		}
	}
	flush()
}

// TestBenchConnsAreDistinct guards the benchmark's connection numbering.
func TestBenchConnsAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for i := range 100000 {
		c, p := benchConn(i)
		k := fmt.Sprint(c, p)
		if seen[k] {
			t.Fatalf("connection %d repeats %s", i, k)
		}
		seen[k] = true
	}
}
