package testutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Several balancers as one: NewHATopology builds
//
//	client ns                router ns                       lb ns (one per LB)              switch ns       backend ns
//	eth0 10.100.0.2/24 <-->  eth0 10.100.0.1/24
//	     fd00:100::2/64           fd00:100::1/64
//	                         lbs 10.101.0.1/24  <-bridge->   eth0 10.101.0.(11+i)/24
//	                             fd00:101::1/64                   fd00:101::(11+i)/64
//	                                                          eth1 10.200.0.(2+i)/24 <-bridge-> eth0 10.200.0.(11+j)/24
//	                                                               fd00:200::(2+i)/64           fd00:200::(11+j)/64
//
// The router reaches the virtual addresses only through routes that a BGP
// router in its namespace (StartBIRD) learns from the LBs, and spreads
// flows over them with ECMP (fib_multipath_hash_policy=1: a flow's 5-tuple
// picks the next hop). The client's default route points at the router.
// Each LB's default route points at the router too, so replies and
// forwarded backend traffic reach the client. The backends sit on one L2
// segment with every LB (a bridge in the switch namespace: what dsr and
// stlsdnat need) and route through all LBs at once: a multipath default
// route over the LBs' backend-side addresses, with
// fib_multipath_use_neigh=1, so an LB whose neighbour entry failed is
// skipped (with HAOptions.ReturnViaRouter they route through the router
// instead). The router routes the backend network itself over every LB
// (static, multipath), for probes to backend addresses; VIPs only through
// BGP. VIPs come from VIPNet4/VIPNet6, as in the single-LB topology.

// Networks of the HA topology besides those of the single-LB one.
var (
	LBNet4 = netip.MustParsePrefix("10.101.0.0/24")
	LBNet6 = netip.MustParsePrefix("fd00:101::/64")
)

// HAOptions sizes an HA topology.
type HAOptions struct {
	LBs      int  // LB namespaces made at once (default 2); AddLB adds more
	Backends int  // backend namespaces (default 1)
	IPv6     bool // also configure the IPv6 networks
	// SymmetricReturn makes each backend answer through the LB that last
	// sent it a packet of the connection (nftables in the backend marks
	// the connection by the LB's MAC address; policy routing by the mark),
	// as backends behind NAT balancers must when several balancers are
	// active. Without it the backends' multipath default route spreads
	// replies over every LB. IPv4 only.
	SymmetricReturn bool
	// ReturnViaRouter gives the backends a gateway of their own instead of
	// the LBs: the router gets a leg on the backend segment (10.200.0.1,
	// fd00:200::1) and is the backends' default route, as dsr backends
	// answer clients in a real network (through their own router, never
	// the balancer). A node lost then takes nothing of the return path.
	ReturnViaRouter bool
}

// LBNode is one balancer of an HA topology.
type LBNode struct {
	// Host's Link is "eth0", the router side: IPv4/IPv6 are
	// 10.101.0.(11+i) and fd00:101::(11+i), the BGP session's local address
	// and the routes' next hop.
	Host
	// Back4 and Back6 are its addresses on the backend segment ("eth1"),
	// 10.200.0.(2+i) and fd00:200::(2+i): the source backends see in snat
	// mode.
	Back4, Back6 netip.Addr
	Index        int
}

// HATopology is client -> router (ECMP) -> LBs -> backends.
type HATopology struct {
	Client Host // 10.100.0.2, fd00:100::2
	// Router is the router's namespace; its IPv4/IPv6 are the client-side
	// addresses. RouterLB4/RouterLB6 are its addresses towards the LBs
	// (10.101.0.1, fd00:101::1), the BGP peers of the LBs.
	Router               Host
	RouterLB4, RouterLB6 netip.Addr
	// Switch holds the backend segment's bridge and no address.
	Switch   Host
	LBs      []*LBNode
	Backends []Host // j-th: 10.200.0.(11+j), fd00:200::(11+j) written with the same digits

	tb        testing.TB
	ipv6      bool
	symmetric bool
	// viaRouter: the backends route through the router (HAOptions.ReturnViaRouter).
	viaRouter bool
	// returnVia[i]: LB i is a next hop of the backends' default route.
	returnVia []bool
}

