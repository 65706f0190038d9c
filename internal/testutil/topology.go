package testutil

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Networks and addresses of the topology (see the package comment).
var (
	ClientNet4 = netip.MustParsePrefix("10.100.0.0/24")
	ClientNet6 = netip.MustParsePrefix("fd00:100::/64")
	BackNet4   = netip.MustParsePrefix("10.200.0.0/24")
	BackNet6   = netip.MustParsePrefix("fd00:200::/64")
	// VIPNet4 and VIPNet6 hold no interface address: use them for virtual
	// addresses. They are routed to the LB from the client and backends.
	VIPNet4 = netip.MustParsePrefix("10.99.0.0/24")
	VIPNet6 = netip.MustParsePrefix("fd00:99::/64")
)

// VIP4 returns the n-th IPv4 virtual address (10.99.0.n), 1 <= n <= 254.
func VIP4(n int) netip.Addr { return nth(VIPNet4, n) }

// VIP6 returns the n-th IPv6 virtual address (fd00:99::n).
func VIP6(n int) netip.Addr { return nth(VIPNet6, n) }

// mirror returns the number whose hex digits are n's decimal digits, so
// backend 10.200.0.21 gets fd00:200::21.
func mirror(n int) int {
	v, _ := strconv.ParseUint(strconv.Itoa(n), 16, 32)
	return int(v)
}

