package ebpf

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// syncFarms are the farms of both nodes of TestConnSync: the same state
// on each, as the operator's tooling puts it (xlb restore).
func syncFarms(t *testing.T) []*model.Farm {
	snat := farm(t, "snat", "10.99.0.2", 80, model.ProtoTCP, model.ModeSNAT, model.SchedMaglev,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	dnat := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedMaglev,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	dns := farm(t, "dns", "10.99.0.1", 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR,
		"10.200.0.12:5353")
	dsr := farm(t, "dsr", "10.99.0.4", 80, model.ProtoTCP, model.ModeDSR, model.SchedMaglev,
		"10.200.0.11:0", "10.200.0.12:0")
	return []*model.Farm{snat, dnat, dns, dsr}
}

// TestConnSync: node A's program streams its snat and dnat flows as they
// open and change state (WatchConns), and lists them whole (DumpConns);
// node B installs them (InstallConns) and then carries a flow it has never
// seen: a mid-stream ACK and the backend's reply come out translated
// exactly as A translates them (A's snat source port included), with both
// entries in B's table, the flow counted active once, and it is removed
// again by an end. Without the install, B passes the ACK to the stack (the
// client would get a reset). dsr flows are not sent (Maglev carries them),
// nor installed into a dsr farm; a flow of a farm B does not have yet is
// carried, and counted once the farm is there.
func TestConnSync(t *testing.T) {
	testutil.RequireRoot(t)
	nsA, nsB := fixtureNS(t), fixtureNS(t)
	a := newPlane(t, nsA, mountBPFFS(t), []string{"front", "back"}, 4096)
	b := newPlane(t, nsB, mountBPFFS(t), []string{"front", "back"}, 4096)
	ctx := context.Background()
	for _, p := range []*Plane{a, b} {
		if err := p.Reconcile(ctx, syncFarms(t)); err != nil {
			t.Fatal(err)
		}
	}

	// A streams its events while a reader watches.
	w := watchConns(ctx, t, a)

	vip2, vip4 := netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("10.99.0.4")
	type flow struct {
		desc  string
		proto uint8
		vip   netip.Addr
		vport uint16
		sport uint16
	}
	flows := []flow{
		{"snat", protoTCP, vip2, 80, 40000},
		{"dnat", protoTCP, vip1, 80, 40001},
		{"dnat udp", protoUDP, vip1, 53, 40002},
	}
	send := func(p *Plane, f flow, flags uint8) (uint32, parsedPkt) {
		t.Helper()
		nh := nsA
		if p == b {
			nh = nsB
		}
		verdict, out := runProg(t, nh, p.objs.XlbIngress, pktSpec{src: client, sport: f.sport, dst: f.vip, dport: f.vport,
			proto: f.proto, tcpFlags: flags, payload: []byte("x")}.build())
		got, _ := parse(out)
		return verdict, got
	}
	// At A: each flow opens (SYN, then the client's ACK: established).
	atA := map[string]parsedPkt{}
	for _, f := range flows {
		flags := uint8(tcpSYN)
		if f.proto == protoUDP {
			flags = 0
		}
		if verdict, out := send(a, f, flags); verdict != verdictRedirect {
			t.Fatalf("%s: first packet at A: verdict %d", f.desc, verdict)
		} else {
			atA[f.desc] = out
		}
		if f.proto == protoTCP {
			if verdict, _ := send(a, f, tcpACK); verdict != verdictRedirect {
				t.Fatalf("%s: ACK at A: verdict %d", f.desc, verdict)
			}
		}
	}
	// A dsr flow: not sent.
	if verdict, _ := send(a, flow{"dsr", protoTCP, vip4, 80, 40003}, tcpSYN); verdict != verdictRedirect {
		t.Fatalf("dsr SYN at A: verdict %d", verdict)
	}
	// New (SYN), update (established) for the TCP flows, new for UDP.
	got := w.settled(t, 5)
	if len(got) != 5 {
		t.Fatalf("A sent %d events, want 5 (new and established of 2 TCP flows, new of 1 UDP flow): %+v", len(got), got)
	}
	for _, f := range flows {
		out := atA[f.desc]
		var kinds []dataplane.ConnEventKind
		for _, ev := range got {
			c := ev.Conn
			if c.Client.Port() != f.sport {
				continue
			}
			kinds = append(kinds, ev.Kind)
			wantReply := netip.AddrPortFrom(client, f.sport)
			if f.desc == "snat" {
				wantReply = netip.AddrPortFrom(out.src, out.sport)
			}
			if c.Proto != f.proto || c.Client != netip.AddrPortFrom(client, f.sport) || c.VIP != netip.AddrPortFrom(f.vip, f.vport) ||
				c.Backend != netip.AddrPortFrom(out.dst, out.dport) || c.Reply != wantReply || c.Timeout == 0 {
				t.Errorf("%s: event %+v; A sent the flow to %s:%d from %s:%d", f.desc, ev, out.dst, out.dport, out.src, out.sport)
			}
			if f.proto == protoTCP && ev.Kind == dataplane.ConnUpdate && c.TCPState != kernTCPEstablished {
				t.Errorf("%s: update in TCP state %d, want established (%d)", f.desc, c.TCPState, kernTCPEstablished)
			}
		}
		want := []dataplane.ConnEventKind{dataplane.ConnNew, dataplane.ConnUpdate}
		if f.proto == protoUDP {
			want = want[:1]
		}
		if !slices.Equal(kinds, want) {
			t.Errorf("%s: events %v, want %v", f.desc, kinds, want)
		}
	}
	w.end(t)
	var on uint32
	if err := a.objs.XlbSyncOn.Get(&on); err != nil || on != 0 {
		t.Errorf("xlb_sync_on %d after the watch ended (%v), want 0", on, err)
	}
	dump, err := a.DumpConns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(dump) != 3 {
		t.Errorf("A's dump: %d connections, want 3 (no dsr): %+v", len(dump), dump)
	}

	// Before B has them: B passes the mid-stream ACK to the stack.
	if verdict, _ := send(b, flows[0], tcpACK); verdict != verdictNext {
		t.Fatalf("snat ACK at B before sync: verdict %d, want next (the stack)", verdict)
	}
	n, err := b.InstallConns(ctx, got)
	if err != nil || n != 5 {
		t.Fatalf("install at B: %d of 5, %v", n, err)
	}
	// Installing again (a resync) changes nothing.
	if n, err := b.InstallConns(ctx, got); err != nil || n != 5 {
		t.Fatalf("install at B again: %d of 5, %v", n, err)
	}
	for _, f := range flows {
		out := atA[f.desc]
		flags := uint8(tcpACK)
		if f.proto == protoUDP {
			flags = 0
		}
		verdict, atB := send(b, f, flags)
		if verdict != verdictRedirect || atB.src != out.src || atB.sport != out.sport || atB.dst != out.dst || atB.dport != out.dport ||
			!bytes.Equal(atB.dstMAC, out.dstMAC) {
			t.Errorf("%s at B: verdict %d, %s:%d -> %s:%d (%s); A sent %s:%d -> %s:%d (%s)", f.desc, verdict,
				atB.src, atB.sport, atB.dst, atB.dport, atB.dstMAC, out.src, out.sport, out.dst, out.dport, out.dstMAC)
		}
		// The backend's reply, at B.
		rflags := uint8(tcpACK)
		if f.proto == protoUDP {
			rflags = 0
		}
		verdict, out2 := runProg(t, nsB, b.objs.XlbIngress, pktSpec{src: out.dst, sport: out.dport, dst: out.src, dport: out.sport,
			proto: f.proto, tcpFlags: rflags, payload: []byte("y")}.build())
		reply, _ := parse(out2)
		if verdict != verdictRedirect || reply.src != f.vip || reply.sport != f.vport || reply.dst != client || reply.dport != f.sport {
			t.Errorf("%s: reply at B: verdict %d, %s:%d -> %s:%d", f.desc, verdict, reply.src, reply.sport, reply.dst, reply.dport)
		}
		if f.proto == protoTCP {
			if fs, rs := ctState(t, b, ctKey(client, f.sport, f.vip, f.vport, f.proto)); fs != int(ctStateEST) || rs != int(ctStateEST) {
				t.Errorf("%s: B's entries in states %d/%d, want established both", f.desc, fs, rs)
			}
		}
	}
	// A stale update of another connection on a tuple does not take
	// the live flow's place.
	stale := got[0]
	stale.Kind = dataplane.ConnUpdate
	stale.Conn.Backend = netip.AddrPortFrom(netip.MustParseAddr("10.200.0.13"), 8080)
	if stale.Conn.Backend == got[0].Conn.Backend {
		stale.Conn.Backend = netip.AddrPortFrom(netip.MustParseAddr("10.200.0.12"), 8080)
	}
	if n, err := b.InstallConns(ctx, []dataplane.ConnEvent{stale}); n != 0 || err == nil || !strings.Contains(err.Error(), "another connection's") {
		t.Errorf("a stale update with another backend: %d, %v; want it refused", n, err)
	}
	if verdict, atB := send(b, flows[0], tcpACK); verdict != verdictRedirect || atB.dst != atA["snat"].dst {
		t.Errorf("after a stale update: verdict %d, to %s; want %s still", verdict, atB.dst, atA["snat"].dst)
	}
	// Counted active once per TCP flow (xlb_lc.h), though installed twice.
	if act := sumActive(t, b); act != 2 {
		t.Errorf("B counts %d active connections, want 2", act)
	}
	// B's dump has them too (a node that rejoins gets them from B).
	if dump, err := b.DumpConns(ctx); err != nil || len(dump) != 3 {
		t.Errorf("B's dump: %d connections (%v), want 3", len(dump), err)
	}

	// Ends remove both entries and the active count.
	var ends []dataplane.ConnEvent
	for _, ev := range got {
		if ev.Kind == dataplane.ConnNew {
			ends = append(ends, dataplane.ConnEvent{Kind: dataplane.ConnEnd, Conn: ev.Conn})
		}
	}
	if n, err := b.InstallConns(ctx, ends); err != nil || n != 3 {
		t.Fatalf("ends at B: %d of 3, %v", n, err)
	}
	for _, f := range flows {
		if fs, rs := ctState(t, b, ctKey(client, f.sport, f.vip, f.vport, f.proto)); fs != -1 || rs != -1 {
			t.Errorf("%s: B's entries left after the end: %d/%d", f.desc, fs, rs)
		}
	}
	if act := sumActive(t, b); act != 0 {
		t.Errorf("B counts %d active connections after the ends, want 0", act)
	}
	// An end for a flow B does not have is no error, and counts nothing.
	if n, err := b.InstallConns(ctx, ends[:1]); err != nil || n != 0 {
		t.Errorf("end of an unknown flow: %d, %v; want 0, nil", n, err)
	}

	// A flow of a farm B does not have (yet: a node that joins may get
	// its peers' state before its farms) is installed unbound: carried by
	// its entries, counted under no backend; an update binds it once the
	// farm is here.
	vip9 := netip.MustParseAddr("10.99.0.9")
	c := got[0].Conn
	c.VIP = netip.AddrPortFrom(vip9, 80)
	if n, err := b.InstallConns(ctx, []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: c}}); err != nil || n != 1 {
		t.Fatalf("install without a farm here: %d, %v; want 1, nil", n, err)
	}
	nine := flow{"unbound", protoTCP, vip9, 80, flows[0].sport}
	if verdict, atB := send(b, nine, tcpACK); verdict != verdictRedirect || atB.src != c.Reply.Addr() || atB.sport != c.Reply.Port() ||
		atB.dst != c.Backend.Addr() || atB.dport != c.Backend.Port() {
		t.Errorf("unbound flow at B: verdict %d, %s:%d -> %s:%d; want %s -> %s", verdict, atB.src, atB.sport, atB.dst, atB.dport, c.Reply, c.Backend)
	}
	if act := sumActive(t, b); act != 0 {
		t.Errorf("B counts %d active connections with an unbound flow, want 0", act)
	}
	withNine := append(syncFarms(t), farm(t, "nine", vip9.String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedMaglev,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080"))
	if err := b.Reconcile(ctx, withNine); err != nil {
		t.Fatal(err)
	}
	if n, err := b.InstallConns(ctx, []dataplane.ConnEvent{{Kind: dataplane.ConnUpdate, Conn: c}}); err != nil || n != 1 {
		t.Fatalf("update with the farm here: %d, %v", n, err)
	}
	if act := sumActive(t, b); act != 1 {
		t.Errorf("B counts %d active connections once the flow is bound, want 1", act)
	}
	var v xlbCtVal
	if err := b.objs.XlbCt.Lookup(ctKey(client, nine.sport, vip9, 80, protoTCP), &v); err != nil || v.Backend == 0 || v.Svc == 0 {
		t.Errorf("bound entry: backend %d, service %d (%v)", v.Backend, v.Svc, err)
	}

	// Refused, naming why: a dsr farm here (no state to install).
	c.VIP = netip.AddrPortFrom(vip4, 80)
	c.Client = netip.AddrPortFrom(client, 40999)
	n, err = b.InstallConns(ctx, []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: c}})
	if n != 0 || err == nil || !strings.Contains(err.Error(), "dsr or stlsdnat") {
		t.Errorf("install into a dsr farm: %d, %v; want an error saying so", n, err)
	}
	if dump, err := b.DumpConns(ctx); err != nil || len(dump) != 1 {
		t.Errorf("B at the end: %d connections (%v), want the one bound", len(dump), err)
	}
}

