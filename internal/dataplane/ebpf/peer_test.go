package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// peerNet is a client and three backends around an LB namespace, each
// reached another way from the LB:
//
//   - client: veth "lc" (peer "eth0" in the client's namespace);
//   - be0: veth "lp" (peer in be0's namespace): peer redirect;
//   - be1: veth "sa" whose peer "sb" is in the LB namespace too, a port of
//     bridge "br1" with veth "bp" to be1: plain redirect;
//   - be2: bridge "br2" with port veth "bq" to be2: plain redirect.
type peerNet struct {
	client, lb netns.NsHandle
	be         [3]netns.NsHandle
	clientIP   [2]netip.Addr    // v4, v6
	beIP       [3][2]netip.Addr // v6 only for be0
	lbBack0    [2]netip.Addr    // the LB's addresses towards be0 (snat sources)
}

func newPeerNet(t *testing.T) *peerNet {
	t.Helper()
	testutil.RequireRoot(t)
	n := &peerNet{
		clientIP: [2]netip.Addr{netip.MustParseAddr("10.120.0.2"), netip.MustParseAddr("fd00:120::2")},
		beIP: [3][2]netip.Addr{
			{netip.MustParseAddr("10.121.0.11"), netip.MustParseAddr("fd00:121::11")},
			{netip.MustParseAddr("10.122.0.11")},
			{netip.MustParseAddr("10.123.0.11")},
		},
		lbBack0: [2]netip.Addr{netip.MustParseAddr("10.121.0.1"), netip.MustParseAddr("fd00:121::1")},
	}
	_, n.client = testutil.NewNetNS(t)
	_, n.lb = testutil.NewNetNS(t)
	for i := range n.be {
		_, n.be[i] = testutil.NewNetNS(t)
	}
	lh, err := netlink.NewHandleAt(n.lb)
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Close()
	up := func(name string) netlink.Link {
		l, err := lh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := lh.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	addr := func(h *netlink.Handle, l netlink.Link, p string) {
		a, err := netlink.ParseAddr(p)
		if err != nil {
			t.Fatal(err)
		}
		if a.IP.To4() == nil {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatalf("add %s to %s: %v", p, l.Attrs().Name, err)
		}
	}
	bridge := func(name string) netlink.Link {
		if err := lh.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			t.Fatal(err)
		}
		return up(name)
	}
	// veth creates name in the LB namespace and its peer "eth0" in ns with
	// the given addresses and default routes via gws.
	veth := func(name string, ns netns.NsHandle, addrs, gws []string) netlink.Link {
		if err := lh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
			t.Fatalf("add veth %s: %v", name, err)
		}
		ph, err := netlink.NewHandleAt(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer ph.Close()
		pl, err := ph.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			addr(ph, pl, a)
		}
		if err := ph.LinkSetUp(pl); err != nil {
			t.Fatal(err)
		}
		if lo, err := ph.LinkByName("lo"); err == nil {
			_ = ph.LinkSetUp(lo)
		}
		for _, gw := range gws {
			if err := ph.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
				t.Fatalf("default route via %s: %v", gw, err)
			}
		}
		return up(name)
	}
	lc := veth("lc", n.client, []string{"10.120.0.2/24", "fd00:120::2/64"}, []string{"10.120.0.1", "fd00:120::1"})
	addr(lh, lc, "10.120.0.1/24")
	addr(lh, lc, "fd00:120::1/64")
	lp := veth("lp", n.be[0], []string{"10.121.0.11/24", "fd00:121::11/64"}, []string{"10.121.0.1", "fd00:121::1"})
	addr(lh, lp, "10.121.0.1/24")
	addr(lh, lp, "fd00:121::1/64")

	// be1 behind a veth pair held wholly by the LB namespace.
	if err := lh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sa"}, PeerName: "sb"}); err != nil {
		t.Fatal(err)
	}
	br1 := bridge("br1")
	sb := up("sb")
	if err := lh.LinkSetMaster(sb, br1); err != nil {
		t.Fatal(err)
	}
	bp := veth("bp", n.be[1], []string{"10.122.0.11/24"}, []string{"10.122.0.1"})
	if err := lh.LinkSetMaster(bp, br1); err != nil {
		t.Fatal(err)
	}
	sa := up("sa")
	addr(lh, sa, "10.122.0.1/24")

	// be2 behind a bridge with the LB's address.
	br2 := bridge("br2")
	addr(lh, br2, "10.123.0.1/24")
	bq := veth("bq", n.be[2], []string{"10.123.0.11/24"}, []string{"10.123.0.1"})
	if err := lh.LinkSetMaster(bq, br2); err != nil {
		t.Fatal(err)
	}

	for _, s := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := testutil.WriteSysctl(n.lb, s, "1"); err != nil {
			t.Fatal(err)
		}
	}
	for i, ns := range n.be {
		for _, a := range n.beIP[i] {
			if a.IsValid() {
				testutil.StartTCPServer(t, ns, netip.AddrPortFrom(a, 8080), fmt.Sprintf("be%d", i))
				testutil.StartUDPServer(t, ns, netip.AddrPortFrom(a, 8053), fmt.Sprintf("be%d", i))
			}
		}
	}
	return n
}