func nth(p netip.Prefix, n int) netip.Addr {
	b := p.Addr().AsSlice()
	b[len(b)-2] = byte(n >> 8)
	b[len(b)-1] = byte(n)
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Host is one network namespace of a topology and its addresses.
type Host struct {
	Name string         // namespace name (for `ip netns exec`)
	NS   netns.NsHandle // open namespace handle
	Link string         // the interface holding IPv4 and IPv6 below
	IPv4 netip.Addr
	IPv6 netip.Addr // invalid unless TopologyOptions.IPv6
}

// Addr returns the host's IPv4 address, or its IPv6 address if v6.
func (h Host) Addr(v6 bool) netip.Addr {
	if v6 {
		return h.IPv6
	}
	return h.IPv4
}

// AddAddr adds another address to the host's Link (e.g. a second client
// address for hash tests). The address is removed with the namespace.
func (h Host) AddAddr(tb testing.TB, p netip.Prefix) {
	tb.Helper()
	err := withHandle(h.NS, func(nh *netlink.Handle) error {
		l, err := nh.LinkByName(h.Link)
		if err != nil {
			return err
		}
		return addAddr(nh, l, p)
	})
	if err != nil {
		tb.Fatalf("add %s to %s in %s: %v", p, h.Link, h.Name, err)
	}
}

// MAC returns the Ethernet address of the host's Link.
func (h Host) MAC(tb testing.TB) net.HardwareAddr {
	tb.Helper()
	var mac net.HardwareAddr
	err := withHandle(h.NS, func(nh *netlink.Handle) error {
		l, err := nh.LinkByName(h.Link)
		if err != nil {
			return err
		}
		mac = l.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		tb.Fatalf("address of %s in %s: %v", h.Link, h.Name, err)
	}
	return mac
}

// TopologyOptions sizes a topology.
type TopologyOptions struct {
	Backends int  // number of backend namespaces (default 1)
	IPv6     bool // also configure the IPv6 networks
	// Hairpin puts the backends' bridge ports in hairpin mode, as a
	// Kubernetes node's are (kubelet's --hairpin-mode=hairpin-veth, the
	// bridge CNI plugin's hairpinMode): with br_netfilter (whose
	// bridge-nf-call-iptables is on in every new namespace here), a frame a
	// backend sends to a VIP that is DNATed back to that backend is bridged
	// out of the port it came in on, which a bridge refuses otherwise.
	Hairpin bool
}

// Topology is client ns -> lb ns -> backend namespaces; see the package
// comment for the addressing.
type Topology struct {
	Client Host // 10.100.0.2, fd00:100::2; default routes via LB.IPv4/IPv6
	// LB is the balancer's namespace; IPv4/IPv6 are its client-side
	// addresses (10.100.0.1, fd00:100::1).
	LB Host
	// LBBack4 and LBBack6 are the LB's backend-side addresses (10.200.0.1,
	// fd00:200::1), on the bridge "br0": what backends see in snat mode.
	LBBack4, LBBack6 netip.Addr
	Backends         []Host // i-th: 10.200.0.(11+i), fd00:200::(11+i) written with the same digits
}

// NewTopology builds a client -> LB -> backends topology in new namespaces,
// removed in tb.Cleanup.
func NewTopology(tb testing.TB, opts TopologyOptions) *Topology {
	tb.Helper()
	if opts.Backends <= 0 {
		opts.Backends = 1
	}
	if opts.Backends > 200 {
		tb.Fatalf("topology: at most 200 backends")
	}
	newNS := func(role string) Host {
		name, h, err := newNetNS(role)
		if err != nil {
			tb.Fatalf("topology: %v", err)
		}
		tb.Cleanup(func() { deleteNetNS(tb, name, h) })
		return Host{Name: name, NS: h, Link: "eth0"}
	}
	t := &Topology{
		Client:  newNS("client"),
		LB:      newNS("lb"),
		LBBack4: nth(BackNet4, 1),
	}
	t.Client.IPv4 = nth(ClientNet4, 2)
	t.LB.IPv4 = nth(ClientNet4, 1)
	if opts.IPv6 {
		t.Client.IPv6 = nth(ClientNet6, 2)
		t.LB.IPv6 = nth(ClientNet6, 1)
		t.LBBack6 = nth(BackNet6, 1)
	}
	for i := range opts.Backends {
		b := newNS(fmt.Sprintf("be%d", i))
		b.IPv4 = nth(BackNet4, 11+i)
		if opts.IPv6 {
			b.IPv6 = nth(BackNet6, mirror(11+i))
		}
		t.Backends = append(t.Backends, b)
	}
	if err := t.build(opts); err != nil {
		tb.Fatalf("topology: %v", err)
	}
	// Carrier comes up asynchronously (linkwatch); traffic sent before
	// that is lost and IPv6 neighbor discovery gives up for seconds.
	if err := waitOperUp(t.LB.NS, 5*time.Second); err != nil {
		tb.Fatalf("topology: %s: %v", t.LB.Name, err)
	}
	for _, h := range append([]Host{t.Client}, t.Backends...) {
		if err := waitOperUp(h.NS, 5*time.Second); err != nil {
			tb.Fatalf("topology: %s: %v", h.Name, err)
		}
	}
	return t
}

// waitOperUp waits until every link but loopback in ns is operationally up.
func waitOperUp(ns netns.NsHandle, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	return withHandle(ns, func(nh *netlink.Handle) error {
		for {
			links, err := nh.LinkList()
			if err != nil {
				return err
			}
			var down []string
			for _, l := range links {
				if a := l.Attrs(); a.Name != "lo" && a.OperState != netlink.OperUp {
					down = append(down, a.Name)
				}
			}
			if len(down) == 0 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("links not up after %v: %v", timeout, down)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func (t *Topology) build(opts TopologyOptions) error {
	for _, s := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := WriteSysctl(t.LB.NS, s, "1"); err != nil {
			return fmt.Errorf("enable forwarding in %s: %w", t.LB.Name, err)
		}
	}
	return withHandle(t.LB.NS, func(lb *netlink.Handle) error {
		// client <-> lb
		if err := t.connect(lb, "eth0", t.Client, opts.IPv6); err != nil {
			return err
		}
		front, err := lb.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := addAddr(lb, front, netip.PrefixFrom(t.LB.IPv4, ClientNet4.Bits())); err != nil {
			return err
		}
		if opts.IPv6 {
			if err := addAddr(lb, front, netip.PrefixFrom(t.LB.IPv6, ClientNet6.Bits())); err != nil {
				return err
			}
		}
		if err := lb.LinkSetUp(front); err != nil {
			return err
		}
		// lb bridge <-> backends
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := lb.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge: %w", err)
		}
		brl, err := lb.LinkByName("br0")
		if err != nil {
			return err
		}
		if err := addAddr(lb, brl, netip.PrefixFrom(t.LBBack4, BackNet4.Bits())); err != nil {
			return err
		}
		if opts.IPv6 {
			if err := addAddr(lb, brl, netip.PrefixFrom(t.LBBack6, BackNet6.Bits())); err != nil {
				return err
			}
		}
		if err := lb.LinkSetUp(brl); err != nil {
			return err
		}
		for i, b := range t.Backends {
			port := fmt.Sprintf("be%d", i)
			if err := t.connect(lb, port, b, opts.IPv6); err != nil {
				return err
			}
			l, err := lb.LinkByName(port)
			if err != nil {
				return err
			}
			if err := lb.LinkSetMaster(l, brl); err != nil {
				return fmt.Errorf("enslave %s: %w", port, err)
			}
			if opts.Hairpin {
				if err := lb.LinkSetHairpin(l, true); err != nil {
					return fmt.Errorf("hairpin mode on %s: %w", port, err)
				}
			}
			if err := lb.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
}

// connect creates a veth pair: lbSide in the LB namespace, "eth0" in peer,
// addresses and default routes in peer via the LB.
func (t *Topology) connect(lb *netlink.Handle, lbSide string, peer Host, v6 bool) error {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: lbSide},
		PeerName:      peer.Link,
		PeerNamespace: netlink.NsFd(int(peer.NS)),
	}
	if err := lb.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s to %s: %w", lbSide, peer.Name, err)
	}
	gw4, gw6 := t.LB.IPv4, t.LB.IPv6
	net4, net6 := ClientNet4, ClientNet6
	if peer.Name != t.Client.Name {
		gw4, gw6 = t.LBBack4, t.LBBack6
		net4, net6 = BackNet4, BackNet6
	}
	return withHandle(peer.NS, func(ph *netlink.Handle) error {
		l, err := ph.LinkByName(peer.Link)
		if err != nil {
			return err
		}
		if err := addAddr(ph, l, netip.PrefixFrom(peer.IPv4, net4.Bits())); err != nil {
			return err
		}
		if v6 {
			if err := addAddr(ph, l, netip.PrefixFrom(peer.IPv6, net6.Bits())); err != nil {
				return err
			}
		}
		if err := ph.LinkSetUp(l); err != nil {
			return err
		}
		if err := ph.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw4.AsSlice(), Family: netlink.FAMILY_V4}); err != nil {
			return fmt.Errorf("default route in %s: %w", peer.Name, err)
		}
		if v6 {
			if err := ph.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw6.AsSlice(), Family: netlink.FAMILY_V6}); err != nil {
				return fmt.Errorf("default v6 route in %s: %w", peer.Name, err)
			}
		}
		return nil
	})
}

