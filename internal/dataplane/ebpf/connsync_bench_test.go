package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// The cost of connection sync per connection on the eBPF plane
// (bench/ha/run.sh writes them to bench/results/ha-sync-bench.txt):
//
//   - BenchmarkSyncSender: new flows made by the program (the new-flow
//     chain of BenchmarkConntrack: one BPF_PROG_TEST_RUN makes chainLen of
//     them), with sync off and on (WatchConns reading and batching the
//     records). cpu-ns/conn is the process's CPU time (user and system, all
//     threads: the program runs in the test-run system call) per new flow;
//     prog-ns/conn is the program's own time as the kernel measures it.
//     On minus off is what sync costs the node whose traffic made the flow,
//     up to handing the batch to the channel (internal/cluster/connsync's
//     BenchmarkWire is the rest).
//   - BenchmarkSyncInstall: a peer's new connections installed in batches
//     of 256 (InstallConns): the receiving node's cost, cpu-ns/conn and
//     ns/conn (wall).
func BenchmarkSyncSender(b *testing.B) {
	testutil.RequireRoot(b)
	ns := fixtureNS(b)
	p, err := New(context.Background(), testLogger(b), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(b), ConnTableSize: 1 << 22, ctRefresh: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if err := p.Reconcile(context.Background(), chainFarms(b)); err != nil {
		b.Fatal(err)
	}
	routeClients(b, ns)
	prog := p.objs.XlbIngress
	next := 0
	for _, on := range []bool{false, true} {
		name := "sync=off"
		if on {
			name = "sync=on"
		}
		b.Run(name, func(b *testing.B) {
			var got atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			if on {
				go func() {
					done <- p.WatchConns(ctx, func(evs []dataplane.ConnEvent) { got.Add(int64(len(evs))) })
				}()
				for deadline := time.Now().Add(5 * time.Second); ; {
					var v uint32
					if p.objs.XlbSyncOn.Get(&v) == nil && v == 1 {
						break
					}
					if time.Now().After(deadline) {
						b.Fatal("sync not on after 5s")
					}
					time.Sleep(time.Millisecond)
				}
			}
			cpu0 := processCPU(b)
			var prog0 time.Duration
			runs := 0
			for b.Loop() {
				// Building the packet (about 1 us) is in the CPU
				// time too: 1/250 of a run's.
				next++
				c, port := benchConn(next)
				pkt := pktSpec{src: c, sport: port, dst: chainVIP(0), dport: 80, proto: protoTCP, tcpFlags: tcpSYN, ttl: 255}.build()
				_, d, err := prog.Benchmark(pkt, chainLen, nil)
				if err != nil {
					b.Fatal(err)
				}
				prog0 += d
				runs++
			}
			want := int64(runs * chainLen)
			if on {
				for deadline := time.Now().Add(10 * time.Second); got.Load() < want; {
					if time.Now().After(deadline) {
						b.Fatalf("records read: %d of %d", got.Load(), want)
					}
					time.Sleep(time.Millisecond)
				}
			}
			cpu := processCPU(b) - cpu0
			cancel()
			if on {
				if err := <-done; err != nil {
					b.Fatalf("WatchConns: %v", err)
				}
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(want), "cpu-ns/conn")
			b.ReportMetric(float64(prog0.Nanoseconds())/float64(runs), "prog-ns/conn") // Benchmark: the mean of the repeats
		})
	}
}

func BenchmarkSyncInstall(b *testing.B) {
	testutil.RequireRoot(b)
	ns := fixtureNS(b)
	p, err := New(context.Background(), testLogger(b), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(b), ConnTableSize: 1 << 22})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	snat := farm(b, "snat", "10.99.0.2", 80, model.ProtoTCP, model.ModeSNAT, model.SchedMaglev,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	if err := p.Reconcile(context.Background(), []*model.Farm{snat}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	evs := make([]dataplane.ConnEvent, 256)
	next := 0
	cpu0 := processCPU(b)
	for b.Loop() {
		for i := range evs {
			next++
			c, port := benchConn(next)
			evs[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: dataplane.SyncConn{Proto: protoTCP,
				Client: netip.AddrPortFrom(c, port), VIP: netip.MustParseAddrPort("10.99.0.2:80"),
				Backend: netip.AddrPortFrom(benchBackend(next), 8080),
				Reply:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{12, c.As4()[1], c.As4()[2], c.As4()[3]}), port), TCPState: kernTCPEstablished}}
		}
		if n, err := p.InstallConns(ctx, evs); err != nil || n != len(evs) {
			b.Fatalf("installed %d of %d: %v", n, len(evs), err)
		}
	}
	cpu := processCPU(b) - cpu0
	n := float64(b.N * len(evs))
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/conn")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/conn")
}

// threadCPU is the CPU time of the calling thread (locked to it).
func threadCPU(tb testing.TB) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPU is the process's CPU time so far (user and system, all
// threads).
func processCPU(tb testing.TB) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSyncInstallSpaced: xlb_ct_install's own time per connection
// (install-ns/rec, the kernel's BPF run-time statistics, on for the
// benchmark) when batches come back to back against when they come every
// 10 ms, as the reader sends them under a moderate rate
// (BenchmarkSyncPerPacket at K=100 gives about 80 a batch), with nothing
// else running. It separates the install's cost in small, spaced batches
// from the rest of the sync path's. (The installing thread's CPU from
// getrusage is no measure here: with tick accounting a thread's run time
// is brought up to date when it sleeps, after the batch.)
func BenchmarkSyncInstallSpaced(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Fatalf("BPF run-time statistics: %v", err)
	}
	defer st.Close()
	p, err := New(ctx, testLogger(b), Options{NetNS: fixtureNS(b), Interfaces: []string{"front"},
		PinPath: mountBPFFS(b), ConnTableSize: 1 << 22})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	f := farm(b, "dnat", "10.99.0.2", 80, model.ProtoTCP, model.ModeDNAT, model.SchedMaglev,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	if err := p.Reconcile(ctx, []*model.Farm{f}); err != nil {
		b.Fatal(err)
	}
	next := 0
	for _, c := range []struct {
		batch int
		gap   time.Duration
	}{{256, 0}, {80, 0}, {80, 10 * time.Millisecond}, {256, 10 * time.Millisecond}} {
		b.Run(fmt.Sprintf("batch=%d/gap=%s", c.batch, c.gap), func(b *testing.B) {
			evs := make([]dataplane.ConnEvent, c.batch)
			n := 0
			run0 := installRunTime(b, p)
			for b.Loop() {
				for i := range evs {
					next++
					cl, port := benchConn(next)
					evs[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: dataplane.SyncConn{Proto: protoTCP,
						Client: netip.AddrPortFrom(cl, port), VIP: netip.MustParseAddrPort("10.99.0.2:80"),
						Backend: netip.AddrPortFrom(benchBackend(next), 8080),
						Reply:   netip.AddrPortFrom(cl, port), TCPState: kernTCPEstablished}}
				}
				if c.gap > 0 {
					time.Sleep(c.gap)
				}
				if k, err := p.InstallConns(ctx, evs); err != nil || k != len(evs) {
					b.Fatalf("installed %d of %d: %v", k, len(evs), err)
				}
				n += len(evs)
			}
			b.ReportMetric(float64((installRunTime(b, p)-run0).Nanoseconds())/float64(n), "install-ns/rec")
			b.ReportMetric(0, "ns/op")
		})
	}
}