// linkStats returns the packets ifname in ns sent and received.
func linkStats(t *testing.T, ns netns.NsHandle, ifname string) (tx, rx uint64) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	s := l.Attrs().Statistics
	return s.TxPackets, s.RxPackets
}

// TestPeerTxMap: xlb_peer_tx holds exactly the veths whose peer is in
// another namespace, and follows interfaces created and deleted while the
// plane runs.
func TestPeerTxMap(t *testing.T) {
	n := newPeerNet(t)
	p := newPlane(t, n.lb, mountBPFFS(t), nil, 16384)
	lh, err := netlink.NewHandleAt(n.lb)
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Close()
	index := func(name string) uint32 {
		l, err := lh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(l.Attrs().Index)
	}
	inMap := func() map[uint32]bool {
		out := map[uint32]bool{}
		var k, v uint32
		it := p.objs.XlbPeerTx.Iterate()
		for it.Next(&k, &v) {
			out[k] = true
		}
		return out
	}
	check := func(want map[uint32]bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		got := inMap()
		for fmt.Sprint(got) != fmt.Sprint(want) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			got = inMap()
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("xlb_peer_tx %v, want %v", got, want)
		}
	}
	want := map[uint32]bool{index("lc"): true, index("lp"): true, index("bp"): true, index("bq"): true}
	check(want) // not sa, sb (peer here), br1, br2 (bridges)

	_, ns := testutil.NewNetNS(t)
	if err := lh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lx"}, PeerName: "eth0",
		PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	want[index("lx")] = true
	check(want)
	l, _ := lh.LinkByName("lx")
	delete(want, index("lx"))
	if err := lh.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	check(want)
	// A veth created here whose peer then moves away.
	if err := lh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ly"}, PeerName: "ly-peer"}); err != nil {
		t.Fatal(err)
	}
	peer, _ := lh.LinkByName("ly-peer")
	if err := lh.LinkSetNsFd(peer, int(ns)); err != nil {
		t.Fatal(err)
	}
	want[index("ly")] = true
	check(want)
}

// TestTrafficPeerRedirect: flows whose next hop is a veth with its peer in
// another namespace take bpf_redirect_peer in both directions (fib_peer
// counts them, fib_redirect does not, and the LB's side of the veth
// transmits nothing: the packets go straight to the peer's ingress), TCP and
// UDP, IPv4 and IPv6, dnat and snat. Next hops that are a veth whose peer is
// in the LB's namespace, or a bridge, take plain bpf_redirect and work too.
func TestTrafficPeerRedirect(t *testing.T) {
	n := newPeerNet(t)
	p := newPlane(t, n.lb, mountBPFFS(t), nil, 16384)
	var flows []peerFlow
	for _, v6 := range []bool{false, true} {
		for _, proto := range []model.Protocol{model.ProtoTCP, model.ProtoUDP} {
			for _, mode := range []model.Mode{model.ModeDNAT, model.ModeSNAT} {
				flows = append(flows, peerFlow{fmt.Sprintf("peer-%s-%s-v6=%v", proto, mode, v6), 0, v6, proto, mode, false})
			}
		}
	}
	for _, be := range []int{1, 2} {
		for _, proto := range []model.Protocol{model.ProtoTCP, model.ProtoUDP} {
			flows = append(flows, peerFlow{fmt.Sprintf("be%d-%s-dnat", be, proto), be, false, proto, model.ModeDNAT, false})
		}
	}
	vips := n.applyFlows(t, p, flows, 90)
	// Each flow with checksum offload, then with transmit checksum
	// offload off on the client and the backends: packets arrive with full checksums (CHECKSUM_NONE),
	// which the program updates and the receivers verify (a peer redirect
	// has no transmit at the LB that would complete an offloaded one).
	for _, offload := range []bool{true, false} {
		if !offload {
			setTxChecksum(t, n.client, "eth0", false)
			for _, ns := range n.be {
				setTxChecksum(t, ns, "eth0", false)
			}
		}
		for i, f := range flows {
			runPeerFlow(t, n, p, fmt.Sprintf("%s/offload=%v", f.name, offload), f, vips[i])
		}
	}
}

