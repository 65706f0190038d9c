package ebpf

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// xdpChain is client -- LB -- backend over two veth pairs (no bridge: a
// bridge cannot transmit XDP frames). Client c0 10.110.0.2/24 <-> LB lc
// 10.110.0.1/24; LB lb 10.210.0.1/24 <-> backend b0 10.210.0.11/24. The
// backend holds the VIP on its loopback (dsr) and routes via the LB.
type xdpChain struct {
	client, lb, backend netns.NsHandle
	lbName, backendName string
	clientIP, beIP      netip.Addr
}

func newXDPChain(t testing.TB, vip netip.Addr) *xdpChain {
	t.Helper()
	_, cns := testutil.NewNetNS(t)
	lname, lns := testutil.NewNetNS(t)
	bname, bns := testutil.NewNetNS(t)
	c := &xdpChain{client: cns, lb: lns, backend: bns, lbName: lname, backendName: bname,
		clientIP: netip.MustParseAddr("10.110.0.2"), beIP: netip.MustParseAddr("10.210.0.11")}
	lh, err := netlink.NewHandleAt(lns)
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Close()
	pair := func(name, peer string, peerNS netns.NsHandle, addr, peerAddr, gw string) {
		if err := lh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			t.Fatalf("add veth %s: %v", name, err)
		}
		pl, err := lh.LinkByName(peer)
		if err != nil {
			t.Fatal(err)
		}
		if err := lh.LinkSetNsFd(pl, int(peerNS)); err != nil {
			t.Fatalf("move %s: %v", peer, err)
		}
		addrUp(t, lh, name, addr)
		ph, err := netlink.NewHandleAt(peerNS)
		if err != nil {
			t.Fatal(err)
		}
		defer ph.Close()
		pl = addrUp(t, ph, peer, peerAddr)
		if lo, err := ph.LinkByName("lo"); err == nil {
			_ = ph.LinkSetUp(lo)
		}
		if err := ph.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
			t.Fatalf("default route in %s's namespace: %v", peer, err)
		}
	}
	pair("lc", "c0", cns, "10.110.0.1/24", "10.110.0.2/24", "10.110.0.1")
	pair("lb", "b0", bns, "10.210.0.1/24", "10.210.0.11/24", "10.210.0.1")
	for _, sc := range []string{"net/ipv4/ip_forward"} {
		if err := testutil.WriteSysctl(lns, sc, "1"); err != nil {
			t.Fatal(err)
		}
	}
	// dsr replies leave the backend with the VIP as their source, which
	// the LB has no route back for: no reverse-path filter there.
	for _, sc := range []string{"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter",
		"net/ipv4/conf/lc/rp_filter", "net/ipv4/conf/lb/rp_filter"} {
		if err := testutil.WriteSysctl(lns, sc, "0"); err != nil {
			t.Fatal(err)
		}
	}
	err = testutil.Do(bns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	})
	if err != nil {
		t.Fatalf("VIP on the backend's loopback: %v", err)
	}
	return c
}

// setGRO turns generic receive offload of ifname in ns on or off
// (ethtool -K ifname gro on|off).
func setGRO(t testing.TB, ns netns.NsHandle, ifname string, on bool) {
	t.Helper()
	const ethtoolSGRO = 0x2c
	setEthtoolFlag(t, ns, ifname, ethtoolSGRO, "gro", on)
}

// TestTrafficXDPDSR: a dsr farm with the XDP fast path attached (generic,
// then native on veth): the first datagram of a UDP flow goes through the
// tcx program (new flow: scheduled, next hop cached), the following ones
// leave from XDP (xdp_fwd), and every one is answered. Counters see all of
// them. Native XDP on veth needs, as measured on this kernel, transmit
// checksum offload off on the sender and GRO on the receiving peer of the
// redirect target (docs/dataplane-ebpf.md).
func TestTrafficXDPDSR(t *testing.T) {
	for _, mode := range []XDPMode{XDPGeneric, XDPNative} {
		t.Run(string(mode), func(t *testing.T) {
			testutil.RequireRoot(t)
			vip := netip.AddrPortFrom(testutil.VIP4(70), 53)
			c := newXDPChain(t, vip.Addr())
			if mode == XDPNative {
				setTxChecksum(t, c.client, "c0", false)
				setGRO(t, c.backend, "b0", true)
			}
			testutil.StartUDPServer(t, c.backend, vip, "be0")
			p, err := New(context.Background(), testLogger(t), Options{NetNS: c.lb, PinPath: mountBPFFS(t),
				ConnTableSize: 16384, Interfaces: []string{"lc", "lb"}, XDP: mode})
			if err != nil {
				t.Fatalf("new ebpf plane with xdp %s: %v", mode, err)
			}
			t.Cleanup(func() { p.Close() })
			f := farm(t, "dsr", vip.Addr().String(), 53, model.ProtoUDP, model.ModeDSR, model.SchedRR, netip.AddrPortFrom(c.beIP, 0).String())
			if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
				t.Fatal(err)
			}
			var conn *net.UDPConn
			if err := testutil.Do(c.client, func() error {
				var err error
				conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(vip))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			const n = 200
			buf := make([]byte, 256)
			for i := range n {
				if _, err := conn.Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				k, err := conn.Read(buf)
				if err != nil {
					st, _ := p.Stats()
					t.Fatalf("datagram %d: no answer: %v; counters %v", i, err, st)
				}
				name, from, err := testutil.ParseReply(string(buf[:k]))
				if err != nil || name != "be0" || from.Addr() != c.clientIP {
					t.Fatalf("datagram %d: answer %q (%v)", i, buf[:k], err)
				}
			}
			st, _ := p.Stats()
			t.Logf("xdp %s: counters %v", mode, st)
			// The first datagram is a new flow (tcx); a refresh every
			// second sends one more through tcx.
			if st["new_flow"] != 1 || st["xdp_fwd"] < n-5 || st["xdp_fwd"]+st["ct_fwd"] != n-1 {
				t.Errorf("%d datagrams: new_flow %d, xdp_fwd %d, ct_fwd %d; want 1, >= %d, and %d through either",
					n, st["new_flow"], st["xdp_fwd"], st["ct_fwd"], n-5, n-1)
			}
			fc, err := p.Counters(context.Background(), f)
			if err != nil || fc.Connections != 1 || fc.InPackets != n || fc.OutPackets != 0 {
				t.Errorf("counters %+v, %v: want 1 connection, %d packets in, 0 out (dsr)", fc.Counters, err, n)
			}
		})
	}
}
