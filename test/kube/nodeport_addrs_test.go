package kube_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/xlb-lb/xlb/internal/ifaddr"
	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestKubeProxyNodePortAddresses: kube-proxy's TestNodePorts "multiple
// nodeport-addresses" variant, on both planes. With CIDRs (and kube-proxy
// 1.37's "localhost" keyword) in --nodeport-addresses, NodePorts are
// served on the node's interface addresses inside them — the secondary
// node IP, which the Node's status does not list, included — never on
// 127.0.0.1 (kube-proxy's nftables mode serves no localhost NodePort
// without an alpha feature gate), and an address added to an interface
// later serves them too, until it is removed.
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
				// kube-proxy (nftables mode, no feature gate): no rule; the
				// node's own stack refuses.
				{name: "node to localhost nodePort", from: fromNode, to: ap(netip.MustParseAddr("127.0.0.1"), np), want: "REJECT"},
			}
			e.settle(plane, flows[0])
			e.runFlows(t, plane, flows)

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
