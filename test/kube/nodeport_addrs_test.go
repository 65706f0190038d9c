package kube_test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/ifaddr"
	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestKubeProxyNodePortAddresses: kube-proxy's TestNodePorts "multiple
// nodeport-addresses" variant, on both planes. With CIDRs (and kube-proxy
// 1.37's "localhost" keyword) in --nodeport-addresses, NodePorts are
// served on the node's interface addresses inside them — the secondary
// node IP, which the Node's status does not list, included — and on
// 127.0.0.1 (localhost NodePorts, as kube-proxy's iptables mode serves
// them), never on ::1; an address added to an interface later serves them
// too, until it is removed.
func TestKubeProxyNodePortAddresses(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			e := newWorld(t, 3)
			e.scenarioSources() // the secondary node IP is on an interface before the start
			e.configure = func(c *kube.Config) {
				c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.100.0.0/24"),
					netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
				c.InterfaceAddrs = ifaddr.New(e.LB.NS)
			}
			if plane == "nft" {
				// As xlb kube-proxy does when --nodeport-addresses
				// names 127.0.0.1.
				if err := nft.EnableLocalhostNodePorts(e.LB.NS, nft.DefaultTable); err != nil {
					t.Fatal(err)
				}
			}
			e.startController(plane)
			e.startServers()

			s := service("np", corev1.ServiceTypeNodePort)
			s.Spec.Ports = s.Spec.Ports[:1]
			svc := e.createService(s)
			e.kpSlice("np", "np-1", false, readyEP(0, false), readyEP(1, true))
			np := svc.Spec.Ports[0].NodePort
			flows := []flow{
				{name: "external to nodePort", from: fromExternal, to: ap(e.LB.IPv4, np), want: "b0,b1 masq"},
				{name: "pod to cluster IP", from: fromPod, to: ap(cip(svc), 80), want: "b0,b1"},
				{name: "node to nodePort", from: fromNode, to: ap(e.LB.IPv4, np), want: "b0,b1 masq",
					known: map[string]string{"ebpf": "b0,b1"}}, // docs note 4
				{name: "external to nodePort on secondary IP", from: fromExternal, to: ap(altNodeIP, np), want: "b0,b1 masq"},
				// Not in the CIDRs: the backend-side address of the node.
				{name: "nodePort outside the CIDRs", from: "b2", to: ap(e.LBBack4, np), want: "REJECT"},
				// Localhost NodePorts, as kube-proxy's iptables mode
				// serves them (its nftables mode needs an alpha feature
				// gate): from a socket of the node that is not bound
				// (source 127.0.0.1), masqueraded. The ebpf plane
				// connects the socket to the endpoint at connect(), so
				// the socket's own address is the node's: nothing to
				// masquerade.
				{name: "node to localhost nodePort", from: fromNodeUnbound, to: ap(netip.MustParseAddr("127.0.0.1"), np), want: "b0,b1 masq",
					known: map[string]string{"ebpf": "b0,b1"}}, // docs note 4
			}
			e.settle(plane, flows[0])
			e.runFlows(t, plane, flows)
			if plane == "nft" {
				localnetGuarded(t, e)
			}

			// An address added later serves NodePorts; removed, it stops.
			added := netip.MustParseAddr("10.100.0.20")
			farm := kube.FarmName(e.ns, "np", "tcp", kube.KindNodePort, added)
			e.LB.AddAddr(t, netip.PrefixFrom(added, 24))
			later := []flow{{name: "external to nodePort on an address added later", from: fromExternal, to: ap(added, np), want: "b0,b1 masq"}}
			e.settle(plane, later[0])
			e.runFlows(t, plane, later)
			testutil.Run(t, e.LB.Name, "ip", "addr", "del", netip.PrefixFrom(added, 24).String(), "dev", e.LB.Link)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if _, ok := e.eng.Snapshot().Farm(farm); !ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("farm %s still there 10 s after its address was removed", farm)
				}
			}
			// IPv6: no IPv6 prefix but ::1/128, so (as kube-proxy's
			// NodePortAddresses per family) the IPv6 addresses inside it:
			// none that may serve. No IPv6 node farm.
			for _, f := range e.eng.Snapshot().Farms() {
				if f.VirtualAddr.Is6() && slices.Contains([]netip.Addr{e.LB.IPv6, e.LBBack6}, f.VirtualAddr) {
					t.Errorf("farm %s serves a NodePort on IPv6 %s, outside ::1/128", f.Name, f.VirtualAddr)
				}
			}
		})
	}
}

