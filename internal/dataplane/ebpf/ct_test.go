package ebpf

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

func ctKey(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, proto uint8) xlbCtKey {
	return xlbCtKey{Src: [4]uint32{ne32(src)}, Dst: [4]uint32{ne32(dst)}, Sport: ne16(sport), Dport: ne16(dport), Proto: proto, Family: afInet}
}

// ctState returns the state of both entries of a flow given by its forward
// key; -1 for a missing entry.
func ctState(t *testing.T, p *Plane, fwd xlbCtKey) (f, r int) {
	t.Helper()
	var v xlbCtVal
	if err := p.objs.XlbCt.Lookup(fwd, &v); err != nil {
		return -1, -1
	}
	rk := xlbCtKey{Src: v.Dst, Dst: v.Src, Sport: v.Dport, Dport: v.Sport, Proto: fwd.Proto, Family: fwd.Family}
	var rv xlbCtVal
	if err := p.objs.XlbCt.Lookup(rk, &rv); err != nil {
		return int(v.State), -1
	}
	return int(v.State), int(rv.State)
}

// TestConntrackStates walks a TCP connection through its states with
// BPF_PROG_TEST_RUN and checks both conntrack entries at each step, and that
// a SYN on a closed tuple is scheduled as a new connection.
func TestConntrackStates(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	if err := p.Reconcile(context.Background(), fixtureFarms(t)); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	fwd := ctKey(client, 42000, vip1, 80, protoTCP)
	fromClient := func(flags uint8) pktSpec {
		return pktSpec{src: client, sport: 42000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: flags}
	}
	fromBackend := func(be netip.Addr, mac int, flags uint8) pktSpec {
		return pktSpec{src: be, sport: 8080, dst: client, dport: 42000, proto: protoTCP, tcpFlags: flags, srcMAC: macBackend(mac), dstMAC: macBack}
	}
	const fin, rst = 0x01, 0x04
	steps := []struct {
		desc    string
		pkt     pktSpec
		backend netip.Addr // the backend the output goes to (or comes from)
		state   uint8
	}{
		{"SYN", fromClient(tcpSYN), be1, ctStateSYN},
		{"SYN-ACK keeps SYN", fromBackend(be1, 0, tcpSYN|tcpACK), be1, ctStateSYN},
		{"ACK completes the handshake", fromClient(tcpACK), be1, ctStateEST},
		{"retransmitted SYN of an established connection keeps its backend", fromClient(tcpSYN), be1, ctStateEST},
		{"FIN from the client", fromClient(fin | tcpACK), be1, ctStateFIN},
		{"FIN-ACK from the backend", fromBackend(be1, 0, fin|tcpACK), be1, ctStateFIN},
		{"SYN reusing the closed tuple is a new connection (rr: next backend)", fromClient(tcpSYN), be2, ctStateSYN},
		{"RST from the new backend", fromBackend(be2, 1, rst|tcpACK), be2, ctStateClose},
	}
	for _, s := range steps {
		verdict, out := runProg(t, ns, prog, s.pkt.build())
		if verdict != verdictRedirect {
			st, _ := p.Stats()
			t.Fatalf("%s: verdict %d (stats %v)", s.desc, verdict, st)
		}
		got, err := parse(out)
		if err != nil {
			t.Fatalf("%s: %v", s.desc, err)
		}
		if got.dst != s.backend && got.dst != client {
			t.Errorf("%s: went to %s, want %s", s.desc, got.dst, s.backend)
		}
		if got.dst == client && got.src != vip1 {
			t.Errorf("%s: reply from %s, want the VIP", s.desc, got.src)
		}
		if f, r := ctState(t, p, fwd); f != int(s.state) || r != int(s.state) {
			t.Errorf("%s: states (forward %d, reply %d), want %d in both", s.desc, f, r, s.state)
		}
	}
	verdict, _ := runProg(t, ns, prog, pktSpec{src: client, sport: 5100, dst: vip1, dport: 53, proto: protoUDP, payload: []byte("q")}.build())
	if verdict != verdictRedirect {
		t.Fatalf("UDP: verdict %d", verdict)
	}
	if f, r := ctState(t, p, ctKey(client, 5100, vip1, 53, protoUDP)); f != int(ctStateUDP) || r != int(ctStateUDP) {
		t.Errorf("UDP flow: states %d, %d, want %d", f, r, ctStateUDP)
	}
}