// NewHATopology builds the topology in new namespaces, removed in
// tb.Cleanup. No BGP router runs yet: start one with StartBIRD.
func NewHATopology(tb testing.TB, opts HAOptions) *HATopology {
	tb.Helper()
	if opts.LBs <= 0 {
		opts.LBs = 2
	}
	if opts.Backends <= 0 {
		opts.Backends = 1
	}
	if opts.LBs > 8 || opts.Backends > 80 {
		tb.Fatalf("ha topology: at most 8 LBs and 80 backends")
	}
	if opts.ReturnViaRouter && opts.SymmetricReturn {
		tb.Fatalf("ha topology: ReturnViaRouter and SymmetricReturn exclude each other")
	}
	t := &HATopology{tb: tb, ipv6: opts.IPv6, symmetric: opts.SymmetricReturn, viaRouter: opts.ReturnViaRouter}
	t.Client = t.newHost("client")
	t.Router = t.newHost("router")
	t.Switch = t.newHost("switch")
	t.Client.IPv4, t.Router.IPv4 = nth(ClientNet4, 2), nth(ClientNet4, 1)
	t.RouterLB4 = nth(LBNet4, 1)
	if opts.IPv6 {
		t.Client.IPv6, t.Router.IPv6 = nth(ClientNet6, 2), nth(ClientNet6, 1)
		t.RouterLB6 = nth(LBNet6, 1)
	}
	if err := t.buildCore(); err != nil {
		tb.Fatalf("ha topology: %v", err)
	}
	if t.viaRouter {
		if err := t.routerBackLeg(); err != nil {
			tb.Fatalf("ha topology: %v", err)
		}
	}
	for j := range opts.Backends {
		b := t.newHost(fmt.Sprintf("be%d", j))
		b.IPv4 = nth(BackNet4, 11+j)
		if opts.IPv6 {
			b.IPv6 = nth(BackNet6, mirror(11+j))
		}
		if err := t.connectBackend(j, b); err != nil {
			tb.Fatalf("ha topology: %v", err)
		}
		t.Backends = append(t.Backends, b)
	}
	for range opts.LBs {
		t.AddLB(tb)
	}
	for _, h := range append([]Host{t.Client, t.Router, t.Switch}, t.Backends...) {
		if err := waitOperUp(h.NS, 5*time.Second); err != nil {
			tb.Fatalf("ha topology: %s: %v", h.Name, err)
		}
	}
	return t
}

func (t *HATopology) newHost(role string) Host {
	name, h, err := newNetNS(role)
	if err != nil {
		t.tb.Fatalf("ha topology: %v", err)
	}
	t.tb.Cleanup(func() { deleteNetNS(t.tb, name, h) })
	return Host{Name: name, NS: h, Link: "eth0"}
}

// buildCore links client and router and makes the router's LB bridge and
// the switch's backend bridge.
func (t *HATopology) buildCore() error {
	for _, s := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding",
		"net/ipv4/fib_multipath_hash_policy", "net/ipv6/fib_multipath_hash_policy"} {
		if err := WriteSysctl(t.Router.NS, s, "1"); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", s, t.Router.Name, err)
		}
	}
	err := withHandle(t.Router.NS, func(r *netlink.Handle) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(t.Client.NS))}
		if err := r.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth router-client: %w", err)
		}
		if err := upWithAddrs(r, "eth0", netip.PrefixFrom(t.Router.IPv4, 24), pfx(t.Router.IPv6, 64)); err != nil {
			return err
		}
		if err := addBridge(r, "lbs"); err != nil {
			return err
		}
		return upWithAddrs(r, "lbs", netip.PrefixFrom(t.RouterLB4, 24), pfx(t.RouterLB6, 64))
	})
	if err != nil {
		return err
	}
	err = withHandle(t.Client.NS, func(c *netlink.Handle) error {
		if err := upWithAddrs(c, "eth0", netip.PrefixFrom(t.Client.IPv4, 24), pfx(t.Client.IPv6, 64)); err != nil {
			return err
		}
		return defaultRoutes(c, "eth0", t.Router.IPv4, t.Router.IPv6)
	})
	if err != nil {
		return err
	}
	return withHandle(t.Switch.NS, func(s *netlink.Handle) error { return addBridge(s, "backs") })
}

// RouterBack4 and RouterBack6 are the router's addresses on the backend
// segment with HAOptions.ReturnViaRouter.
var (
	RouterBack4 = netip.MustParseAddr("10.200.0.1")
	RouterBack6 = netip.MustParseAddr("fd00:200::1")
)

