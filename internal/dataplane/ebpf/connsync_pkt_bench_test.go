package ebpf

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/cluster/connsync"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkSyncPerPacket measures what issue 20 asks of connection sync:
// the CPU per forwarded packet with sync off and on, at a high rate of new
// connections. Each op is one TCP flow of K packets through the program
// (BPF_PROG_TEST_RUN, one run a packet: a SYN, K-2 data segments, a FIN),
// a new client each flow, to a dnat farm. With sync on the whole path
// runs: the program's records read and batched by WatchConns, a
// connsync.Node sending them over TCP on loopback (HMAC'd frames) to a
// second Node, which installs them into a second plane in another
// namespace (xlb_ct_install). Both nodes are in this process, so
// cpu-ns/pkt (the process's user and system time per packet, all threads)
// is what one node of a pair spends when its peer carries as much new
// traffic as it does: its own packets, its records out, the peer's in.
// prog-ns/pkt is the program's time alone as the kernel measures it;
// thread-ns/pkt the CPU of the thread that sends the packets (the rest of
// cpu-ns/pkt is the other threads': sync's goroutines, the runtime's).
//
// A run's CPU ends when the peer has installed every record (the wait
// included: the sender reads every 10 ms).
//
// With XLB_BENCH_INSTALL_STATS=1 the kernel's BPF run-time statistics are
// on and sync=on runs also report install-ns/rec: the peer's
// xlb_ct_install's own time per record (its run time over the records it
// took). The statistics cost every program run some time, so prog-ns/pkt
// and cpu-ns/pkt of such a run are not comparable with the others'.
//
// With XLB_BENCH_PERF_CTL=FIFO (perf record's --control=fifo:FIFO, started
// with -D -1) the profile holds the measured phases only: perf is enabled
// at each sub-benchmark's start and disabled when its CPU is taken (the
// planes' loading and the start's dumps stay out).
func BenchmarkSyncPerPacket(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	plane := func() (*Plane, netns.NsHandle) {
		ns := fixtureNS(b)
		p, err := New(ctx, quietLogger, Options{NetNS: ns, Interfaces: []string{"front"},
			PinPath: mountBPFFS(b), ConnTableSize: 1 << 22, ctRefresh: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		f := farm(b, "dnat", "10.99.0.2", 80, model.ProtoTCP, model.ModeDNAT, model.SchedMaglev,
			"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
		if err := p.Reconcile(ctx, []*model.Farm{f}); err != nil {
			b.Fatal(err)
		}
		routeClients(b, ns)
		return p, ns
	}
	send, sendNS := plane()
	recv, _ := plane()
	prog := send.objs.XlbIngress
	vip := netip.MustParseAddr("10.99.0.2")
	tmpl := func(flags uint8, payload int) []byte {
		c, port := benchConn(0)
		return pktSpec{src: c, sport: port, dst: vip, dport: 80, proto: protoTCP, tcpFlags: flags,
			payload: make([]byte, payload)}.build()
	}
	const tcpFIN = 0x01
	syn, data, fin := tmpl(tcpSYN, 0), tmpl(tcpACK, 100), tmpl(tcpFIN|tcpACK, 0)
	next := 1 << 20 // clients the other benchmarks of the process do not use
	if os.Getenv("XLB_BENCH_INSTALL_STATS") == "1" {
		st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			b.Fatalf("BPF run-time statistics: %v", err)
		}
		defer st.Close()
	}
	for _, k := range []int{2, 10, 100} {
		for _, on := range []bool{false, true} {
			name := fmt.Sprintf("K=%d/sync=off", k)
			if on {
				name = fmt.Sprintf("K=%d/sync=on", k)
			}
			// One pair of nodes for the sub-benchmark's runs (a second
			// watcher of the plane would wait for the first to end).
			var nodeA, nodeB *connsync.Node
			stop := func() {}
			if on {
				nodeA, nodeB, stop = syncPair(b, send, recv)
			}
			b.Run(name, func(b *testing.B) {
				var sent0, inst0 uint64
				var run0 time.Duration
				if on {
					sent0, inst0 = nodeA.Counters().ConnsSent, nodeB.Counters().Installed
					run0 = installRunTime(b, recv)
				}
				perfCtl(b, "enable")
				cpu0 := processCPU(b)
				var progT, thrT time.Duration
				pkts := 0
				// In the sender's namespace: the program's route lookups.
				// The goroutine is locked to its thread there, so the
				// thread's CPU is the packets' alone.
				err := testutil.Do(sendNS, func() error {
					thr0 := threadCPU(b)
					defer func() { thrT = threadCPU(b) - thr0 }()
					for b.Loop() {
						next++
						c, port := benchConn(next)
						a := c.As4()
						for i := range k {
							pkt := data
							switch i {
							case 0:
								pkt = syn
							case k - 1:
								pkt = fin
							}
							// The flow's client: the program checks no checksum
							// on the way in (it updates them incrementally).
							copy(pkt[26:30], a[:])
							pkt[34], pkt[35] = byte(port>>8), byte(port)
							ret, d, err := prog.Benchmark(pkt, 1, nil)
							if err != nil {
								return err
							}
							if ret != verdictRedirect {
								return fmt.Errorf("packet %d of flow %d: verdict %d", i, next, ret)
							}
							progT += d
							pkts++
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				if on {
					// The last flow's FIN installed by the peer: records
					// and batches keep their order, so every earlier one is
					// in too.
					c, port := benchConn(next)
					last := xlbCtKey{Src: [4]uint32{ne32(c)}, Dst: [4]uint32{ne32(vip)}, Sport: ne16(port), Dport: ne16(80), Proto: protoTCP, Family: afInet}
					for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
						var v xlbCtVal
						if recv.objs.XlbCt.Lookup(&last, &v) == nil && v.State == ctStateFIN {
							break
						}
						if time.Now().After(deadline) {
							b.Fatalf("last flow not installed by the peer after 30s (sent %d, installed %d)",
								nodeA.Counters().ConnsSent, nodeB.Counters().Installed)
						}
					}
				}
				cpu := processCPU(b) - cpu0
				perfCtl(b, "disable")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(pkts), "cpu-ns/pkt")
				b.ReportMetric(float64(progT.Nanoseconds())/float64(pkts), "prog-ns/pkt")
				b.ReportMetric(float64(thrT.Nanoseconds())/float64(pkts), "thread-ns/pkt")
				if on {
					sent, inst := nodeA.Counters().ConnsSent-sent0, nodeB.Counters().Installed-inst0
					if inst != sent {
						b.Fatalf("peer installed %d records of %d", inst, sent)
					}
					b.ReportMetric(float64(sent)/float64(b.N), "recs/flow")
					if os.Getenv("XLB_BENCH_INSTALL_STATS") == "1" {
						b.ReportMetric(float64((installRunTime(b, recv)-run0).Nanoseconds())/float64(inst), "install-ns/rec")
					}
				}
				b.ReportMetric(0, "ns/op")
			})
			stop()
		}
	}
}

// perfCtl sends cmd ("enable", "disable") to the perf record control FIFO
// named by XLB_BENCH_PERF_CTL, if any.
func perfCtl(b *testing.B, cmd string) {
	path := os.Getenv("XLB_BENCH_PERF_CTL")
	if path == "" {
		return
	}
	if err := os.WriteFile(path, []byte(cmd+"\n"), 0); err != nil {
		b.Fatalf("perf control %q: %v", cmd, err)
	}
}

// BenchmarkSyncIdle: what a pair of nodes with sync on (as in
// BenchmarkSyncPerPacket) costs without traffic: cpu-ms/s is the
// process's CPU time per second of wall time, both nodes together, less
// the same without sync (each op sleeps 100 ms).
func BenchmarkSyncIdle(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	plane := func() *Plane {
		p, err := New(ctx, quietLogger, Options{NetNS: fixtureNS(b), Interfaces: []string{"front"},
			PinPath: mountBPFFS(b), ConnTableSize: 1 << 16})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		return p
	}
	pa, pb := plane(), plane()
	idle := func(b *testing.B) float64 {
		cpu0 := processCPU(b)
		for b.Loop() {
			time.Sleep(100 * time.Millisecond)
		}
		return float64((processCPU(b) - cpu0).Microseconds()) / float64(b.Elapsed().Milliseconds())
	}
	var off float64
	b.Run("sync=off", func(b *testing.B) { off = idle(b); b.ReportMetric(off, "cpu-ms/s"); b.ReportMetric(0, "ns/op") })
	_, _, stop := syncPair(b, pa, pb)
	defer stop()
	time.Sleep(200 * time.Millisecond) // past the start's dumps
	b.Run("sync=on", func(b *testing.B) { b.ReportMetric(idle(b), "cpu-ms/s"); b.ReportMetric(0, "ns/op") })
}

// syncPair runs two connsync nodes on loopback (127.0.0.1 and 127.0.0.2,
// ports of this process's choosing) over planes a and b, and waits until
// each has the other's dump; stop ends them and waits until they have.
func syncPair(b *testing.B, pa, pb *Plane) (na, nb *connsync.Node, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	la, lb := freeLoopbackPort(b, "127.0.0.1"), freeLoopbackPort(b, "127.0.0.2")
	key := []byte("benchmark-sync-key-0123456789")
	var err error
	na, err = connsync.New(quietLogger, connsync.Config{Name: "a", Listen: la, Peers: []netip.AddrPort{lb}, Key: key}, pa)
	if err != nil {
		b.Fatal(err)
	}
	nb, err = connsync.New(quietLogger, connsync.Config{Name: "b", Listen: lb, Peers: []netip.AddrPort{la}, Key: key}, pb)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{}, 2)
	for _, n := range []*connsync.Node{na, nb} {
		go func() { n.Run(ctx); done <- struct{}{} }()
	}
	stop = func() { cancel(); <-done; <-done }
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ra, _ := na.Ready()
		rb, _ := nb.Ready()
		var on uint32
		if ra && rb && pa.objs.XlbSyncOn.Get(&on) == nil && on == 1 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			b.Fatal("sync pair not ready after 20s")
		}
	}
	return na, nb, stop
}

// installRunTime is the run time xlb_ct_install has taken on p so far (0
// without the kernel's BPF statistics).
func installRunTime(b *testing.B, p *Plane) time.Duration {
	st, err := p.objs.XlbCtInstall.Stats()
	if err != nil {
		b.Fatalf("xlb_ct_install's statistics: %v", err)
	}
	return st.Runtime
}

// quietLogger logs as a daemon does by default (info), to nowhere: the
// benchmark's CPU is not the test log's.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// freeLoopbackPort is a TCP port free on addr (of 127.0.0.0/8).
func freeLoopbackPort(tb testing.TB, addr string) netip.AddrPort {
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return netip.MustParseAddrPort(ln.Addr().String())
}
