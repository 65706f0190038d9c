package ebpf

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

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
// leaves packets unmarked and routed by the main table. A dsr flow with a
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
	for _, f := range []*model.Farm{web, dsr} {
		if err := check(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Reconcile(context.Background(), []*model.Farm{web, dsr}); err != nil {
		t.Fatal(err)
	}
	ing := p.objs.XlbIngress
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
