package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestSyncerInstall installs dnat and snat connections (IPv4 and IPv6)
// into a namespace's conntrack, reads them back with their translations,
// watches a second syncer see their events (the installing one does not:
// no echo), updates and ends them.
func TestSyncerInstall(t *testing.T) {
	testutil.RequireRoot(t)
	_, ns := testutil.NewNetNS(t)
	ctx := context.Background()
	ap := netip.MustParseAddrPort
	conns := []dataplane.SyncConn{
		{Proto: unix.IPPROTO_TCP, Client: ap("10.100.0.2:40000"), VIP: ap("10.99.0.1:80"),
			Backend: ap("10.200.0.11:8080"), Reply: ap("10.100.0.2:40000"), Timeout: 300, TCPState: tcpEstablished},
		{Proto: unix.IPPROTO_TCP, Client: ap("10.100.0.2:40001"), VIP: ap("10.99.0.1:80"),
			Backend: ap("10.200.0.12:8080"), Reply: ap("10.200.0.2:40001"), Timeout: 300, TCPState: tcpEstablished, Mark: 7},
		{Proto: unix.IPPROTO_UDP, Client: ap("[fd00:100::2]:5353"), VIP: ap("[fd00:99::1]:53"),
			Backend: ap("[fd00:200::11]:53"), Reply: ap("[fd00:100::2]:5353"), Timeout: 30},
	}
	installer := &Syncer{}
	watcher := &Syncer{IsVIP: func(a netip.Addr) bool { return a.IsPrivate() }}
	got := make(chan []dataplane.ConnEvent, 16)
	echoed := make(chan []dataplane.ConnEvent, 16)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var w2 *eventSocket
	err := testutil.Do(ns, func() error {
		// Sockets keep the namespace they were opened in: both
		// watchers' sockets are opened here, before their goroutines.
		w1, err := watcher.dialWatch()
		if err != nil {
			return err
		}
		w2, err = installer.dialWatch()
		if err != nil {
			return err
		}
		// fn keeps no batch: the watcher reuses it.
		go watcher.watch(wctx, w1, func(b []dataplane.ConnEvent) { got <- slices.Clone(b) })
		go installer.watch(wctx, w2, func(b []dataplane.ConnEvent) { echoed <- slices.Clone(b) })
		evs := make([]dataplane.ConnEvent, len(conns))
		for i, c := range conns {
			evs[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: c}
		}
		n, err := installer.InstallConns(ctx, evs)
		if err != nil || n != len(conns) {
			t.Fatalf("installed %d of %d: %v", n, len(conns), err)
		}
		// Again: known already, updated in place.
		if n, err := installer.InstallConns(ctx, evs); err != nil || n != len(conns) {
			t.Fatalf("reinstalled %d of %d: %v", n, len(conns), err)
		}
		dump, err := installer.DumpConns(ctx)
		if err != nil {
			return err
		}
		sort.Slice(dump, func(i, j int) bool { return dump[i].Client.String() < dump[j].Client.String() })
		if len(dump) != len(conns) {
			t.Fatalf("dump holds %d connections, want %d: %+v", len(dump), len(conns), dump)
		}
		for i, c := range dump {
			w := conns[i]
			if c.Proto != w.Proto || c.Client != w.Client || c.VIP != w.VIP || c.Backend != w.Backend || c.Reply != w.Reply || c.Mark != w.Mark {
				t.Errorf("dumped %+v, want %+v", c, w)
			}
			if c.Timeout == 0 || c.Timeout > w.Timeout {
				t.Errorf("%s: timeout %d, want (0, %d]", c.Client, c.Timeout, w.Timeout)
			}
			if w.TCPState != 0 && c.TCPState != w.TCPState {
				t.Errorf("%s: tcp state %d, want %d", c.Client, c.TCPState, w.TCPState)
			}
		}
		end := []dataplane.ConnEvent{{Kind: dataplane.ConnEnd, Conn: conns[0]}}
		if n, err := installer.InstallConns(ctx, end); err != nil || n != 1 {
			t.Fatalf("end: %d, %v", n, err)
		}
		if n, err := installer.InstallConns(ctx, end); err != nil || n != 0 {
			t.Fatalf("end of an unknown connection: %d, %v", n, err)
		}
		dump, err = installer.DumpConns(ctx)
		if err != nil || len(dump) != len(conns)-1 {
			t.Fatalf("after end: %d connections, %v", len(dump), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[dataplane.ConnEventKind]int{}
	deadline := time.After(3 * time.Second)
	for kinds[dataplane.ConnEnd] == 0 {
		select {
		case b := <-got:
			for _, e := range b {
				kinds[e.Kind]++
			}
		case <-deadline:
			t.Fatalf("watcher saw %v, want new, update and end events", kinds)
		}
	}
	if kinds[dataplane.ConnNew] != len(conns) {
		t.Fatalf("watcher saw %v, want %d new", kinds, len(conns))
	}
	select {
	case b := <-echoed:
		t.Fatalf("the installing node would send back %+v", b)
	case <-time.After(200 * time.Millisecond):
	}
	// Not even read: the kernel dropped the events of its own installs
	// (ownevents.go).
	if n := w2.datagrams.Load(); n != 0 {
		t.Errorf("the installing node's watch read %d events of its own installs", n)
	}
}

// BenchmarkInstallConns is the cost per connection of installing
// synchronised connections (new dnat entries, batches of 256) into a
// namespace's conntrack, then of reading them back as a dump.
func BenchmarkInstallConns(b *testing.B) {
	testutil.RequireRoot(b)
	_, ns := testutil.NewNetNS(b)
	s := &Syncer{}
	ctx := context.Background()
	evs := make([]dataplane.ConnEvent, 256)
	port := 0
	err := testutil.Do(ns, func() error {
		b.ResetTimer()
		for b.Loop() {
			for i := range evs {
				port++
				c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 100, byte(port >> 16), byte(port >> 8)}), uint16(port))
				evs[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: dataplane.SyncConn{Proto: unix.IPPROTO_TCP,
					Client: c, VIP: netip.MustParseAddrPort("10.99.0.1:80"), Backend: netip.MustParseAddrPort("10.200.0.11:8080"),
					Reply: c, Timeout: 300, TCPState: tcpEstablished}}
			}
			if n, err := s.InstallConns(ctx, evs); err != nil || n != len(evs) {
				return fmt.Errorf("installed %d: %v", n, err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/conn")
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEventsPerConn is the cost per connection of the sending side:
// the kernel's event for a new entry, read and decoded by WatchConns
// (entries made by InstallConns in batches of 256, their events seen by a
// second syncer). It includes the install; subtract BenchmarkInstallConns
// for the events alone.
func BenchmarkEventsPerConn(b *testing.B) {
	testutil.RequireRoot(b)
	_, ns := testutil.NewNetNS(b)
	installer, watcher := &Syncer{}, &Syncer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan int, 1024)
	evs := make([]dataplane.ConnEvent, 256)
	port := 0
	err := testutil.Do(ns, func() error {
		w, err := watcher.dialWatch()
		if err != nil {
			return err
		}
		go watcher.watch(ctx, w, func(batch []dataplane.ConnEvent) { seen <- len(batch) })
		b.ResetTimer()
		for b.Loop() {
			for i := range evs {
				port++
				c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 100, byte(port >> 16), byte(port >> 8)}), uint16(port))
				evs[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: dataplane.SyncConn{Proto: unix.IPPROTO_TCP,
					Client: c, VIP: netip.MustParseAddrPort("10.99.0.1:80"), Backend: netip.MustParseAddrPort("10.200.0.11:8080"),
					Reply: c, Timeout: 300, TCPState: tcpEstablished}}
			}
			if n, err := installer.InstallConns(ctx, evs); err != nil || n != len(evs) {
				return fmt.Errorf("installed %d: %v", n, err)
			}
			for got := 0; got < len(evs); {
				select {
				case n := <-seen:
					got += n
				case <-time.After(5 * time.Second):
					return fmt.Errorf("events: saw %d of %d", got, len(evs))
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/conn")
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