// localnetGuarded: route_localnet, which localhost NodePorts need on the
// nft plane, must not open the node's loopback-bound services to other
// hosts (CVE-2020-8558). The client sends a connection to 127.0.0.1
// through the node (its own route for it, ahead of its local table): the
// node's guard drops it, as kube-proxy's "block incoming localnet
// connections" rule does.
func localnetGuarded(t *testing.T, e *env) {
	t.Helper()
	var ln net.Listener
	if err := testutil.Do(e.LB.NS, func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "loopback service")
			c.Close()
		}
	}()
	testutil.Run(t, e.Client.Name, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1")
	testutil.Run(t, e.Client.Name, "ip", "route", "add", "127.0.0.1/32", "via", e.LB.IPv4.String(), "table", "100")
	testutil.Run(t, e.Client.Name, "ip", "rule", "add", "pref", "10", "to", "127.0.0.1/32", "lookup", "100")
	// The local table comes first by default (pref 0): after it here.
	testutil.Run(t, e.Client.Name, "ip", "rule", "add", "pref", "20", "lookup", "local")
	testutil.Run(t, e.Client.Name, "ip", "rule", "del", "pref", "0")
	to := ln.Addr().(*net.TCPAddr).AddrPort()
	c, err := testutil.DialTCPFrom(e.Client.NS, netip.AddrPortFrom(e.Client.IPv4, 0), to, time.Second)
	if err == nil {
		line, _ := testutil.ReadLine(c, time.Second)
		c.Close()
		t.Fatalf("a client reached the node's 127.0.0.1 service %s through route_localnet: %q", to, line)
	}
	if !isTimeout(err) {
		t.Fatalf("a client's connection to the node's %s: %v, want it dropped", to, err)
	}
}

// TestKubeProxyNodePortAddressesIPv6: kube-proxy's TestNodePorts "ipv6,
// multiple nodeport-addresses" variant on both planes: an IPv6 Service
// whose NodePort is served on the node's IPv6 addresses inside the CIDRs,
// the node IP's /64 and a secondary address given as a /128 (kube-proxy's
// 2001:db8::/64 and 2001:db8:1::2/128), and not on the node's IPv6
// address outside them.
func TestKubeProxyNodePortAddressesIPv6(t *testing.T) {
	secondary := netip.MustParseAddr("fd00:101::2")
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			e := newWorld(t, 3)
			e.scenarioSources()
			e.LB.AddAddr(t, netip.PrefixFrom(secondary, 64))
			e.configure = func(c *kube.Config) {
				c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("192.168.1.0/24"),
					netip.MustParsePrefix("fd00:100::/64"), netip.PrefixFrom(secondary, 128)}
				c.InterfaceAddrs = ifaddr.New(e.LB.NS)
			}
			e.startController(plane)
			e.startServers()

			s := service("np6m", corev1.ServiceTypeNodePort)
			s.Spec.Ports = s.Spec.Ports[:1]
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
			s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
			svc := e.createService(s)
			e.kpSlice("np6m", "np6m-1", true, readyEP(0, false), readyEP(1, true))
			np := svc.Spec.Ports[0].NodePort
			flows := []flow{
				{name: "external to nodePort", from: fromExternal, to: ap(e.LB.IPv6, np), want: "b0,b1 masq"},
				{name: "pod to cluster IP", from: fromPod, to: ap(cip(svc), 80), want: "b0,b1"},
				{name: "node to nodePort", from: fromNode, to: ap(e.LB.IPv6, np), want: "b0,b1 masq",
					known: map[string]string{"ebpf": "b0,b1"}}, // docs note 4
				{name: "external to nodePort on secondary IP", from: fromExternal, to: ap(secondary, np), want: "b0,b1 masq"},
				{name: "external to nodePort on an address in the /64", from: fromExternal, to: ap(altNodeIP6, np), want: "b0,b1 masq"},
				// Not in the CIDRs: the backend-side address of the node.
				{name: "nodePort outside the CIDRs", from: "b2", to: ap(e.LBBack6, np), want: "REJECT"},
			}
			e.settle(plane, flows[0])
			e.runFlows(t, plane, flows)
		})
	}
}