// routerBackLeg links the router to the backend segment ("back").
func (t *HATopology) routerBackLeg() error {
	if err := t.switchPort(t.Switch, "backs", "router", t.Router, "back"); err != nil {
		return err
	}
	// Replies come from VIPs the router routes towards the LBs: no
	// reverse-path filter.
	for _, sc := range []string{"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
		if err := WriteSysctl(t.Router.NS, sc, "0"); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", sc, t.Router.Name, err)
		}
	}
	var v6 netip.Addr
	if t.ipv6 {
		v6 = RouterBack6
	}
	return withHandle(t.Router.NS, func(h *netlink.Handle) error {
		if err := upWithAddrs(h, "back", netip.PrefixFrom(RouterBack4, 24), pfx(v6, 64)); err != nil {
			return err
		}
		return WriteSysctl(t.Router.NS, "net/ipv4/conf/back/rp_filter", "0")
	})
}

// connectBackend links backend j to the switch.
func (t *HATopology) connectBackend(j int, b Host) error {
	for _, s := range []string{"net/ipv4/fib_multipath_hash_policy", "net/ipv6/fib_multipath_hash_policy",
		"net/ipv4/fib_multipath_use_neigh"} {
		if err := WriteSysctl(b.NS, s, "1"); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", s, b.Name, err)
		}
	}
	if err := t.switchPort(t.Switch, "backs", fmt.Sprintf("be%d", j), b); err != nil {
		return err
	}
	// A lost LB's neighbour entry fails within about a second (a
	// reachable entry is confirmed every second, probed twice 200 ms
	// apart), so the multipath route skips it.
	for s, v := range map[string]string{
		"net/ipv4/neigh/eth0/base_reachable_time_ms": "1000",
		"net/ipv4/neigh/eth0/delay_first_probe_time": "1",
		"net/ipv4/neigh/eth0/retrans_time_ms":        "200",
		"net/ipv4/neigh/eth0/ucast_solicit":          "2",
	} {
		if err := WriteSysctl(b.NS, s, v); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w", s, b.Name, err)
		}
	}
	return withHandle(b.NS, func(h *netlink.Handle) error {
		return upWithAddrs(h, "eth0", netip.PrefixFrom(b.IPv4, 24), pfx(b.IPv6, 64))
	})
}

// switchPort makes a veth from bridge br in sw's namespace to peer's
// "eth0" (or peerLink).
func (t *HATopology) switchPort(sw Host, br, port string, peer Host, peerLink ...string) error {
	name := "eth0"
	if len(peerLink) > 0 {
		name = peerLink[0]
	}
	return withHandle(sw.NS, func(s *netlink.Handle) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port}, PeerName: name,
			PeerNamespace: netlink.NsFd(int(peer.NS))}
		if err := s.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s to %s: %w", port, peer.Name, err)
		}
		l, err := s.LinkByName(port)
		if err != nil {
			return err
		}
		brl, err := s.LinkByName(br)
		if err != nil {
			return err
		}
		if err := s.LinkSetMaster(l, brl); err != nil {
			return fmt.Errorf("enslave %s: %w", port, err)
		}
		return s.LinkSetUp(l)
	})
}

// AddLB makes one more LB namespace (the next index), links it to the
// router's bridge and the backend segment, and adds it to the backends'
// multipath default route. No xlb runs in it yet.
func (t *HATopology) AddLB(tb testing.TB) *LBNode {
	tb.Helper()
	i := len(t.LBs)
	if i >= 8 {
		tb.Fatalf("ha topology: at most 8 LBs")
	}
	n := &LBNode{Host: t.newHost(fmt.Sprintf("lb%d", i)), Index: i}
	n.IPv4, n.Back4 = nth(LBNet4, 11+i), nth(BackNet4, 2+i)
	if t.ipv6 {
		n.IPv6, n.Back6 = nth(LBNet6, mirror(11+i)), nth(BackNet6, mirror(2+i))
	}
	err := func() error {
		for _, s := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := WriteSysctl(n.NS, s, "1"); err != nil {
				return fmt.Errorf("sysctl %s in %s: %w", s, n.Name, err)
			}
		}
		if err := t.switchPort(t.Router, "lbs", fmt.Sprintf("lb%d", i), n.Host); err != nil {
			return err
		}
		if err := t.switchPort(t.Switch, "backs", fmt.Sprintf("lb%d", i), n.Host, "eth1"); err != nil {
			return err
		}
		return withHandle(n.NS, func(h *netlink.Handle) error {
			if err := upWithAddrs(h, "eth0", netip.PrefixFrom(n.IPv4, 24), pfx(n.IPv6, 64)); err != nil {
				return err
			}
			if err := upWithAddrs(h, "eth1", netip.PrefixFrom(n.Back4, 24), pfx(n.Back6, 64)); err != nil {
				return err
			}
			return defaultRoutes(h, "eth0", t.RouterLB4, t.RouterLB6)
		})
	}()
	if err != nil {
		tb.Fatalf("ha topology: add lb%d: %v", i, err)
	}
	t.LBs = append(t.LBs, n)
	t.returnVia = append(t.returnVia, true)
	if err := t.backendRoutes(); err != nil {
		tb.Fatalf("ha topology: add lb%d: %v", i, err)
	}
	if err := waitOperUp(n.NS, 5*time.Second); err != nil {
		tb.Fatalf("ha topology: %s: %v", n.Name, err)
	}
	return n
}