// peerFlow is a flow of TestTrafficPeerRedirect: to backend be of a
// peerNet.
type peerFlow struct {
	name  string
	be    int
	v6    bool
	proto model.Protocol
	mode  model.Mode
	// brPort: the plane runs with BridgePortRedirect, so be2 (behind
	// bridge br2) takes the peer redirect into its veth too.
	brPort bool
}

// applyFlows gives p a farm per flow, farm f<i> on VIP number first+i,
// port 80, to the flow's backend (port 8080 for tcp, 8053 for udp), and
// returns the VIPs.
func (n *peerNet) applyFlows(t *testing.T, p *Plane, flows []peerFlow, first int) []netip.AddrPort {
	t.Helper()
	var farms []*model.Farm
	vips := make([]netip.AddrPort, len(flows))
	for i, f := range flows {
		fm := model.NewFarm(fmt.Sprintf("f%d", i))
		fam, vip := 0, testutil.VIP4(first+i)
		if f.v6 {
			fam, vip = 1, testutil.VIP6(first+i)
			fm.Family = model.FamilyIPv6
		}
		port := uint16(8080)
		if f.proto == model.ProtoUDP {
			port = 8053
		}
		vips[i] = netip.AddrPortFrom(vip, 80)
		fm.VirtualAddr = vip
		fm.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		fm.Protocol, fm.Mode, fm.Scheduler = f.proto, f.mode, model.SchedRR
		be := model.NewBackend("b")
		be.Addr, be.Port = n.beIP[f.be][fam], port
		fm.Backends = append(fm.Backends, be)
		if err := fm.Validate(); err != nil {
			t.Fatalf("farm %s: %v", f.name, err)
		}
		farms = append(farms, &fm)
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	return vips
}

// runPeerFlow runs 20 requests of flow f to vip and checks how they were
// forwarded.
func runPeerFlow(t *testing.T, n *peerNet, p *Plane, name string, f peerFlow, vip netip.AddrPort) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		fam := 0
		if f.v6 {
			fam = 1
		}
		askFn := func() (string, error) {
			if f.proto == model.ProtoUDP {
				return testutil.AskUDP(n.client, vip)
			}
			return testutil.AskTCP(n.client, vip)
		}
		wantFrom := n.clientIP[fam]
		if f.mode == model.ModeSNAT {
			wantFrom = n.lbBack0[fam]
		}
		// Warm up (carrier, neighbours) with retries.
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := askFn()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no answer: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		beLink := [3]string{"lp", "sa", "br2"}[f.be]
		st0, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		lcTx0, _ := linkStats(t, n.lb, "lc")
		beTx0, _ := linkStats(t, n.lb, beLink)
		_, cliRx0 := linkStats(t, n.client, "eth0")
		_, beRx0 := linkStats(t, n.be[f.be], "eth0")
		const reqs = 20
		counts := ask(t, reqs, askFn, wantFrom)
		if counts[fmt.Sprintf("be%d", f.be)] != reqs {
			t.Fatalf("answers %v, want %d from be%d", counts, reqs, f.be)
		}
		st1, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		lcTx1, _ := linkStats(t, n.lb, "lc")
		beTx1, _ := linkStats(t, n.lb, beLink)
		_, cliRx1 := linkStats(t, n.client, "eth0")
		_, beRx1 := linkStats(t, n.be[f.be], "eth0")
		d := func(k string) uint64 { return st1[k] - st0[k] }
		t.Logf("fib_peer %d fib_redirect %d fib_neigh %d ct_fwd %d ct_reply %d; lc tx %d, %s tx %d; client rx %d, backend rx %d",
			d("fib_peer"), d("fib_redirect"), d("fib_neigh"), d("ct_fwd"), d("ct_reply"),
			lcTx1-lcTx0, beLink, beTx1-beTx0, cliRx1-cliRx0, beRx1-beRx0)
		// Replies (to the client over lc) always take the peer path:
		// they reach the client, but lc transmits (almost) nothing.
		if cliRx1-cliRx0 < reqs || lcTx1-lcTx0 > reqs/4 {
			t.Errorf("replies: client received %d, lc transmitted %d: want >= %d through the peer path, lc (almost) idle",
				cliRx1-cliRx0, lcTx1-lcTx0, reqs)
		}
		if beRx1-beRx0 < reqs {
			t.Errorf("backend received %d packets, want >= %d", beRx1-beRx0, reqs)
		}
		if f.be == 0 || f.brPort && f.be == 2 {
			if d("fib_redirect") != 0 || d("fib_peer") < 2*reqs {
				t.Errorf("fib_peer %d, fib_redirect %d: want >= %d and 0", d("fib_peer"), d("fib_redirect"), 2*reqs)
			}
			if beTx1-beTx0 > reqs/4 {
				t.Errorf("%s transmitted %d packets: the forward path should bypass it", beLink, beTx1-beTx0)
			}
		} else {
			if d("fib_redirect") < reqs || d("fib_peer") < reqs {
				t.Errorf("fib_redirect %d (forward), fib_peer %d (replies): want >= %d each", d("fib_redirect"), d("fib_peer"), reqs)
			}
			if beTx1-beTx0 < reqs {
				t.Errorf("%s transmitted %d packets, want >= %d (plain redirect)", beLink, beTx1-beTx0, reqs)
			}
		}
	})
}

