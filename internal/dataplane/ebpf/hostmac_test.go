package ebpf

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestOtherHostFrames: a frame whose destination MAC is another host's
// (the client's neighbour entry for its gateway names a foreign MAC, as
// when a switch floods a frame for a node that died) is left to the stack,
// which drops it, as the nft plane's stack does: the VIP does not answer
// it and other_host counts it. With the LB's MAC again, the VIP answers.
// The backends sit behind a bridge whose ports see the LB's own frames (to
// the bridge's MAC) as another host's: their replies are served all along.
func TestOtherHostFrames(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	vip := netip.AddrPortFrom(testutil.VIP4(40), 53)
	f := farm(t, "dns", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8053)...)
	if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
		t.Fatal(err)
	}
	if _, err := testutil.AskUDP(topo.Client.NS, vip); err != nil {
		t.Fatalf("the VIP before: %v", err)
	}
	lbMAC := linkAttrs(t, topo.LB.NS, topo.LB.Link).HardwareAddr.String()
	gw := func(mac string) {
		testutil.Run(t, topo.Client.Name, "ip", "neigh", "replace", topo.LB.IPv4.String(), "lladdr", mac,
			"dev", topo.Client.Link, "nud", "permanent")
	}
	before, _ := p.Stats()
	gw("02:de:ad:00:00:01")
	if s, err := testutil.AskUDPWithin(topo.Client.NS, netip.AddrPort{}, vip, 500*time.Millisecond); err == nil {
		t.Fatalf("a frame for another host's MAC was served: %q", s)
	}
	after, _ := p.Stats()
	if after["other_host"] <= before["other_host"] {
		t.Errorf("other_host %d -> %d: the frame was not counted", before["other_host"], after["other_host"])
	}
	gw(lbMAC)
	if _, err := testutil.AskUDP(topo.Client.NS, vip); err != nil {
		t.Fatalf("the VIP with the LB's MAC again: %v", err)
	}
}

// TestOtherHostFixtures: the programs' verdicts on a frame for another
// host's MAC, by BPF_PROG_TEST_RUN. The tcx program runs with the skb on
// the front interface (the kernel marks a frame that is not for its MAC
// PACKET_OTHERHOST; on the loopback, where the other fixtures run, the
// program takes every frame as this host's). A denied client's SYN is
// dropped by XDP when it is for this host, passed when it is another
// host's; tcx leaves another host's frame alone (TCX_NEXT, untouched) and
// balances one for the back interface's MAC that came in on front (a
// bridge port sees its bridge's frames so).
func TestOtherHostFixtures(t *testing.T) {
	ns, p := policyFixture(t, addrTable(t, "bl", model.ListDeny, 1, 1, other.String()))
	foreign := net.HardwareAddr{0x02, 0xde, 0xad, 0, 0, 1}
	syn := func(src netip.Addr, dstMAC net.HardwareAddr) []byte {
		return pktSpec{src: src, dst: vip1, sport: 41000, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, dstMAC: dstMAC}.build()
	}
	if v, _ := runProg(t, ns, p.objs.XlbXdp, syn(other, nil)); v != xdpDrop {
		t.Errorf("xdp: denied client, this host's MAC: verdict %d, want XDP_DROP", v)
	}
	if v, _ := runProg(t, ns, p.objs.XlbXdp, syn(other, foreign)); v != xdpPass {
		t.Errorf("xdp: denied client, another host's MAC: verdict %d, want XDP_PASS", v)
	}
	front := linkAttrs(t, ns, "front").Index
	in := syn(client, foreign)
	if v, out := runProgOn(t, ns, p.objs.XlbIngress, front, in); v != verdictNext || string(out) != string(in) {
		t.Errorf("tcx: another host's MAC: verdict %d (changed: %v), want TCX_NEXT untouched", v, string(out) != string(in))
	}
	if v, _ := runProgOn(t, ns, p.objs.XlbIngress, front, syn(client, macBack)); v != verdictRedirect {
		t.Errorf("tcx: the back interface's MAC: verdict %d, want redirect", v)
	}
	if v, _ := runProgOn(t, ns, p.objs.XlbIngress, front, syn(client, nil)); v != verdictRedirect {
		t.Errorf("tcx: front's own MAC: verdict %d, want redirect", v)
	}
}

// runProgOn is runProg with the skb on interface ifindex of ns (struct
// __sk_buff's ifindex in the run's context: the kernel then takes the
// frame as received there, its pkt_type from that interface's MAC).
func runProgOn(tb testing.TB, ns netns.NsHandle, prog *ebpf.Program, ifindex int, pkt []byte) (uint32, []byte) {
	tb.Helper()
	var ret uint32
	out := make([]byte, len(pkt)+256)
	// struct __sk_buff up to ifindex, its eleventh word; the rest zero.
	var skb [11]uint32
	skb[10] = uint32(ifindex)
	err := testutil.Do(ns, func() error {
		opts := ebpf.RunOptions{Data: pkt, DataOut: out, Context: skb}
		var err error
		ret, err = prog.Run(&opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		tb.Fatalf("BPF_PROG_TEST_RUN on ifindex %d: %v", ifindex, err)
	}
	return ret, out
}

// linkAttrs are the attributes of interface name in namespace ns.
func linkAttrs(tb testing.TB, ns netns.NsHandle, name string) *netlink.LinkAttrs {
	tb.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		tb.Fatal(err)
	}
	return l.Attrs()
}