// backendRoutes sets every backend's default route to a multipath route
// over every LB, and the router's route to the backend network likewise
// (only for traffic to backend addresses themselves, such as a test's
// probe: VIPs are reached through the BGP routes).
func (t *HATopology) backendRoutes() error {
	err := withHandle(t.Router.NS, func(h *netlink.Handle) error {
		if t.viaRouter {
			return nil // the backend segment is the router's own
		}
		l, err := h.LinkByName("lbs")
		if err != nil {
			return err
		}
		for _, net := range []netip.Prefix{BackNet4, BackNet6} {
			if net.Addr().Is6() && !t.ipv6 {
				continue
			}
			r := &netlink.Route{Dst: prefixNet(net)}
			for _, n := range t.LBs {
				gw := n.IPv4
				if net.Addr().Is6() {
					gw = n.IPv6
				}
				r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()})
			}
			if err := h.RouteReplace(r); err != nil {
				return fmt.Errorf("route to %s in %s: %w", net, t.Router.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if t.symmetric {
		if err := t.symmetricReturn(); err != nil {
			return err
		}
	}
	for _, b := range t.Backends {
		err := withHandle(b.NS, func(h *netlink.Handle) error {
			l, err := h.LinkByName("eth0")
			if err != nil {
				return err
			}
			for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
				if fam == netlink.FAMILY_V6 && !t.ipv6 {
					continue
				}
				r := &netlink.Route{Family: fam, Dst: prefixNet(netip.MustParsePrefix("0.0.0.0/0"))}
				if fam == netlink.FAMILY_V6 {
					r.Dst = prefixNet(netip.MustParsePrefix("::/0"))
				}
				if t.viaRouter {
					r.LinkIndex, r.Gw = l.Attrs().Index, RouterBack4.AsSlice()
					if fam == netlink.FAMILY_V6 {
						r.Gw = RouterBack6.AsSlice()
					}
					if err := h.RouteReplace(r); err != nil {
						return fmt.Errorf("default route in %s: %w", b.Name, err)
					}
					continue
				}
				for i, n := range t.LBs {
					if !t.returnVia[i] {
						continue
					}
					gw := n.Back4
					if fam == netlink.FAMILY_V6 {
						gw = n.Back6
					}
					r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()})
				}
				if err := h.RouteReplace(r); err != nil {
					return fmt.Errorf("multipath default route in %s: %w", b.Name, err)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// SetReturnVia puts LB i in the backends' multipath default route or
// takes it out (a node added is put in once it holds its peers' state).
func (t *HATopology) SetReturnVia(tb testing.TB, i int, on bool) {
	tb.Helper()
	t.returnVia[i] = on
	if err := t.backendRoutes(); err != nil {
		tb.Fatalf("ha topology: %v", err)
	}
}

// SetLBLinks takes LB i's links down (a node lost: nothing reaches it
// any more, its kernel forwards nothing) or up again.
func (t *HATopology) SetLBLinks(tb testing.TB, i int, up bool) {
	tb.Helper()
	err := withHandle(t.LBs[i].NS, func(h *netlink.Handle) error {
		for _, name := range []string{"eth0", "eth1"} {
			l, err := h.LinkByName(name)
			if err != nil {
				return err
			}
			if up {
				err = h.LinkSetUp(l)
			} else {
				err = h.LinkSetDown(l)
			}
			if err != nil {
				return fmt.Errorf("set %s up=%v: %w", name, up, err)
			}
		}
		if up {
			return defaultRoutes(h, "eth0", t.RouterLB4, t.RouterLB6)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("ha topology: lb%d: %v", i, err)
	}
}

// RouteNextHops returns the next hops of the router's route to dst (a
// VIP): none when the router has no route, several under ECMP.
func (t *HATopology) RouteNextHops(dst netip.Addr) ([]netip.Addr, error) {
	var out []netip.Addr
	err := withHandle(t.Router.NS, func(h *netlink.Handle) error {
		fam := netlink.FAMILY_V4
		if dst.Is6() {
			fam = netlink.FAMILY_V6
		}
		routes, err := h.RouteListFiltered(fam, &netlink.Route{Dst: &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(dst.BitLen(), dst.BitLen())}}, netlink.RT_FILTER_DST)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Gw != nil {
				a, _ := netip.AddrFromSlice(r.Gw)
				out = append(out, a.Unmap())
			}
			for _, nh := range r.MultiPath {
				a, _ := netip.AddrFromSlice(nh.Gw)
				out = append(out, a.Unmap())
			}
		}
		return nil
	})
	return out, err
}

// WaitNextHops waits until the router's route to dst has exactly n next
// hops and returns how long that took.
func (t *HATopology) WaitNextHops(tb testing.TB, dst netip.Addr, n int, timeout time.Duration) time.Duration {
	tb.Helper()
	start := time.Now()
	for {
		nhs, err := t.RouteNextHops(dst)
		if err != nil {
			tb.Fatalf("route to %s in %s: %v", dst, t.Router.Name, err)
		}
		if len(nhs) == n {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			tb.Fatalf("route to %s in %s: %d next hops %v after %v, want %d", dst, t.Router.Name, len(nhs), nhs, timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func pfx(a netip.Addr, bits int) netip.Prefix {
	if !a.IsValid() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(a, bits)
}

func addBridge(h *netlink.Handle, name string) error {
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		return fmt.Errorf("add bridge %s: %w", name, err)
	}
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

// upWithAddrs adds the valid prefixes to link and sets it up.
func upWithAddrs(h *netlink.Handle, link string, ps ...netip.Prefix) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.IsValid() {
			if err := addAddr(h, l, p); err != nil {
				return err
			}
		}
	}
	return h.LinkSetUp(l)
}

// defaultRoutes points the default routes (IPv6 if gw6 is valid) at the
// gateways through link.
func defaultRoutes(h *netlink.Handle, link string, gw4, gw6 netip.Addr) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return err
	}
	if err := h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw4.AsSlice(), Family: netlink.FAMILY_V4}); err != nil {
		return fmt.Errorf("default route via %s: %w", gw4, err)
	}
	if gw6.IsValid() {
		if err := h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw6.AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
			return fmt.Errorf("default route via %s: %w", gw6, err)
		}
	}
	return nil
}

// symmetricReturn (re)writes each backend's return routing: connections
// marked by the MAC of the LB whose packet came last, a routing table per
// LB with its default route through that LB.
func (t *HATopology) symmetricReturn() error {
	var elems []string
	for i, n := range t.LBs {
		var mac net.HardwareAddr
		err := withHandle(n.NS, func(h *netlink.Handle) error {
			l, err := h.LinkByName("eth1")
			if err != nil {
				return err
			}
			mac = l.Attrs().HardwareAddr
			return nil
		})
		if err != nil {
			return err
		}
		elems = append(elems, fmt.Sprintf("%s : %d", mac, i+1))
	}
	ruleset := fmt.Sprintf(`table ip xlbt_return
delete table ip xlbt_return
table ip xlbt_return {
	map lb { type ether_addr : mark; elements = { %s } }
	chain in { type filter hook prerouting priority -150; ct mark set ether saddr map @lb; }
	chain out { type route hook output priority -150; meta mark set ct mark; }
}
`, strings.Join(elems, ", "))
	for _, b := range t.Backends {
		cmd := exec.Command("ip", "netns", "exec", b.Name, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(ruleset)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("return routing in %s: %v: %s", b.Name, err, out)
		}
		err := withHandle(b.NS, func(h *netlink.Handle) error {
			l, err := h.LinkByName("eth0")
			if err != nil {
				return err
			}
			for i, n := range t.LBs {
				table := 101 + i
				if err := h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: n.Back4.AsSlice(),
					Dst: prefixNet(netip.MustParsePrefix("0.0.0.0/0")), Table: table}); err != nil {
					return fmt.Errorf("return route via %s: %w", n.Back4, err)
				}
				r := netlink.NewRule()
				r.Mark, r.Table, r.Priority = uint32(i+1), table, 100+i
				mask := uint32(0xffffffff)
				r.Mask = &mask
				if err := h.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
					return fmt.Errorf("rule fwmark %d: %w", i+1, err)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("return routing in %s: %w", b.Name, err)
		}
	}
	return nil
}