// sumActive sums xlb_be_active over every backend id.
func sumActive(t *testing.T, p *Plane) int64 {
	t.Helper()
	var sum int64
	it := p.objs.XlbBeActive.Iterate()
	var k uint32
	var v int64
	for it.Next(&k, &v) {
		sum += v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSNATPorts: with Options.SNATPorts (--snat-ports), a new snat flow
// leaves from a port of that range: the client's own if it is in it,
// else a random one of it; nodes that share a farm's source-addr take
// disjoint ranges (docs/ha.md).
func TestSNATPorts(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, Interfaces: []string{"front"}, PinPath: mountBPFFS(t),
		ConnTableSize: 4096, SNATPorts: model.PortRange{First: 20000, Last: 20099}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	snat := farm(t, "snat", "10.99.0.2", 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR, "10.200.0.11:8080")
	if err := p.Reconcile(context.Background(), []*model.Farm{snat}); err != nil {
		t.Fatal(err)
	}
	vip2 := netip.MustParseAddr("10.99.0.2")
	seen := map[uint16]bool{}
	for i, sport := range []uint16{20005, 40000, 40001, 40002, 40003, 40004, 40005, 40006, 40007, 40008} {
		verdict, out := runProg(t, ns, p.objs.XlbIngress, pktSpec{src: client, sport: sport, dst: vip2, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
		got, _ := parse(out)
		if verdict != verdictRedirect || got.sport < 20000 || got.sport > 20099 || seen[got.sport] {
			t.Errorf("flow %d from port %d: verdict %d, left from port %d; want a free port of 20000-20099", i, sport, verdict, got.sport)
		}
		if sport == 20005 && got.sport != 20005 {
			t.Errorf("a client port in the range (20005) was not kept: %d", got.sport)
		}
		seen[got.sport] = true
	}
}

// TestSessionSync: a persistent client moved to another node keeps its
// backend. Node A's program records each persistence session it makes
// (WatchConns: a ConnSession event; DumpSessions lists them); node B
// installs them (InstallConns) and sends the client's next new flow to
// A's pick, where without them (node C, the same farms, nothing
// installed) it is scheduled anew. A session for a service without
// persistence here is refused, naming why.
func TestSessionSync(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	farms := func() []*model.Farm {
		web := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR,
			"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
		web.Persistence, web.PersistTTL = model.KeySrcIP, 300
		plain := farm(t, "plain", "10.99.0.2", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080")
		return []*model.Farm{web, plain}
	}
	var planes [3]*Plane
	var nss [3]netns.NsHandle
	for i := range planes {
		nss[i] = fixtureNS(t)
		planes[i] = newPlane(t, nss[i], mountBPFFS(t), []string{"front", "back"}, 4096)
		if err := planes[i].Reconcile(ctx, farms()); err != nil {
			t.Fatal(err)
		}
	}
	a, b := planes[0], planes[1]
	client2 := netip.MustParseAddr("10.100.0.3")
	sport := uint16(41000)
	syn := func(i int, src netip.Addr) netip.Addr {
		t.Helper()
		sport++
		verdict, out := runProg(t, nss[i], planes[i].objs.XlbIngress, pktSpec{src: src, sport: sport, dst: vip1, dport: 80,
			proto: protoTCP, tcpFlags: tcpSYN}.build())
		got, err := parse(out)
		if verdict != verdictRedirect || err != nil {
			t.Fatalf("SYN from %s at node %d: verdict %d, %v", src, i, verdict, err)
		}
		return got.dst
	}

	w := watchConns(ctx, t, a)
	// At A, rr: client2 to be1, client to be2, and client's next flow
	// to be2 again (its session: no new record).
	if got := syn(0, client2); got != be1 {
		t.Fatalf("client2 at A to %s, want %s", got, be1)
	}
	if got := syn(0, client); got != be2 {
		t.Fatalf("client at A to %s, want %s", got, be2)
	}
	if got := syn(0, client); got != be2 {
		t.Fatalf("client's second flow at A to %s, want %s (persistence)", got, be2)
	}
	var sessions []dataplane.ConnEvent
	got := w.settled(t, 5)
	w.end(t)
	for _, ev := range got {
		if ev.Kind == dataplane.ConnSession {
			sessions = append(sessions, ev)
		}
	}
	if len(got) != 5 || len(sessions) != 2 {
		t.Fatalf("A sent %d events, %d of them sessions; want 5 (3 new flows, 2 sessions): %+v", len(got), len(sessions), got)
	}
	want := dataplane.SyncConn{Proto: protoTCP, Client: netip.AddrPortFrom(client, 0), VIP: netip.AddrPortFrom(vip1, 80),
		Backend: netip.AddrPortFrom(be2, 8080), Reply: netip.AddrPortFrom(netip.IPv4Unspecified(), 0), Timeout: 300}
	if s := sessions[1].Conn; s != want {
		t.Errorf("client's session: %+v, want %+v", s, want)
	}
	dump, err := a.DumpSessions(ctx)
	if err != nil || len(dump) != 2 {
		t.Fatalf("A's sessions: %+v (%v), want 2", dump, err)
	}

	// Node C has nothing of A's: the client is scheduled anew there.
	if got := syn(2, client); got != be1 {
		t.Fatalf("client at C (no sync) to %s, want %s (rr's first)", got, be1)
	}
	// Node B installs A's events, then sends the client where A did.
	if n, err := b.InstallConns(ctx, got); err != nil || n != 5 {
		t.Errorf("install at B: %d of 5, %v", n, err)
	}
	if got := syn(1, client); got != be2 {
		t.Errorf("client at B after sync to %s, want %s (A's pick)", got, be2)
	}
	if got := syn(1, client2); got != be1 {
		t.Errorf("client2 at B after sync to %s, want %s (A's pick)", got, be1)
	}
	if st, _ := b.Stats(); st["persist_hit"] != 2 {
		t.Errorf("B's persist_hit = %d, want 2", st["persist_hit"])
	}
	// B lists them too (for a node that joins after).
	if dump, err := b.DumpSessions(ctx); err != nil || len(dump) != 2 {
		t.Errorf("B's sessions: %+v (%v), want 2", dump, err)
	}
	// A session of a farm that does not persist here is refused.
	bad := sessions[1]
	bad.Conn.VIP = netip.AddrPortFrom(netip.MustParseAddr("10.99.0.2"), 80)
	if n, err := b.InstallConns(ctx, []dataplane.ConnEvent{bad}); n != 0 || err == nil || !strings.Contains(err.Error(), "persistence") {
		t.Errorf("a session of a farm without persistence: %d, %v; want it refused", n, err)
	}
}

// connWatch reads a plane's sync records (WatchConns) until end.
type connWatch struct {
	mu     sync.Mutex
	events []dataplane.ConnEvent
	stop   context.CancelFunc
	done   chan error
}

// watchConns starts reading p's records and returns once the reader has
// turned the program's records on (xlb_sync_on).
func watchConns(ctx context.Context, t *testing.T, p *Plane) *connWatch {
	t.Helper()
	wctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	w := &connWatch{stop: stop, done: make(chan error, 1)}
	go func() {
		w.done <- p.WatchConns(wctx, func(evs []dataplane.ConnEvent) {
			w.mu.Lock()
			w.events = append(w.events, evs...)
			w.mu.Unlock()
		})
	}()
	waitFor(t, "xlb_sync_on", func() bool {
		var on uint32
		return p.objs.XlbSyncOn.Get(&on) == nil && on == 1
	})
	return w
}

// settled waits for at least n records and then three batch waits more
// (nothing more comes), and returns every record read.
func (w *connWatch) settled(t *testing.T, n int) []dataplane.ConnEvent {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d sync records", n), func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.events) >= n
	})
	time.Sleep(3 * syncBatchWait)
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]dataplane.ConnEvent(nil), w.events...)
}

// end stops the reader and checks it ended cleanly.
func (w *connWatch) end(t *testing.T) {
	t.Helper()
	w.stop()
	if err := <-w.done; err != nil {
		t.Fatalf("WatchConns: %v", err)
	}
}
