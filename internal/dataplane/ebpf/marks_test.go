package ebpf

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// runProgMark is runProg with a __sk_buff context: the packet comes in
// with mark 0 and the mark the program leaves on it is returned (the
// context's first fields are len, pkt_type and mark; the kernel takes a
// shorter context and zeroes the rest).
func runProgMark(tb testing.TB, ns netns.NsHandle, prog *ebpf.Program, pkt []byte) (uint32, []byte, uint32) {
	tb.Helper()
	var ret uint32
	out := make([]byte, len(pkt)+256)
	var ctxOut [64]uint32 // struct __sk_buff is 192 bytes; a shorter out buffer is ENOSPC
	err := testutil.Do(ns, func() error {
		opts := ebpf.RunOptions{Data: pkt, DataOut: out, Context: [3]uint32{}, ContextOut: &ctxOut}
		var err error
		ret, err = prog.Run(&opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		tb.Fatalf("BPF_PROG_TEST_RUN (%d bytes): %v", len(pkt), err)
	}
	return ret, out, ctxOut[2]
}

// TestMarkFixtures: a backend's mark is set on every packet of its flows,
// both ways (the nft plane's ct mark), and routes them by the user's
// fwmark rule (bpf_fib_lookup with the mark); a backend without mark
// leaves packets unmarked and routed by the main table; an IPv6 UDP snat
// flow is marked both ways too. A dsr flow with a
// mark is left by the XDP program to the tcx program (XDP cannot set
// skb->mark), an unmarked one is forwarded in XDP. Before marks were
// built the plane refused the farms.
func TestMarkFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	// Marked packets to the backends' network go out of "front" instead,
	// to a neighbour of their own MAC: the rule a user would write to
	// send one backend's traffic another way.
	viaFront := net.HardwareAddr{0x02, 0, 0, 0, 9, 11}
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	front, err := nh.LinkByName("front")
	if err != nil {
		t.Fatal(err)
	}
	rule := netlink.NewRule()
	rule.Mark, rule.Table, rule.Priority = 0x100, 100, 100
	mask := uint32(0xffffffff)
	rule.Mask = &mask
	if err := nh.RuleAdd(rule); err != nil {
		t.Fatalf("ip rule fwmark: %v", err)
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: front.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 200, 0, 0).To4(), Mask: net.CIDRMask(24, 32)}, Table: 100, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatalf("route in table 100: %v", err)
	}
	if err := nh.NeighAdd(&netlink.Neigh{LinkIndex: front.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("10.200.0.11"), HardwareAddr: viaFront, Family: netlink.FAMILY_V4}); err != nil {
		t.Fatal(err)
	}

	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	web := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080", "10.200.0.12:8080")
	web.Backends[0].Mark = 0x100
	dsr := farm(t, "dsr", "10.99.0.4", 80, model.ProtoTCP, model.ModeDSR, model.SchedRR, "10.200.0.11:0", "10.200.0.12:0")
	dsr.Backends[0].Mark = 0x100
	web6 := farm(t, "web6", "fd00:99::1", 80, model.ProtoUDP, model.ModeSNAT, model.SchedRR, "[fd00:200::11]:8080")
	web6.Backends[0].Mark = 0x200
	for _, f := range []*model.Farm{web, dsr, web6} {
		if err := check(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Reconcile(context.Background(), []*model.Farm{web, dsr, web6}); err != nil {
		t.Fatal(err)
	}
	ing := p.objs.XlbIngress
	c6, vip6, be6, lb6 := netip.MustParseAddr("fd00:100::2"), netip.MustParseAddr("fd00:99::1"), netip.MustParseAddr("fd00:200::11"), netip.MustParseAddr("fd00:200::1")
	for _, c := range []struct {
		desc string
		in   pktSpec
		mark uint32
		mac  net.HardwareAddr
	}{
		{"SYN to the marked backend", pktSpec{src: client, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}, 0x100, viaFront},
		{"SYN to the other backend", pktSpec{src: client, sport: 40001, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}, 0, macBackend(1)},
		{"reply of the marked backend", pktSpec{src: be1, sport: 8080, dst: client, dport: 40000, proto: protoTCP, tcpFlags: tcpSYN | tcpACK, srcMAC: macBackend(0), dstMAC: macBack}, 0x100, macClient},
		{"ACK to the marked backend", pktSpec{src: client, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK}, 0x100, viaFront},
		{"reply of the other backend", pktSpec{src: be2, sport: 8080, dst: client, dport: 40001, proto: protoTCP, tcpFlags: tcpSYN | tcpACK, srcMAC: macBackend(1), dstMAC: macBack}, 0, macClient},
		// IPv6, UDP, snat: the mark both ways (no fwmark rule for IPv6).
		{"IPv6 UDP to the marked backend", pktSpec{src: c6, sport: 5000, dst: vip6, dport: 80, proto: protoUDP, payload: []byte("q")}, 0x200, macBackend(0)},
		{"IPv6 UDP reply", pktSpec{src: be6, sport: 8080, dst: lb6, dport: 5000, proto: protoUDP, payload: []byte("a"), srcMAC: macBackend(0), dstMAC: macBack}, 0x200, macClient},
	} {
		verdict, out, mark := runProgMark(t, ns, ing, c.in.build())
		if verdict != verdictRedirect {
			t.Errorf("%s: verdict %d, want redirect", c.desc, verdict)
			continue
		}
		if mark != c.mark {
			t.Errorf("%s: mark %#x, want %#x", c.desc, mark, c.mark)
		}
		if got, err := parse(out); err != nil || !bytes.Equal(got.dstMAC, c.mac) {
			t.Errorf("%s: destination MAC %v (%v), want %s", c.desc, got.dstMAC, err, c.mac)
		}
	}

	// dsr: the XDP program may forward established flows' packets
	// towards "back" and "front".
	for _, name := range []string{"back", "front"} {
		l, err := nh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.objs.XlbXdpTx.Update(uint32(l.Attrs().Index), uint32(1), ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	vip4 := netip.MustParseAddr("10.99.0.4")
	for i, c := range []struct {
		sport uint16
		mark  uint32
		xdp   uint32
	}{{45000, 0x100, xdpPass}, {45001, 0, xdpRedirect}} {
		syn := pktSpec{src: client, sport: c.sport, dst: vip4, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}
		if v, _, mark := runProgMark(t, ns, ing, syn.build()); v != verdictRedirect || mark != c.mark {
			t.Errorf("dsr flow %d: SYN verdict %d mark %#x, want redirect, %#x", i, v, mark, c.mark)
		}
		// The handshake's ACK (a change of state) is the tcx program's;
		// the next segment is the XDP program's to forward if it can.
		ack := pktSpec{src: client, sport: c.sport, dst: vip4, dport: 80, proto: protoTCP, tcpFlags: tcpACK}
		if v, _, mark := runProgMark(t, ns, ing, ack.build()); v != verdictRedirect || mark != c.mark {
			t.Errorf("dsr flow %d: ACK through tcx: verdict %d mark %#x, want redirect, %#x", i, v, mark, c.mark)
		}
		if v, _ := runProg(t, ns, p.objs.XlbXdp, ack.build()); v != c.xdp {
			t.Errorf("dsr flow %d (mark %#x): XDP verdict %d, want %d", i, c.mark, v, c.xdp)
		}
	}
}

// nftIn runs nft with args in ns (the command is started from a thread in
// the namespace, so it inherits it).
func nftIn(t *testing.T, ns netns.NsHandle, args ...string) string {
	t.Helper()
	var out []byte
	err := testutil.Do(ns, func() error {
		var err error
		out, err = exec.Command("nft", args...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestTrafficMarkPeer: the flows of a marked backend whose next hop is a
// veth with its peer in the backend's namespace (and the replies, whose
// next hop is the client's veth) are sent with bpf_redirect, not
// bpf_redirect_peer: the veth's transmit into another namespace clears
// the mark (skb_scrub_packet with xnet), as it does after the stack's
// forwarding on the nft plane. A peer redirect scrubs the packet without
// clearing it: with the peer path kept for marked flows (tried), the marked
// flows' packets reached the backend's and the client's namespaces with
// 0x100 (54 of 110 and 33 of 66 packets counted there: all of the marked
// farm's). An unmarked farm keeps the peer path.
func TestTrafficMarkPeer(t *testing.T) {
	n := newPeerNet(t)
	p := newPlane(t, n.lb, mountBPFFS(t), nil, 16384)
	var farms []*model.Farm
	for i, mark := range []uint32{0x100, 0} {
		f := farm(t, fmt.Sprintf("m%d", i), testutil.VIP4(90+i).String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR,
			netip.AddrPortFrom(n.beIP[0][0], 8080).String())
		f.Backends[0].Mark = mark
		farms = append(farms, f)
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(t.TempDir(), "count.nft")
	if err := os.WriteFile(rules, []byte("table inet xlbtest {\n\tchain pre {\n\t\ttype filter hook prerouting priority -300;\n\t\tmeta mark 0x100 counter comment \"marked\"\n\t\tmeta l4proto tcp counter comment \"all\"\n\t}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hosts := map[string]netns.NsHandle{"backend": n.be[0], "client": n.client}
	for _, ns := range hosts {
		nftIn(t, ns, "-f", rules)
	}
	counters := func(ns netns.NsHandle) (marked, all int) {
		out := nftIn(t, ns, "list", "chain", "inet", "xlbtest", "pre")
		for _, l := range strings.Split(out, "\n") {
			var n int
			if i := strings.Index(l, "packets "); i >= 0 {
				fmt.Sscan(l[i+len("packets "):], &n)
			}
			switch {
			case strings.Contains(l, `"marked"`):
				marked = n
			case strings.Contains(l, `"all"`):
				all = n
			}
		}
		return marked, all
	}
	const reqs = 10
	for i, mark := range []uint32{0x100, 0} {
		vip := netip.AddrPortFrom(testutil.VIP4(90+i), 80)
		deadline := time.Now().Add(10 * time.Second)
		for { // warm up: carrier, neighbours
			if _, err := testutil.AskTCP(n.client, vip); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no answer", vip)
			}
			time.Sleep(100 * time.Millisecond)
		}
		st0, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		for range reqs {
			if _, err := testutil.AskTCP(n.client, vip); err != nil {
				t.Fatalf("%s: %v", vip, err)
			}
		}
		st1, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		peer, redirect := st1["fib_peer"]-st0["fib_peer"], st1["fib_redirect"]-st0["fib_redirect"]
		t.Logf("mark %#x: fib_peer %d fib_redirect %d", mark, peer, redirect)
		switch {
		case mark != 0 && (peer != 0 || redirect < 2*reqs):
			t.Errorf("marked flows: fib_peer %d, fib_redirect %d; want 0 and >= %d (both directions transmitted)", peer, redirect, 2*reqs)
		case mark == 0 && (redirect != 0 || peer < 2*reqs):
			t.Errorf("unmarked flows: fib_peer %d, fib_redirect %d; want >= %d and 0", peer, redirect, 2*reqs)
		}
	}
	for name, ns := range hosts {
		marked, all := counters(ns)
		t.Logf("%s: %d tcp packets in, %d with mark 0x100", name, all, marked)
		if all < 2*reqs || marked != 0 {
			t.Errorf("%s received %d tcp packets, %d with the LB's mark 0x100: want >= %d and 0", name, all, marked, 2*reqs)
		}
	}
}

// TestConnSyncMark: flows node A gave a mark, installed at node B from A's
// dump, carry in both entries the mark B gives them, and B's program marks
// their packets both ways: the mark of B's backend, or, for a backend
// without one, the mark B's mark table gives the client. Before, an
// installed flow had no mark, and then no table mark (the test fails).
// The table's DSCP too (sync_table_values), on the client's packets.
func TestConnSyncMark(t *testing.T) {
	testutil.RequireRoot(t)
	nsA, nsB := fixtureNS(t), fixtureNS(t)
	a := newPlane(t, nsA, mountBPFFS(t), []string{"front", "back"}, 4096)
	b := newPlane(t, nsB, mountBPFFS(t), []string{"front", "back"}, 4096)
	ctx := context.Background()
	vip2 := netip.MustParseAddr("10.99.0.2")
	for _, p := range []*Plane{a, b} {
		f := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080")
		f.Backends[0].Mark = 0x100
		tf := farm(t, "tabled", vip2.String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080")
		tf.Policies = []model.PolicyRef{{Name: "mk"}}
		mk := addrTable(t, "mk", model.ListNone, 1, 1)
		mk.Values = model.ValMark | model.ValDSCP
		e, err := mk.ParseEntry(model.EntryInput{Key: client.String(), Value: "mark=0x200,dscp=46", ValueSet: true}, 0)
		if err != nil {
			t.Fatal(err)
		}
		mk.PutEntry(e)
		d := created(mk)
		d.Farms = []plan.FarmChange{{New: tf}}
		applyTables(t, p, d)
		if err := p.Reconcile(ctx, []*model.Farm{f, tf}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		desc  string
		vip   netip.Addr
		sport uint16
		mark  uint32
	}{
		{"backend's mark", vip1, 40000, 0x100},
		{"table's mark", vip2, 40001, 0x200},
	} {
		syn := pktSpec{src: client, sport: c.sport, dst: c.vip, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}
		if v, _, mark := runProgMark(t, nsA, a.objs.XlbIngress, syn.build()); v != verdictRedirect || mark != c.mark {
			t.Fatalf("%s: SYN at A: verdict %d mark %#x, want %#x", c.desc, v, mark, c.mark)
		}
	}
	conns, err := a.DumpConns(ctx)
	if err != nil || len(conns) != 2 {
		t.Fatalf("A's dump: %v, %v", conns, err)
	}
	var evs []dataplane.ConnEvent
	for _, c := range conns {
		evs = append(evs, dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: c})
	}
	if n, err := b.InstallConns(ctx, evs); n != 2 || err != nil {
		t.Fatalf("install at B: %d, %v", n, err)
	}
	for _, c := range []struct {
		desc string
		in   pktSpec
		mark uint32
	}{
		{"ACK at B", pktSpec{src: client, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK}, 0x100},
		{"reply at B", pktSpec{src: be1, sport: 8080, dst: client, dport: 40000, proto: protoTCP, tcpFlags: tcpACK, srcMAC: macBackend(0), dstMAC: macBack}, 0x100},
		{"ACK at B, table's mark", pktSpec{src: client, sport: 40001, dst: vip2, dport: 80, proto: protoTCP, tcpFlags: tcpACK}, 0x200},
		{"reply at B, table's mark", pktSpec{src: be1, sport: 8080, dst: client, dport: 40001, proto: protoTCP, tcpFlags: tcpACK, srcMAC: macBackend(0), dstMAC: macBack}, 0x200},
	} {
		v, out, mark := runProgMark(t, nsB, b.objs.XlbIngress, c.in.build())
		if v != verdictRedirect || mark != c.mark {
			t.Errorf("%s: verdict %d mark %#x, want redirect, %#x", c.desc, v, mark, c.mark)
		}
		// The table's DSCP, on the table's client's packets only (the
		// ACK of the tabled farm).
		wantTOS := uint8(0)
		if c.in.dst == vip2 {
			wantTOS = 46 << 2
		}
		if got, err := parse(out); err != nil || got.tos != wantTOS {
			t.Errorf("%s: traffic class %#x (%v), want %#x", c.desc, got.tos, err, wantTOS)
		}
	}
}
