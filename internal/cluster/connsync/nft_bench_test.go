package connsync

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/conntrack"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkSyncNftPerConn measures the nft plane's connection sync whole,
// as issue 20 asks of it: the CPU per synchronised connection. Node A's
// kernel conntrack (a namespace of its own) gets new dnat entries in
// batches of 256, made through ctnetlink by a generator standing in for
// traffic (no packets: the nft plane's per-packet cost of sync is this
// per-connection cost over the packets of a connection, the kernel's
// conntrack being there with or without sync). With sync on, the whole
// path runs: A's conntrack.Syncer reads the kernel's events, a Node
// sends them over TCP on loopback to a second Node, whose Syncer installs
// them into node B's conntrack (another namespace) and reads their events
// too (not sent back). Both nodes are in this process: cpu-ns/conn is the
// process's CPU per connection made (the generator's included), so sync's
// cost per connection, both nodes, is sync=on's less sync=off's. A run's
// CPU ends when B has installed every connection.
func BenchmarkSyncNftPerConn(b *testing.B) {
	testutil.RequireRoot(b)
	gen := &conntrack.Syncer{}
	ctx := context.Background()
	evs := make([]dataplane.ConnEvent, 256)
	next := 0
	for _, on := range []bool{false, true} {
		// Namespaces of their own for each: an empty table to start
		// with, and nothing in the dumps.
		name := "sync=off"
		_, nsA := testutil.NewNetNS(b)
		var na, nb *Node
		stop := func() {}
		if on {
			name = "sync=on"
			_, nsB := testutil.NewNetNS(b)
			na, nb, stop = nftPair(b, nsA, nsB)
		}
		b.Run(name, func(b *testing.B) {
			var sent0, inst0 uint64
			if on {
				sent0, inst0 = na.Counters().ConnsSent, nb.Counters().Installed
			}
			conns := 0
			cpu0 := processCPU(b)
			err := testutil.Do(nsA, func() error {
				for b.Loop() {
					for i := range evs {
						next++
						c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 100, byte(next >> 16), byte(next >> 8)}), uint16(next))
						evs[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: dataplane.SyncConn{Proto: unix.IPPROTO_TCP,
							Client: c, VIP: netip.MustParseAddrPort("10.99.0.1:80"), Backend: netip.MustParseAddrPort("10.200.0.11:8080"),
							Reply: c, Timeout: 300, TCPState: 3}} // established
					}
					if n, err := gen.InstallConns(ctx, evs); err != nil || n != len(evs) {
						return fmt.Errorf("made %d connections of %d: %v", n, len(evs), err)
					}
					conns += len(evs)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			if on {
				for deadline := time.Now().Add(30 * time.Second); nb.Counters().Installed-inst0 < uint64(conns); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						b.Fatalf("B installed %d connections of %d after 30s (A sent %d)",
							nb.Counters().Installed-inst0, conns, na.Counters().ConnsSent-sent0)
					}
				}
			}
			cpu := processCPU(b) - cpu0
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(conns), "cpu-ns/conn")
			if on {
				b.ReportMetric(float64(na.Counters().ConnsSent-sent0)/float64(conns), "recs/conn")
			}
			b.ReportMetric(0, "ns/op")
		})
		stop()
	}
}

// nsSyncer is a conntrack.Syncer working in namespace ns (it works in its
// caller's): its watch runs on a thread of its own there, its other calls
// on a second one (one goroutine hop a call, which a daemon in its own
// namespace does not have).
type nsSyncer struct {
	s    *conntrack.Syncer
	ns   netns.NsHandle
	reqs chan func()
}

func newNSSyncer(tb testing.TB, ns netns.NsHandle) *nsSyncer {
	s := &nsSyncer{s: &conntrack.Syncer{}, ns: ns, reqs: make(chan func())}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testutil.Do(ns, func() error {
			for f := range s.reqs {
				f()
			}
			return nil
		})
	}()
	tb.Cleanup(func() { close(s.reqs); <-done })
	return s
}

// in runs f in the namespace.
func (s *nsSyncer) in(f func()) {
	done := make(chan struct{})
	s.reqs <- func() { f(); close(done) }
	<-done
}

func (s *nsSyncer) WatchConns(ctx context.Context, fn func([]dataplane.ConnEvent)) error {
	return testutil.Do(s.ns, func() error { return s.s.WatchConns(ctx, fn) })
}

func (s *nsSyncer) DumpConns(ctx context.Context) (conns []dataplane.SyncConn, err error) {
	s.in(func() { conns, err = s.s.DumpConns(ctx) })
	return conns, err
}

func (s *nsSyncer) InstallConns(ctx context.Context, evs []dataplane.ConnEvent) (n int, err error) {
	s.in(func() { n, err = s.s.InstallConns(ctx, evs) })
	return n, err
}

// nftPair runs two nodes on loopback (127.0.0.1 and 127.0.0.2) over the
// conntrack of namespaces a and b, and waits until each has the other's
// dump; stop ends them and waits until they have.
func nftPair(b *testing.B, a, bns netns.NsHandle) (na, nb *Node, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	la, lb := loopbackPort(b, "127.0.0.1"), loopbackPort(b, "127.0.0.2")
	key := []byte("benchmark-sync-key-0123456789")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var err error
	na, err = New(quiet, Config{Name: "a", Listen: la, Peers: []netip.AddrPort{lb}, Key: key}, newNSSyncer(b, a))
	if err != nil {
		b.Fatal(err)
	}
	nb, err = New(quiet, Config{Name: "b", Listen: lb, Peers: []netip.AddrPort{la}, Key: key}, newNSSyncer(b, bns))
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{}, 2)
	for _, n := range []*Node{na, nb} {
		go func() { n.Run(ctx); done <- struct{}{} }()
	}
	stop = func() { cancel(); <-done; <-done }
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ra, _ := na.Ready()
		rb, _ := nb.Ready()
		if ra && rb && na.Counters().Dumps > 0 && nb.Counters().Dumps > 0 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			b.Fatal("sync pair not ready after 20s")
		}
	}
	// The watchers are reading once the dumps are in (both start at
	// once); a little more so that the first batch is not lost.
	time.Sleep(100 * time.Millisecond)
	return na, nb, stop
}

// loopbackPort is a TCP port free on addr (of 127.0.0.0/8).
func loopbackPort(tb testing.TB, addr string) netip.AddrPort {
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return netip.MustParseAddrPort(ln.Addr().String())
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