// TestTrafficBridgePortRedirect: with BridgePortRedirect, a backend behind
// a bridge (be2, behind br2's port bq) is reached with bpf_redirect_peer
// into its veth: the bridge transmits nothing of the forward path. The
// backend behind a veth pair held by the LB namespace and a bridge (be1:
// the next hop is veth sa, not a bridge) keeps the plain redirect.
// xlb_br_port follows the bridge's forwarding database: an entry deleted by
// hand goes from the map, and the flow then takes the bridge again.
func TestTrafficBridgePortRedirect(t *testing.T) {
	n := newPeerNet(t)
	p, err := New(context.Background(), testLogger(t), Options{NetNS: n.lb, PinPath: mountBPFFS(t),
		ConnTableSize: 16384, BridgePortRedirect: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	flows := []peerFlow{
		{"be2-tcp", 2, false, model.ProtoTCP, model.ModeDNAT, true},
		{"be2-udp", 2, false, model.ProtoUDP, model.ModeDNAT, true},
		{"be1-tcp", 1, false, model.ProtoTCP, model.ModeDNAT, true},
	}
	vips := n.applyFlows(t, p, flows, 120)
	// be2's MAC as the bridge learnt it: the map must hold it (bridge br2,
	// port bq) once be2 has sent a frame (the flows' warm-up does).
	lh, err := netlink.NewHandleAt(n.lb)
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Close()
	bh, err := netlink.NewHandleAt(n.be[2])
	if err != nil {
		t.Fatal(err)
	}
	defer bh.Close()
	beLink, err := bh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	br2, err := lh.LinkByName("br2")
	if err != nil {
		t.Fatal(err)
	}
	bq, err := lh.LinkByName("bq")
	if err != nil {
		t.Fatal(err)
	}
	key := xlbBrPortKey{Bridge: uint32(br2.Attrs().Index)}
	copy(key.Mac[:], beLink.Attrs().HardwareAddr)
	mapped := func() (uint32, bool) {
		var port uint32
		err := p.objs.XlbBrPort.Lookup(key, &port)
		return port, err == nil
	}
	for i, f := range flows {
		runPeerFlow(t, n, p, f.name, f, vips[i])
		if f.be == 2 {
			if port, ok := mapped(); !ok || port != uint32(bq.Attrs().Index) {
				t.Fatalf("xlb_br_port[br2, %s] = %d (%v), want bq (%d)", beLink.Attrs().HardwareAddr, port, ok, bq.Attrs().Index)
			}
		}
	}

	// The bridge forgets be2's MAC: so does the map, and be2 is reached
	// through the bridge again (it floods, then learns the MAC anew, which
	// puts it back in the map).
	err = lh.NeighDel(&netlink.Neigh{LinkIndex: bq.Attrs().Index, Family: unix.AF_BRIDGE,
		Flags: unix.NTF_MASTER, HardwareAddr: beLink.Attrs().HardwareAddr})
	if err != nil {
		t.Fatalf("delete be2's forwarding entry: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, ok := mapped(); ok; _, ok = mapped() {
		if time.Now().After(deadline) {
			t.Fatal("xlb_br_port still holds be2's MAC after the bridge forgot it")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if name, err := testutil.AskTCP(n.client, vips[0]); err != nil || !strings.HasPrefix(name, "be2 ") {
		t.Fatalf("after the bridge forgot be2: %q, %v", name, err)
	}
}

// TestTrafficPeerRedirectNetkit: a next hop that is a netkit device (L2
// mode) whose peer is in the backend's namespace takes the peer redirect
// too, TCP and UDP, both directions. Skipped on kernels built without
// netkit (CONFIG_NETKIT), such as the one these tests were written on.
func TestTrafficPeerRedirectNetkit(t *testing.T) {
	testutil.RequireRoot(t)
	_, cns := testutil.NewNetNS(t)
	_, lns := testutil.NewNetNS(t)
	_, bns := testutil.NewNetNS(t)
	lh, err := netlink.NewHandleAt(lns)
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Close()
	if err := testutil.WriteSysctl(lns, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	// peerSide configures the namespace ns's end of a pair.
	peerSide := func(ns netns.NsHandle, name, addr, gw string) {
		ph, err := netlink.NewHandleAt(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer ph.Close()
		l := addrUp(t, ph, name, addr)
		if err := ph.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
			t.Fatal(err)
		}
	}
	lbSide := func(name, addr string) { addrUp(t, lh, name, addr) }
	if err := lh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lc"}, PeerName: "eth0",
		PeerNamespace: netlink.NsFd(int(cns))}); err != nil {
		t.Fatal(err)
	}
	lbSide("lc", "10.125.0.1/24")
	peerSide(cns, "eth0", "10.125.0.2/24", "10.125.0.1")
	nk := &netlink.Netkit{LinkAttrs: netlink.LinkAttrs{Name: "nk"}, Mode: netlink.NETKIT_MODE_L2,
		Policy: netlink.NETKIT_POLICY_FORWARD, PeerPolicy: netlink.NETKIT_POLICY_FORWARD}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: "nkp"})
	if err := lh.LinkAdd(nk); errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("add netkit: %v (a kernel without CONFIG_NETKIT)", err)
	} else if err != nil {
		t.Fatalf("add netkit: %v", err)
	}
	nkp, err := lh.LinkByName("nkp")
	if err != nil {
		t.Fatal(err)
	}
	if err := lh.LinkSetNsFd(nkp, int(bns)); err != nil {
		t.Fatal(err)
	}
	lbSide("nk", "10.124.0.1/24")
	peerSide(bns, "nkp", "10.124.0.11/24", "10.124.0.1")
	be := netip.MustParseAddr("10.124.0.11")
	testutil.StartTCPServer(t, bns, netip.AddrPortFrom(be, 8080), "be0")
	testutil.StartUDPServer(t, bns, netip.AddrPortFrom(be, 8053), "be0")

	p := newPlane(t, lns, mountBPFFS(t), nil, 16384)
	l, _ := lh.LinkByName("nk")
	var one uint32
	if err := p.objs.XlbPeerTx.Lookup(uint32(l.Attrs().Index), &one); err != nil {
		t.Fatalf("netkit nk not in xlb_peer_tx: %v", err)
	}
	tcpVIP := netip.AddrPortFrom(testutil.VIP4(120), 80)
	udpVIP := netip.AddrPortFrom(testutil.VIP4(121), 53)
	farms := []*model.Farm{
		farm(t, "tcp", tcpVIP.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, netip.AddrPortFrom(be, 8080).String()),
		farm(t, "udp", udpVIP.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, netip.AddrPortFrom(be, 8053).String()),
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []netip.AddrPort{tcpVIP, udpVIP} {
		askFn := func() (string, error) {
			if vip == udpVIP {
				return testutil.AskUDP(cns, vip)
			}
			return testutil.AskTCP(cns, vip)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := askFn()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no answer: %v", vip, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		st0, _ := p.Stats()
		nkTx0, _ := linkStats(t, lns, "nk")
		const reqs = 20
		ask(t, reqs, askFn, netip.MustParseAddr("10.125.0.2"))
		st1, _ := p.Stats()
		nkTx1, _ := linkStats(t, lns, "nk")
		peer, redir := st1["fib_peer"]-st0["fib_peer"], st1["fib_redirect"]-st0["fib_redirect"]
		t.Logf("%s: fib_peer %d fib_redirect %d, nk tx %d", vip, peer, redir, nkTx1-nkTx0)
		if peer < 2*reqs || redir != 0 || nkTx1-nkTx0 > reqs/4 {
			t.Errorf("%s: fib_peer %d, fib_redirect %d, nk transmitted %d: want >= %d, 0, (almost) none",
				vip, peer, redir, nkTx1-nkTx0, 2*reqs)
		}
	}
}