// TestConntrackExpiry: an idle flow expires after its timeout and its next
// packet is scheduled anew; a flow whose one direction is idle but whose
// other carries packets does not expire.
func TestConntrackExpiry(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(t), ConnTableSize: 4096, Timeouts: Timeouts{UDP: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	web := farm(t, "dns", "10.99.0.1", 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR,
		"10.200.0.11:53", "10.200.0.12:53")
	if err := p.Reconcile(context.Background(), []*model.Farm{web}); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	send := func(desc string, sport uint16) netip.Addr {
		t.Helper()
		verdict, out := runProg(t, ns, prog, pktSpec{src: client, sport: sport, dst: vip1, dport: 53, proto: protoUDP, payload: []byte("q")}.build())
		got, err := parse(out)
		if verdict != verdictRedirect || err != nil {
			t.Fatalf("%s: verdict %d, %v", desc, verdict, err)
		}
		return got.dst
	}
	reply := func(be netip.Addr, mac int, dport uint16) {
		t.Helper()
		verdict, out := runProg(t, ns, prog, pktSpec{src: be, sport: 53, dst: client, dport: dport, proto: protoUDP, payload: []byte("a"), srcMAC: macBackend(mac), dstMAC: macBack}.build())
		got, err := parse(out)
		if verdict != verdictRedirect || err != nil || got.src != vip1 {
			t.Fatalf("reply: verdict %d, %v, from %s", verdict, err, got.src)
		}
	}
	expired := func() uint64 {
		st, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st["ct_expired"]
	}

	if got := send("first", 6000); got != be1 {
		t.Fatalf("first flow to %s, want %s", got, be1)
	}
	// The other direction keeps the flow alive: replies every 250 ms for 3 s.
	if got := send("second flow", 6001); got != be2 {
		t.Fatalf("second flow to %s, want %s", got, be2)
	}
	for range 12 {
		time.Sleep(250 * time.Millisecond)
		reply(be2, 1, 6001)
	}
	if got := send("second flow after 3 s, replies flowing", 6001); got != be2 {
		t.Errorf("a flow with live replies was rescheduled to %s", got)
	}
	// Port 6000 has been idle for more than 3 s (timeout 2 s).
	if got := send("first flow after 3 s idle", 6000); got != be1 {
		// rr: the counter stands at 2, so a new flow goes to be1 again;
		// what shows the expiry is the counter below.
		t.Errorf("expired flow went to %s", got)
	}
	if n := expired(); n != 1 {
		t.Errorf("ct_expired = %d, want 1 (the idle flow)", n)
	}
	var v xlbCtVal
	if err := p.objs.XlbCt.Lookup(ctKey(client, 6000, vip1, 53, protoUDP), &v); err != nil {
		t.Fatalf("expired flow not tracked again: %v", err)
	}
}

// TestICMPErrorFixtures: ICMP errors about NATed packets are translated
// for the side that sent them (dnat and snat), and others pass untouched.
func TestICMPErrorFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	if err := p.Reconcile(context.Background(), fixtureFarms(t)); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	router := netip.MustParseAddr("10.200.0.254")
	// dnat flow client:43000 -> VIP1:80 -> be1:8080, and the packet as it left.
	_, toBackend := runProg(t, ns, prog, pktSpec{src: client, sport: 43000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
	// snat flow client:43001 -> VIP2:80 -> (lbBack:43001) be1:80.
	_, toBackendSnat := runProg(t, ns, prog, pktSpec{src: client, sport: 43001, dst: vip2, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
	if g, _ := parse(toBackendSnat); g.src != lbBack {
		t.Fatalf("snat flow left from %s", g.src)
	}

	for _, c := range []struct {
		desc     string
		in       []byte
		verdict  uint32
		src, dst netip.Addr // outer, after
		qsrc     netip.Addr
		qsport   uint16
		qdst     netip.Addr
		qdport   uint16
	}{
		{
			desc:    "dnat: fragmentation needed from a router towards the backend",
			in:      icmpError(macBackend(0), macBack, router, client, 3, 4, toBackend),
			verdict: verdictRedirect, src: router, dst: client, qsrc: client, qsport: 43000, qdst: vip1, qdport: 80,
		},
		{
			desc:    "dnat: port unreachable from the backend itself comes from the VIP",
			in:      icmpError(macBackend(0), macBack, be1, client, 3, 3, toBackend),
			verdict: verdictRedirect, src: vip1, dst: client, qsrc: client, qsport: 43000, qdst: vip1, qdport: 80,
		},
		{
			desc:    "snat: time exceeded to the LB's address goes to the client",
			in:      icmpError(macBackend(0), macBack, router, lbBack, 11, 0, toBackendSnat),
			verdict: verdictRedirect, src: router, dst: client, qsrc: client, qsport: 43001, qdst: vip2, qdport: 80,
		},
	} {
		verdict, out := runProg(t, ns, prog, c.in)
		if verdict != c.verdict {
			st, _ := p.Stats()
			t.Errorf("%s: verdict %d, want %d (stats %v)", c.desc, verdict, c.verdict, st)
			continue
		}
		got, err := parseICMP(out)
		if err != nil {
			t.Errorf("%s: %v", c.desc, err)
			continue
		}
		if got.src != c.src || got.dst != c.dst || got.qsrc != c.qsrc || got.qsport != c.qsport || got.qdst != c.qdst || got.qdpt != c.qdport {
			t.Errorf("%s: got %s -> %s quoting %s:%d -> %s:%d, want %s -> %s quoting %s:%d -> %s:%d", c.desc,
				got.src, got.dst, got.qsrc, got.qsport, got.qdst, got.qdpt, c.src, c.dst, c.qsrc, c.qsport, c.qdst, c.qdport)
		}
		if got.ttl != 63 || !bytes.Equal(got.dstMAC, macClient) {
			t.Errorf("%s: ttl %d, destination MAC %s", c.desc, got.ttl, got.dstMAC)
		}
	}

	// Untouched: echo request to the VIP, an error quoting an untracked
	// flow, a quote cut short.
	untracked := pktSpec{src: client, sport: 43999, dst: be2, dport: 8080, proto: protoTCP, tcpFlags: tcpSYN}.build()
	echoReq := icmpError(macClient, macLB, client, vip1, 8, 0, untracked)
	for _, c := range []struct {
		desc string
		in   []byte
	}{
		{"echo request", echoReq},
		{"error about an untracked flow", icmpError(macBackend(1), macBack, router, client, 3, 4, untracked)},
		{"quote cut short", icmpError(macBackend(0), macBack, router, client, 3, 4, toBackend)[:14+20+8+20+2]},
	} {
		verdict, out := runProg(t, ns, prog, c.in)
		if verdict != verdictNext || !bytes.Equal(out, c.in) {
			t.Errorf("%s: verdict %d, changed %v", c.desc, verdict, !bytes.Equal(out, c.in))
		}
	}
}

// TestDSRFixtures: dsr keeps the packet as it is but for the MACs (and
// TTL) and sends it to the backend; a connection keeps its backend; no reply
// entry is made (replies do not pass through the balancer).
func TestDSRFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	vip4 := netip.MustParseAddr("10.99.0.4")
	dsr := farm(t, "dsr", vip4.String(), 80, model.ProtoTCP, model.ModeDSR, model.SchedRR,
		"10.200.0.11:0", "10.200.0.12:80")
	if err := p.Reconcile(context.Background(), []*model.Farm{dsr}); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		sport uint16
		flags uint8
		mac   int
	}{{44000, tcpSYN, 0}, {44000, tcpACK, 0}, {44001, tcpSYN, 1}, {44000, tcpACK, 0}, {44001, tcpACK, 1}} {
		verdict, out := runProg(t, ns, p.objs.XlbIngress, pktSpec{src: client, sport: c.sport, dst: vip4, dport: 80, proto: protoTCP, tcpFlags: c.flags}.build())
		if verdict != verdictRedirect {
			t.Fatalf("packet %d: verdict %d", i, verdict)
		}
		got, err := parse(out)
		if err != nil {
			t.Fatal(err)
		}
		if got.src != client || got.sport != c.sport || got.dst != vip4 || got.dport != 80 {
			t.Errorf("packet %d: tuple changed to %s:%d -> %s:%d", i, got.src, got.sport, got.dst, got.dport)
		}
		if !bytes.Equal(got.dstMAC, macBackend(c.mac)) || !bytes.Equal(got.srcMAC, macBack) || got.ttl != 63 {
			t.Errorf("packet %d: MACs %s -> %s, TTL %d; want %s -> %s, 63", i, got.srcMAC, got.dstMAC, got.ttl, macBack, macBackend(c.mac))
		}
	}
	if n := countMap(t, p).ct; n != 2 {
		t.Errorf("%d conntrack entries for 2 dsr connections, want 2 (forward only)", n)
	}
	// A reply from the backend (VIP -> client) is not ours: untouched.
	in := pktSpec{src: vip4, sport: 80, dst: client, dport: 44000, proto: protoTCP, tcpFlags: tcpSYN | tcpACK, srcMAC: macBackend(0), dstMAC: macBack}.build()
	if verdict, out := runProg(t, ns, p.objs.XlbIngress, in); verdict != verdictNext || !bytes.Equal(out, in) {
		t.Errorf("dsr reply: verdict %d, changed %v", verdict, !bytes.Equal(out, in))
	}
	// Backend ports other than 0 or the virtual port are refused.
	bad := farm(t, "dsr", vip4.String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080")
	bad.Mode = model.ModeDSR
	if err := check(bad); err == nil || !strings.Contains(err.Error(), "port") {
		t.Errorf("dsr with backend port 8080: %v", err)
	}
}

// TestConntrackPeerRepair: when the LRU evicts one entry of a live flow,
// the next refresh of the other recreates it (dnat and snat: for snat the
// reply entry is the port allocation, which comes back as it was).
func TestConntrackPeerRepair(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	// Refresh on every packet, so the test need not wait a second.
	p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, Interfaces: []string{"front"},
		PinPath: mountBPFFS(t), ConnTableSize: 4096, ctRefresh: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Reconcile(context.Background(), fixtureFarms(t)); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	for _, c := range []struct {
		desc  string
		vip   netip.Addr
		sport uint16
	}{{"dnat", vip1, 46000}, {"snat", vip2, 46001}} {
		syn := pktSpec{src: client, sport: c.sport, dst: c.vip, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build()
		if v, _ := runProg(t, ns, prog, syn); v != verdictRedirect {
			t.Fatalf("%s: SYN verdict %d", c.desc, v)
		}
		fwd := ctKey(client, c.sport, c.vip, 80, protoTCP)
		var fv xlbCtVal
		if err := p.objs.XlbCt.Lookup(fwd, &fv); err != nil {
			t.Fatal(err)
		}
		rk := xlbCtKey{Src: fv.Dst, Dst: fv.Src, Sport: fv.Dport, Dport: fv.Sport, Proto: protoTCP, Family: afInet}
		var before xlbCtVal
		if err := p.objs.XlbCt.Lookup(rk, &before); err != nil {
			t.Fatalf("%s: no reply entry: %v", c.desc, err)
		}
		if err := p.objs.XlbCt.Delete(rk); err != nil { // as an LRU eviction would
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // past the coarse clock's tick

		ack := pktSpec{src: client, sport: c.sport, dst: c.vip, dport: 80, proto: protoTCP, tcpFlags: tcpACK}.build()
		if v, _ := runProg(t, ns, prog, ack); v != verdictRedirect {
			t.Fatalf("%s: ACK verdict %d", c.desc, v)
		}
		var after xlbCtVal
		if err := p.objs.XlbCt.Lookup(rk, &after); err != nil {
			t.Fatalf("%s: reply entry not repaired: %v", c.desc, err)
		}
		if after.Src != before.Src || after.Dst != before.Dst || after.Sport != before.Sport || after.Dport != before.Dport || after.Dir != ctReply {
			t.Errorf("%s: repaired reply entry %+v, was %+v", c.desc, after, before)
		}
	}
	if st, _ := p.Stats(); st["peer_repair"] != 2 {
		t.Errorf("peer_repair = %d, want 2", st["peer_repair"])
	}
}

// TestStatelessFixtures: stlsdnat translates every packet without
// conntrack, both ways, and refuses a backend another stlsdnat farm holds.
func TestStatelessFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	vip5 := netip.MustParseAddr("10.99.0.5")
	stl := farm(t, "stl", vip5.String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedMaglev, "10.200.0.11:8080", "10.200.0.12:8080")
	stl.Mode = model.ModeStlsDNAT
	if err := check(stl); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Apply(ctx, diffOf(nil, stl)); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	var be netip.Addr
	var mac net.HardwareAddr
	for i, flags := range []uint8{tcpSYN, tcpACK, tcpACK} {
		verdict, out := runProg(t, ns, prog, pktSpec{src: client, sport: 47000, dst: vip5, dport: 80, proto: protoTCP, tcpFlags: flags}.build())
		got, err := parse(out)
		if verdict != verdictRedirect || err != nil {
			t.Fatalf("packet %d: verdict %d, %v", i, verdict, err)
		}
		if i == 0 {
			be, mac = got.dst, got.dstMAC
		}
		if got.src != client || got.dst != be || got.dport != 8080 || !bytes.Equal(got.dstMAC, mac) {
			t.Errorf("packet %d: %s:%d -> %s:%d (%s), want the first packet's backend %s:8080", i, got.src, got.sport, got.dst, got.dport, got.dstMAC, be)
		}
	}
	verdict, out := runProg(t, ns, prog, pktSpec{src: be, sport: 8080, dst: client, dport: 47000, proto: protoTCP, tcpFlags: tcpACK, srcMAC: mac, dstMAC: macBack}.build())
	got, err := parse(out)
	if verdict != verdictRedirect || err != nil || got.src != vip5 || got.sport != 80 || got.dst != client || !bytes.Equal(got.dstMAC, macClient) {
		t.Errorf("reply: verdict %d, %v, %s:%d -> %s (%s)", verdict, err, got.src, got.sport, got.dst, got.dstMAC)
	}
	if n := countMap(t, p).ct; n != 0 {
		t.Errorf("stlsdnat made %d conntrack entries", n)
	}
	other := pktSpec{src: be, sport: 9999, dst: client, dport: 47000, proto: protoTCP, tcpFlags: tcpACK, srcMAC: mac, dstMAC: macBack}.build()
	if verdict, out := runProg(t, ns, prog, other); verdict != verdictNext || !bytes.Equal(out, other) {
		t.Errorf("backend traffic from another port: verdict %d", verdict)
	}
	// A second stlsdnat farm on the same backend is refused, and changes nothing.
	stl2 := farm(t, "stl2", "10.99.0.6", 80, model.ProtoUDP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080")
	stl2.Protocol = model.ProtoTCP
	stl2.Scheduler, stl2.SchedParam = model.SchedHash, model.KeySrcIP
	stl2.Mode = model.ModeStlsDNAT
	if err := p.Apply(ctx, diffOf(nil, stl2)); err == nil || !strings.Contains(err.Error(), "already serves stlsdnat farm") {
		t.Errorf("second stlsdnat farm on a taken backend: %v", err)
	}
	if _, out := runProg(t, ns, prog, pktSpec{src: be, sport: 8080, dst: client, dport: 47000, proto: protoTCP, tcpFlags: tcpACK, srcMAC: mac, dstMAC: macBack}.build()); func() bool { g, _ := parse(out); return g.src != vip5 }() {
		t.Errorf("the refused farm changed the first one's mapping")
	}
	// Deleting the farm removes its mappings.
	if err := p.Apply(ctx, diffOf(stl, nil)); err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var k xlbStlKey
	var v xlbStlVal
	if it := p.objs.XlbStateless.Iterate(); it.Next(&k, &v) {
		t.Errorf("mapping left after the farm was deleted: %+v", k)
	}
	// tcp with a per-packet scheduler is refused.
	bad := *stl
	bad.Scheduler = model.SchedRR
	if err := check(&bad); err == nil || !strings.Contains(err.Error(), "hash") {
		t.Errorf("stlsdnat tcp rr: %v", err)
	}
}