func addAddr(h *netlink.Handle, l netlink.Link, p netip.Prefix) error {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add address %s to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// Run runs a command inside the named namespace with `ip netns exec` and
// returns its combined output; it fails the test if the command fails. Use it
// for oracles such as `nft list ruleset`, never to program what is tested.
func Run(tb testing.TB, nsName string, args ...string) string {
	tb.Helper()
	out, err := RunErr(nsName, args...)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return out
}

// RunErr is Run returning the error instead of failing the test.
func RunErr(nsName string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", nsName}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip netns exec %s %s: %w: %s", nsName, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// AddClient adds a client namespace after the topology is built, as a Pod
// started later adds its veth to a node: the veth's LB end is lbSide (in
// the LB namespace, first address of net4), its other end "eth0" in the
// new namespace (second address, default route via the LB). Removed in
// tb.Cleanup (with the namespace, the veth goes too).
func (t *Topology) AddClient(tb testing.TB, lbSide string, net4 netip.Prefix) Host {
	tb.Helper()
	name, h, err := newNetNS("late")
	if err != nil {
		tb.Fatalf("topology: %v", err)
	}
	tb.Cleanup(func() { deleteNetNS(tb, name, h) })
	host := Host{Name: name, NS: h, Link: "eth0", IPv4: nth(net4, 2)}
	gw := nth(net4, 1)
	err = withHandle(t.LB.NS, func(lb *netlink.Handle) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: lbSide}, PeerName: host.Link, PeerNamespace: netlink.NsFd(int(h))}
		if err := lb.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", lbSide, err)
		}
		l, err := lb.LinkByName(lbSide)
		if err != nil {
			return err
		}
		if err := addAddr(lb, l, netip.PrefixFrom(gw, net4.Bits())); err != nil {
			return err
		}
		return lb.LinkSetUp(l)
	})
	if err == nil {
		err = withHandle(h, func(ph *netlink.Handle) error {
			l, err := ph.LinkByName(host.Link)
			if err != nil {
				return err
			}
			if err := addAddr(ph, l, netip.PrefixFrom(host.IPv4, net4.Bits())); err != nil {
				return err
			}
			if err := ph.LinkSetUp(l); err != nil {
				return err
			}
			return ph.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice(), Family: netlink.FAMILY_V4})
		})
	}
	if err == nil {
		err = waitOperUp(h, 5*time.Second)
	}
	if err != nil {
		tb.Fatalf("topology: add client %s: %v", lbSide, err)
	}
	return host
}

// DeleteLink deletes interface name in ns.
func DeleteLink(ns netns.NsHandle, name string) error {
	return withHandle(ns, func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		return h.LinkDel(l)
	})
}
