package kube_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// kube-proxy's own scenarios (kubernetes pkg/proxy/nftables/proxier_test.go,
// the tests that end in runPacketFlowTests) ported to real traffic: each
// builds the same Services and EndpointSlices against the real API server,
// then connects from the same kind of source to the same kind of
// destination and checks which endpoints answer, whether the endpoint saw
// the source's address or the node's (masquerade), or whether the
// connection is rejected or dropped.
//
// kube-proxy's addresses map onto the test topology like this:
//
//	pod 10.0.0.2                  -> 10.0.0.2 on the client namespace (routed via the LB)
//	external client 203.0.113.2   -> 203.0.113.2 on the client namespace
//	blocked client 203.0.113.130  -> 203.0.113.130 on the client namespace
//	node 192.168.0.2              -> the LB namespace's client-side address (the node)
//	secondary node IP             -> a second address on the LB's client-side link, not in the Node's status
//	endpoint 10.180.x.y / 10.0.1.x -> backend namespaces b0, b1, b2 (in that order)
//	endpoint connecting to its own Service -> a backend namespace as source (hairpin)
//	external IP / LB IP           -> addresses of testutil's VIP network (routed to the LB)
//	unallocated cluster IP        -> an unused address of the test API server's service range
//
// Where xlb does something else than kube-proxy, the flow names what xlb
// does (known) and docs/kube-proxy.md says why (its notes are cited by
// number at the flows); such a flow fails when xlb
// starts to behave like kube-proxy, so the table is kept true.

// Source kinds.
const (
	fromPod      = "pod"
	fromExternal = "external"
	fromBlocked  = "blocked"
	fromNode     = "node"
	// fromNodeUnbound: a process of the node whose socket is not bound:
	// the kernel picks its source address (127.0.0.1 towards 127.0.0.1).
	fromNodeUnbound = "node-unbound"
)

var (
	podIP          = netip.MustParseAddr("10.0.0.2")
	podCIDR        = netip.MustParsePrefix("10.0.0.0/24")
	externalClient = netip.MustParseAddr("203.0.113.2")
	blockedClient  = netip.MustParseAddr("203.0.113.130")
	altNodeIP      = netip.MustParseAddr("10.100.0.9")
	unallocatedIP  = netip.MustParseAddr("10.96.255.250")
	// IPv6 (kube-proxy's TestNodePorts ipv6 variants).
	podIP6          = netip.MustParseAddr("fd00:10::2")
	podCIDR6        = netip.MustParsePrefix("fd00:10::/64")
	externalClient6 = netip.MustParseAddr("2600:5200::1")
	altNodeIP6      = netip.MustParseAddr("fd00:100::9")
)

// flow is one packetFlowTest.
type flow struct {
	name string
	from string // fromPod, fromExternal, fromBlocked, fromNode, or "b<i>" (hairpin)
	to   netip.AddrPort
	udp  bool
	// bind, with from fromNode, is the node's source address instead of
	// its IP (kube-proxy's "same node to LB, SNATted to LB").
	bind netip.Addr
	// want is kube-proxy's result: the endpoints that answer ("b0,b1"),
	// followed by " masq" when they see the node's address instead of the
	// source's; or REJECT (connection refused) or DROP (no answer).
	want string
	// known, per plane, is what xlb does instead (see docs/kube-proxy.md).
	known map[string]string
}

// scenarioEnv adds the sources and routes kube-proxy's scenarios need to
// a test env.
func (e *env) scenarioSources() {
	for _, a := range []netip.Addr{podIP, externalClient, blockedClient} {
		e.Client.AddAddr(e.t, netip.PrefixFrom(a, 32))
		testutil.Run(e.t, e.LB.Name, "ip", "route", "add", a.String()+"/32", "via", e.Client.IPv4.String())
	}
	e.LB.AddAddr(e.t, netip.PrefixFrom(altNodeIP, 24))
	for _, a := range []netip.Addr{podIP6, externalClient6} {
		e.Client.AddAddr(e.t, netip.PrefixFrom(a, 128))
		testutil.Run(e.t, e.LB.Name, "ip", "-6", "route", "add", a.String()+"/128", "via", e.Client.IPv6.String())
	}
	e.LB.AddAddr(e.t, netip.PrefixFrom(altNodeIP6, 64))
	// A node has a default route (here: to the client namespace, which
	// does not forward): what no rule takes leaves the node and is lost
	// upstream.
	testutil.Run(e.t, e.LB.Name, "ip", "route", "add", "default", "via", e.Client.IPv4.String())
	testutil.Run(e.t, e.LB.Name, "ip", "-6", "route", "add", "default", "via", e.Client.IPv6.String())
}

// result runs a flow n times and says what happened, in flow.want's words.
func (e *env) result(f flow, n int) string {
	ns := e.Client.NS
	var src netip.Addr
	v6 := f.to.Addr().Is6()
	switch f.from {
	case fromPod:
		src = pick6(v6, podIP, podIP6)
	case fromExternal:
		src = pick6(v6, externalClient, externalClient6)
	case fromBlocked:
		src = blockedClient
	case fromNode:
		ns, src = e.LB.NS, e.LB.Addr(v6)
		if f.bind.IsValid() {
			src = f.bind
		}
	case fromNodeUnbound:
		ns = e.LB.NS
	default:
		var i int
		if _, err := fmt.Sscanf(f.from, "b%d", &i); err != nil {
			e.t.Fatalf("flow %q: source %q", f.name, f.from)
		}
		ns, src = e.Backends[i].NS, e.Backends[i].Addr(v6)
	}
	seen := map[string]bool{}
	masq := false
	for range n {
		var got string
		var err error
		local := src
		ask := func() {
			if f.udp {
				got, err = testutil.AskUDPWithin(ns, netip.AddrPortFrom(src, uint16(udpSourcePort.Add(1))), f.to, 700*time.Millisecond)
				return
			}
			var c net.Conn
			c, err = testutil.DialTCPFrom(ns, netip.AddrPortFrom(src, 0), f.to, 700*time.Millisecond)
			if err == nil {
				// The address the socket has (the kernel's pick when
				// it is not bound): what the endpoint sees unless it
				// is masqueraded.
				local = c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
				got, err = testutil.ReadLine(c, 700*time.Millisecond)
				c.Close()
			}
		}
		if (f.from == fromNode || f.from == fromNodeUnbound) && e.cg != nil {
			// A process of the node: in the cgroup the ebpf plane
			// balances at the socket.
			e.cg.Enter(e.t, ask)
		} else {
			ask()
		}
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return "REJECT"
		case errors.Is(err, syscall.EPERM):
			// connect() refused by a filter of the node's own
			// connections at once (kube-proxy's drop in the output
			// path lets connect() retry its SYN until it times out).
			return "EPERM"
		case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
			return "UNREACHABLE"
		case errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
			return "DROP"
		case err != nil:
			return "error: " + err.Error()
		}
		name, from, perr := testutil.ParseReply(got)
		if perr != nil {
			return "bad reply " + got
		}
		seen[name] = true
		masq = masq || from.Addr() != local
	}
	var names []string
	for k := range seen {
		names = append(names, k)
	}
	slices.Sort(names)
	out := strings.Join(names, ",")
	if masq {
		out += " masq"
	}
	return out
}

func pick6(v6 bool, a4, a6 netip.Addr) netip.Addr {
	if v6 {
		return a6
	}
	return a4
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// runFlows checks each flow on plane; with n connections per flow, every
// endpoint of a round-robin Service answers.
func (e *env) runFlows(t *testing.T, plane string, flows []flow) {
	t.Helper()
	for _, f := range flows {
		want := f.want
		if k, ok := f.known[plane]; ok {
			want = k
		}
		// A flow may run before the proxy synced the object it needs
		// (e.g. a load balancer status written after the Service): it
		// is tried again for up to 5 s.
		got := e.result(f, flowCount(want))
		for deadline := time.Now().Add(5 * time.Second); got != want && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			got = e.result(f, flowCount(want))
		}
		if got != want {
			if want != f.want {
				t.Errorf("%s: %s (kube-proxy: %s; xlb was known to give %s)", f.name, got, f.want, want)
			} else {
				t.Errorf("%s: %s, want %s (as kube-proxy)", f.name, got, f.want)
			}
		}
	}
}

// kpSlice is an EndpointSlice of Service svc: the given backends on port
// name/proto -> 8080, with their conditions and nodes.
type kpEndpoint struct {
	backend                     int
	ready, serving, terminating bool
	local                       bool
	// zones and nodes are the endpoint's hints (forZones, forNodes);
	// a node "self" is this node.
	zones, nodes []string
}

func (e *env) kpSlice(svc, name string, v6 bool, eps ...kpEndpoint) {
	e.t.Helper()
	at := discoveryv1.AddressTypeIPv4
	if v6 {
		at = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "xlb-test"}},
		AddressType: at,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("tcp"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("udp"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolUDP)},
		},
		Endpoints: []discoveryv1.Endpoint{},
	}
	for _, ep := range eps {
		node := "remote"
		if ep.local {
			node = e.node
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.Backends[ep.backend].Addr(v6).String()},
			NodeName:   ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ep.ready), Serving: ptr.To(ep.serving), Terminating: ptr.To(ep.terminating)},
			Hints:      e.hints(ep),
		})
	}
	api := e.client.DiscoveryV1().EndpointSlices(e.ns)
	if _, err := api.Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("endpoint slice %s: %v", name, err)
	}
}

// hints are an endpoint's EndpointSlice hints, nil without any.
func (e *env) hints(ep kpEndpoint) *discoveryv1.EndpointHints {
	if len(ep.zones) == 0 && len(ep.nodes) == 0 {
		return nil
	}
	h := &discoveryv1.EndpointHints{}
	for _, z := range ep.zones {
		h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: z})
	}
	for _, n := range ep.nodes {
		if n == "self" {
			n = e.node
		}
		h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: n})
	}
	return h
}

// zoned is a ready remote endpoint hinted for zones.
func zoned(b int, zones ...string) kpEndpoint {
	return kpEndpoint{backend: b, ready: true, serving: true, zones: zones}
}

// setZone sets (or with "" removes) the Node's topology.kubernetes.io/zone
// label, as the kubelet or a cloud provider does.
func (e *env) setZone(zone string) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, e.node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get node: %v", err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if zone == "" {
		delete(n.Labels, corev1.LabelTopologyZone)
	} else {
		n.Labels[corev1.LabelTopologyZone] = zone
	}
	if _, err := e.client.CoreV1().Nodes().Update(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("label node: %v", err)
	}
}

func readyEP(b int, local bool) kpEndpoint {
	return kpEndpoint{backend: b, ready: true, serving: true, local: local}
}

// withLB gives a LoadBalancer Service its status address.
func (e *env) withLB(svc *corev1.Service, ips ...netip.Addr) *corev1.Service {
	e.t.Helper()
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	out, err := e.client.CoreV1().Services(e.ns).UpdateStatus(e.ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatalf("load balancer status of %s: %v", svc.Name, err)
	}
	return out
}

// settle waits until a flow gives its expected result (the proxy has
// synced the Services just made), for at most 15 s.
func (e *env) settle(plane string, f flow) {
	e.t.Helper()
	want := f.want
	if k, ok := f.known[plane]; ok {
		want = k
	}
	deadline := time.Now().Add(15 * time.Second)
	for e.result(f, flowCount(want)) != want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// flowCount is how many connections a flow makes: enough for a round
// robin over the expected endpoints to reach each (kube-proxy's tracer
// lists every endpoint a rule may pick).
func flowCount(want string) int {
	return max(4, 3*(strings.Count(want, ",")+1))
}

func ap(a netip.Addr, port int32) netip.AddrPort { return netip.AddrPortFrom(a, uint16(port)) }

func cip(svc *corev1.Service) netip.Addr { return netip.MustParseAddr(svc.Spec.ClusterIP) }

// TestKubeProxyScenarios runs the ported scenarios on both data planes.
func TestKubeProxyScenarios(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			e := newWorld(t, 5)
			// kube-proxy's tests' setting: a cluster CIDR holding the
			// Pods (not the node, the backends or external clients).
			e.configure = func(kc *kube.Config) { kc.ClusterCIDRs = []netip.Prefix{podCIDR, podCIDR6} }
			e.startController(plane)
			e.startServers()
			e.scenarioSources()
			for _, s := range kubeProxyScenarios {
				t.Run(s.name, func(t *testing.T) {
					flows := s.setup(e)
					if len(flows) > 0 {
						e.settle(plane, flows[0])
					}
					e.runFlows(t, plane, flows)
				})
			}
		})
	}
}

type kpScenario struct {
	name  string
	setup func(e *env) []flow
}

var kubeProxyScenarios = []kpScenario{
	{"NoEndpointsReject", func(e *env) []flow {
		s := service("noeps", corev1.ServiceTypeLoadBalancer)
		s.Spec.ExternalIPs = []string{testutil.VIP4(11).String()}
		svc := e.withLB(e.createService(s), testutil.VIP4(12))
		np := svc.Spec.Ports[0].NodePort
		return []flow{
			{name: "pod to cluster IP with no endpoints", from: fromPod, to: ap(cip(svc), 80), want: "REJECT"},
			{name: "external to external IP with no endpoints", from: fromExternal, to: ap(testutil.VIP4(11), 80), want: "REJECT"},
			{name: "pod to NodePort with no endpoints", from: fromPod, to: ap(e.LB.IPv4, np), want: "REJECT"},
			{name: "external to NodePort with no endpoints", from: fromExternal, to: ap(e.LB.IPv4, np), want: "REJECT"},
			{name: "pod to LoadBalancer IP with no endpoints", from: fromPod, to: ap(testutil.VIP4(12), 80), want: "REJECT"},
			{name: "external to LoadBalancer IP with no endpoints", from: fromExternal, to: ap(testutil.VIP4(12), 80), want: "REJECT"},
		}
	}},
	{"ClusterIPGeneral", func(e *env) []flow {
		s1 := service("gen1", corev1.ServiceTypeClusterIP)
		s1.Spec.Ports = s1.Spec.Ports[:1]
		svc1 := e.createService(s1)
		e.kpSlice("gen1", "gen1-1", false, readyEP(0, true))
		s2 := service("gen2", corev1.ServiceTypeClusterIP)
		s2.Spec.Ports = append(s2.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
		svc2 := e.createService(s2)
		e.kpSlice("gen2", "gen2-1", false, readyEP(0, true), readyEP(1, false))
		// The https port's endpoints: the same Pods on 8080.
		e.kpSliceNamed("gen2", "gen2-2", "https", readyEP(0, true), readyEP(1, false))
		return []flow{
			{name: "simple clusterIP", from: fromPod, to: ap(cip(svc1), 80), want: "b0"},
			{name: "hairpin to cluster IP", from: "b0", to: ap(cip(svc1), 80), want: "b0 masq"},
			{name: "clusterIP with multiple endpoints", from: fromPod, to: ap(cip(svc2), 80), want: "b0,b1"},
			{name: "clusterIP with TargetPort", from: fromPod, to: ap(cip(svc2), 443), want: "b0,b1"},
			{name: "clusterIP with TCP and UDP on same port (UDP)", from: fromPod, to: ap(cip(svc2), 80), udp: true, want: "b0,b1"},
			{name: "TCP-only port does not match UDP traffic", from: fromPod, to: ap(cip(svc2), 443), udp: true, want: "REJECT",
				known: map[string]string{"nft": "DROP", "ebpf": "DROP"}}, // docs note 2: no service CIDR
			{name: "svc1 does not accept svc2's ports", from: fromPod, to: ap(cip(svc1), 443), want: "REJECT",
				known: map[string]string{"nft": "DROP", "ebpf": "DROP"}}, // docs note 2: no service CIDR
			// Same result as kube-proxy, but not by a rule of xlb's: the
			// packet follows the node's default route (docs note 2).
			{name: "packet to unallocated cluster ip", from: fromPod, to: ap(unallocatedIP, 80), want: "DROP"},
		}
	}},
	{"LoadBalancer", func(e *env) []flow {
		s := service("lbsr", corev1.ServiceTypeLoadBalancer)
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.LoadBalancerSourceRanges = []string{e.LB.IPv4.String() + "/32", "203.0.113.0/25"}
		svc := e.withLB(e.createService(s), testutil.VIP4(21), testutil.VIP4(22))
		e.kpSlice("lbsr", "lbsr-1", false, readyEP(0, false))
		np := svc.Spec.Ports[0].NodePort
		lb1, lb2 := ap(testutil.VIP4(21), 80), ap(testutil.VIP4(22), 80)
		return []flow{
			{name: "pod to cluster IP", from: fromPod, to: ap(cip(svc), 80), want: "b0"},
			{name: "external to nodePort", from: fromExternal, to: ap(e.LB.IPv4, np), want: "b0 masq"},
			{name: "nodePort bypasses LoadBalancerSourceRanges", from: fromBlocked, to: ap(e.LB.IPv4, np), want: "b0 masq"},
			{name: "accepted external to LB1", from: fromExternal, to: lb1, want: "b0 masq"},
			{name: "accepted external to LB2", from: fromExternal, to: lb2, want: "b0 masq"},
			{name: "blocked external to LB1", from: fromBlocked, to: lb1, want: "DROP"},
			{name: "blocked external to LB2", from: fromBlocked, to: lb2, want: "DROP"},
			{name: "pod to LB1 (blocked by LoadBalancerSourceRanges)", from: fromPod, to: lb1, want: "DROP"},
			{name: "pod to LB2 (blocked by LoadBalancerSourceRanges)", from: fromPod, to: lb2, want: "DROP"},
			{name: "node to LB1 (allowed by LoadBalancerSourceRanges)", from: fromNode, to: lb1, want: "b0 masq",
				known: map[string]string{"ebpf": "b0"}}, // docs note 4: balanced at the socket, nothing to masquerade
			{name: "node to LB2 (allowed by LoadBalancerSourceRanges)", from: fromNode, to: lb2, want: "b0 masq",
				known: map[string]string{"ebpf": "b0"}}, // docs note 4
			// Not in kube-proxy's test: a socket of the node that is not
			// bound takes the node's address towards the LB IP.
			{name: "node, unbound, to LB1 (allowed by LoadBalancerSourceRanges)", from: fromNodeUnbound, to: lb1, want: "b0 masq",
				known: map[string]string{"ebpf": "b0"}}, // docs note 4
		}
	}},
	{"LoadBalancerSelfSNAT", func(e *env) []flow {
		// kube-proxy's TestLoadBalancer, its last flows: "when you
		// connect from a node to a LB IP, something external to
		// kube-proxy will cause the connection to be SNATted to the LB
		// IP" (a VIP-like load balancer whose IP is local to the node):
		// the ranges hold the node's IP, so the LB IPs are allowed as
		// sources too. Here the LB IPs are local addresses of the node
		// and its socket is bound to them.
		s := service("lbself", corev1.ServiceTypeLoadBalancer)
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.LoadBalancerSourceRanges = []string{e.LB.IPv4.String() + "/32", "203.0.113.0/25"}
		lbip1, lbip2 := testutil.VIP4(61), testutil.VIP4(62)
		for _, a := range []netip.Addr{lbip1, lbip2} {
			testutil.Run(e.t, e.LB.Name, "ip", "addr", "add", a.String()+"/32", "dev", "lo")
		}
		e.withLB(e.createService(s), lbip1, lbip2)
		e.kpSlice("lbself", "lbself-1", false, readyEP(0, false))
		return []flow{
			{name: "same node to LB1, SNATted to LB1 (implicitly allowed)", from: fromNode, bind: lbip1, to: ap(lbip1, 80), want: "b0 masq",
				known: map[string]string{"ebpf": "b0"}}, // docs note 4
			{name: "same node to LB2, SNATted to LB2 (implicitly allowed)", from: fromNode, bind: lbip2, to: ap(lbip2, 80), want: "b0 masq",
				known: map[string]string{"ebpf": "b0"}}, // docs note 4
		}
	}},
	{"LoadBalancerNodeBlocked", func(e *env) []flow {
		// Not in kube-proxy's test, from its rules: ranges that do not
		// hold the node's address filter the node's own connections to
		// the LB IP (kube-proxy's firewall check in filter-output-pre-dnat),
		// not its connections to the cluster IP or the NodePort.
		s := service("lbnode", corev1.ServiceTypeLoadBalancer)
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/25"}
		svc := e.withLB(e.createService(s), testutil.VIP4(71))
		e.kpSlice("lbnode", "lbnode-1", false, readyEP(0, false))
		lb := ap(testutil.VIP4(71), 80)
		return []flow{
			{name: "accepted external to LB", from: fromExternal, to: lb, want: "b0 masq"},
			{name: "node to LB (blocked by LoadBalancerSourceRanges)", from: fromNode, to: lb, want: "DROP",
				known: map[string]string{"ebpf": "EPERM"}}, // docs note 6
			{name: "node, unbound, to LB (blocked by LoadBalancerSourceRanges)", from: fromNodeUnbound, to: lb, want: "DROP",
				known: map[string]string{"ebpf": "EPERM"}}, // docs note 6
			{name: "node to cluster IP (not filtered)", from: fromNode, to: ap(cip(svc), 80), want: "b0 masq",
				known: map[string]string{"ebpf": "b0"}}, // docs note 7
			{name: "node to NodePort (not filtered)", from: fromNode, to: ap(e.LB.IPv4, svc.Spec.Ports[0].NodePort), want: "b0 masq",
				known: map[string]string{"ebpf": "b0"}}, // docs note 4
		}
	}},
	{"NodePorts", func(e *env) []flow {
		s := service("np", corev1.ServiceTypeNodePort)
		s.Spec.Ports = s.Spec.Ports[:1]
		svc := e.createService(s)
		e.kpSlice("np", "np-1", false, readyEP(0, false), readyEP(1, true))
		np := svc.Spec.Ports[0].NodePort
		return []flow{
			{name: "pod to cluster IP", from: fromPod, to: ap(cip(svc), 80), want: "b0,b1"},
			{name: "external to nodePort", from: fromExternal, to: ap(e.LB.IPv4, np), want: "b0,b1 masq"},
			{name: "node to nodePort", from: fromNode, to: ap(e.LB.IPv4, np), want: "b0,b1 masq",
				known: map[string]string{"ebpf": "b0,b1"}}, // docs note 4
			// kube-proxy's "" (no rule matches): the node's own stack
			// answers, and nothing listens there.
			{name: "secondary nodeIP ignores NodePorts", from: fromExternal, to: ap(altNodeIP, np), want: "REJECT"},
		}
	}},
	{"ExternalTrafficPolicyLocal", func(e *env) []flow {
		s := service("etpl", corev1.ServiceTypeLoadBalancer)
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.ExternalIPs = []string{testutil.VIP4(31).String()}
		svc := e.withLB(e.createService(s), testutil.VIP4(32))
		e.kpSlice("etpl", "etpl-1", false, readyEP(0, false), readyEP(1, true))
		np := svc.Spec.Ports[0].NodePort
		ext, lb := ap(testutil.VIP4(31), 80), ap(testutil.VIP4(32), 80)
		return []flow{
			{name: "pod to cluster IP hits both endpoints, unmasqueraded", from: fromPod, to: ap(cip(svc), 80), want: "b0,b1"},
			{name: "pod to external IP hits both endpoints, unmasqueraded", from: fromPod, to: ext, want: "b0,b1"},
			{name: "external to external IP hits only local endpoint, unmasqueraded", from: fromExternal, to: ext, want: "b1"},
			{name: "pod to LB IP hits both endpoints, unmasqueraded", from: fromPod, to: lb, want: "b0,b1"},
			{name: "external to LB IP hits only local endpoint, unmasqueraded", from: fromExternal, to: lb, want: "b1"},
			{name: "pod to NodePort hits both endpoints, unmasqueraded", from: fromPod, to: ap(e.LB.IPv4, np), want: "b0,b1"},
			{name: "external to NodePort hits only local endpoint, unmasqueraded", from: fromExternal, to: ap(e.LB.IPv4, np), want: "b1"},
		}
	}},
	{"ExternalTrafficPolicyCluster", func(e *env) []flow {
		s := service("etpc", corev1.ServiceTypeLoadBalancer)
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.ExternalIPs = []string{testutil.VIP4(41).String()}
		svc := e.withLB(e.createService(s), testutil.VIP4(42))
		e.kpSlice("etpc", "etpc-1", false, readyEP(0, false), readyEP(1, true))
		np := svc.Spec.Ports[0].NodePort
		ext, lb := ap(testutil.VIP4(41), 80), ap(testutil.VIP4(42), 80)
		return []flow{
			{name: "pod to cluster IP hits both endpoints, unmasqueraded", from: fromPod, to: ap(cip(svc), 80), want: "b0,b1"},
			{name: "pod to external IP hits both endpoints, masqueraded", from: fromPod, to: ext, want: "b0,b1 masq"},
			{name: "external to external IP hits both endpoints, masqueraded", from: fromExternal, to: ext, want: "b0,b1 masq"},
			{name: "pod to LB IP hits both endpoints, masqueraded", from: fromPod, to: lb, want: "b0,b1 masq"},
			{name: "external to LB IP hits both endpoints, masqueraded", from: fromExternal, to: lb, want: "b0,b1 masq"},
			{name: "pod to NodePort hits both endpoints, masqueraded", from: fromPod, to: ap(e.LB.IPv4, np), want: "b0,b1 masq"},
			{name: "external to NodePort hits both endpoints, masqueraded", from: fromExternal, to: ap(e.LB.IPv4, np), want: "b0,b1 masq"},
		}
	}},
	{"TerminatingEndpointsTrafficPolicyCluster", func(e *env) []flow {
		// kube-proxy's first case, "ready endpoints exist": ready
		// endpoints serve, a serving terminating one and a not-serving
		// one do not.
		s := service("term", corev1.ServiceTypeLoadBalancer)
		s.Spec.Ports = s.Spec.Ports[:1]
		svc := e.withLB(e.createService(s), testutil.VIP4(51))
		e.kpSlice("term", "term-1", false,
			readyEP(0, true),
			kpEndpoint{backend: 1, serving: true, terminating: true},
			kpEndpoint{backend: 2, terminating: true})
		// "only terminating endpoints exist": the serving terminating
		// ones serve.
		s2 := service("term2", corev1.ServiceTypeLoadBalancer)
		s2.Spec.Ports = s2.Spec.Ports[:1]
		svc2 := e.withLB(e.createService(s2), testutil.VIP4(52))
		e.kpSlice("term2", "term2-1", false,
			kpEndpoint{backend: 0, serving: true, terminating: true, local: true},
			kpEndpoint{backend: 1, serving: true, terminating: true},
			kpEndpoint{backend: 2, terminating: true})
		// "no usable endpoints on any node".
		s3 := service("term3", corev1.ServiceTypeLoadBalancer)
		s3.Spec.Ports = s3.Spec.Ports[:1]
		svc3 := e.withLB(e.createService(s3), testutil.VIP4(53))
		e.kpSlice("term3", "term3-1", false,
			kpEndpoint{backend: 0, terminating: true, local: true},
			kpEndpoint{backend: 1, terminating: true})
		return []flow{
			{name: "ready endpoints exist: pod to clusterIP", from: fromPod, to: ap(cip(svc), 80), want: "b0"},
			{name: "ready endpoints exist: external to LB", from: fromExternal, to: ap(testutil.VIP4(51), 80), want: "b0 masq"},
			{name: "only terminating endpoints: pod to clusterIP", from: fromPod, to: ap(cip(svc2), 80), want: "b0,b1"},
			{name: "only terminating endpoints: external to LB", from: fromExternal, to: ap(testutil.VIP4(52), 80), want: "b0,b1 masq"},
			{name: "no usable endpoints: pod to clusterIP", from: fromPod, to: ap(cip(svc3), 80), want: "REJECT"},
			{name: "no usable endpoints: external to LB", from: fromExternal, to: ap(testutil.VIP4(53), 80), want: "REJECT"},
		}
	}},
	{"NodePortsIPv6", func(e *env) []flow {
		// kube-proxy's TestNodePorts, "ipv6" (no --nodeport-addresses:
		// xlb serves the Node's addresses, here its IPv6 InternalIP; the
		// "multiple nodeport-addresses" variant is
		// TestKubeProxyNodePortAddressesIPv6).
		s := service("np6", corev1.ServiceTypeNodePort)
		s.Spec.Ports = s.Spec.Ports[:1]
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		svc := e.createService(s)
		e.kpSlice("np6", "np6-1", true, readyEP(0, false), readyEP(1, true))
		np := svc.Spec.Ports[0].NodePort
		return []flow{
			{name: "pod to cluster IP", from: fromPod, to: ap(cip(svc), 80), want: "b0,b1"},
			{name: "external to nodePort", from: fromExternal, to: ap(e.LB.IPv6, np), want: "b0,b1 masq"},
			{name: "node to nodePort", from: fromNode, to: ap(e.LB.IPv6, np), want: "b0,b1 masq",
				known: map[string]string{"ebpf": "b0,b1"}}, // docs note 4
			{name: "secondary nodeIP ignores NodePorts", from: fromExternal, to: ap(altNodeIP6, np), want: "REJECT"},
		}
	}},
	{"InternalExternalMasquerade", func(e *env) []flow {
		// kube-proxy's TestInternalExternalMasquerade, its "base" case
		// (a cluster CIDR holding the Pods, no masqueradeAll): svc1
		// Cluster policies, svc2 externalTrafficPolicy Local, svc3
		// internalTrafficPolicy Local; each with a local endpoint and a
		// remote one. xlb has no cluster CIDR: where it differs it gives
		// kube-proxy's "no LocalTrafficDetector" result (docs notes 5,
		// 7), except for the node's own traffic to eTP:Local Services
		// (note 8).
		mk := func(name string, etpLocal, itpLocal bool, lbip netip.Addr) (*corev1.Service, int32) {
			s := service(name, corev1.ServiceTypeLoadBalancer)
			s.Spec.Ports = s.Spec.Ports[:1]
			if etpLocal {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
			if itpLocal {
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			}
			svc := e.withLB(e.createService(s), lbip)
			e.kpSlice(name, name+"-1", false, readyEP(0, true), readyEP(1, false))
			return svc, svc.Spec.Ports[0].NodePort
		}
		svc1, np1 := mk("iem1", false, false, testutil.VIP4(81))
		svc2, np2 := mk("iem2", true, false, testutil.VIP4(82))
		svc3, np3 := mk("iem3", false, true, testutil.VIP4(83))
		node := ap(e.LB.IPv4, 0)
		nodePort := func(np int32) netip.AddrPort { return ap(node.Addr(), np) }
		lb1, lb2, lb3 := ap(testutil.VIP4(81), 80), ap(testutil.VIP4(82), 80), ap(testutil.VIP4(83), 80)
		n7 := map[string]string{"ebpf": "b0,b1"}           // docs note 7
		n4 := map[string]string{"ebpf": "b0,b1"}           // docs note 4
		n8 := map[string]string{"nft": "b0", "ebpf": "b0"} // docs note 8
		n7l := map[string]string{"ebpf": "b0"}             // docs note 7
		return []flow{
			{name: "pod to ClusterIP", from: fromPod, to: ap(cip(svc1), 80), want: "b0,b1"},
			{name: "pod to NodePort", from: fromPod, to: nodePort(np1), want: "b0,b1 masq"},
			{name: "pod to LB", from: fromPod, to: lb1, want: "b0,b1 masq"},
			{name: "node to ClusterIP", from: fromNode, to: ap(cip(svc1), 80), want: "b0,b1 masq", known: n7},
			{name: "node to NodePort", from: fromNode, to: nodePort(np1), want: "b0,b1 masq", known: n4},
			{name: "node to LB", from: fromNode, to: lb1, want: "b0,b1 masq", known: n4},
			{name: "external to ClusterIP", from: fromExternal, to: ap(cip(svc1), 80), want: "b0,b1 masq"},
			{name: "external to NodePort", from: fromExternal, to: nodePort(np1), want: "b0,b1 masq"},
			{name: "external to LB", from: fromExternal, to: lb1, want: "b0,b1 masq"},

			{name: "pod to ClusterIP with eTP:Local", from: fromPod, to: ap(cip(svc2), 80), want: "b0,b1"},
			{name: "pod to NodePort with eTP:Local", from: fromPod, to: nodePort(np2), want: "b0,b1"},
			{name: "pod to LB with eTP:Local", from: fromPod, to: lb2, want: "b0,b1"},
			{name: "node to ClusterIP with eTP:Local", from: fromNode, to: ap(cip(svc2), 80), want: "b0,b1 masq", known: n7},
			// kube-proxy's test sends this one to svc1's NodePort (3001);
			// its comment says what it means: svc2's, short-circuited.
			{name: "node to NodePort with eTP:Local", from: fromNode, to: nodePort(np2), want: "b0,b1 masq", known: n8},
			{name: "node to LB with eTP:Local", from: fromNode, to: lb2, want: "b0,b1 masq", known: n8},
			{name: "external to ClusterIP with eTP:Local", from: fromExternal, to: ap(cip(svc2), 80), want: "b0,b1 masq"},
			{name: "external to NodePort with eTP:Local", from: fromExternal, to: nodePort(np2), want: "b0"},
			{name: "external to LB with eTP:Local", from: fromExternal, to: lb2, want: "b0"},

			{name: "pod to ClusterIP with iTP:Local", from: fromPod, to: ap(cip(svc3), 80), want: "b0"},
			{name: "pod to NodePort with iTP:Local", from: fromPod, to: nodePort(np3), want: "b0,b1 masq"},
			{name: "pod to LB with iTP:Local", from: fromPod, to: lb3, want: "b0,b1 masq"},
			{name: "node to ClusterIP with iTP:Local", from: fromNode, to: ap(cip(svc3), 80), want: "b0 masq", known: n7l},
			{name: "node to NodePort with iTP:Local", from: fromNode, to: nodePort(np3), want: "b0,b1 masq", known: n4},
			{name: "node to LB with iTP:Local", from: fromNode, to: lb3, want: "b0,b1 masq", known: n4},
			{name: "external to ClusterIP with iTP:Local", from: fromExternal, to: ap(cip(svc3), 80), want: "b0 masq"},
			{name: "external to NodePort with iTP:Local", from: fromExternal, to: nodePort(np3), want: "b0,b1 masq"},
			{name: "external to LB with iTP:Local", from: fromExternal, to: lb3, want: "b0,b1 masq"},
		}
	}},
	{"TerminatingEndpointsTrafficPolicyLocal", func(e *env) []flow {
		// kube-proxy's TestTerminatingEndpointsTrafficPolicyLocal: a
		// LoadBalancer Service with externalTrafficPolicy Local; each of
		// its four EndpointSlices on a Service of its own. Endpoints
		// 10.0.1.1-10.0.1.5 are b0-b4.
		mk := func(name string, lbip netip.Addr, eps ...kpEndpoint) (netip.AddrPort, netip.AddrPort) {
			s := service(name, corev1.ServiceTypeLoadBalancer)
			s.Spec.Ports = s.Spec.Ports[:1]
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			svc := e.withLB(e.createService(s), lbip)
			e.kpSlice(name, name+"-1", false, eps...)
			return ap(cip(svc), 80), ap(lbip, 80)
		}
		loc := func(b int, ready, serving, terminating bool) kpEndpoint {
			return kpEndpoint{backend: b, ready: ready, serving: serving, terminating: terminating, local: true}
		}
		c1, l1 := mk("tepl1", testutil.VIP4(91), loc(0, true, true, false), loc(1, true, true, false),
			loc(2, false, true, true), loc(3, false, false, true), readyEP(4, false))
		c2, l2 := mk("tepl2", testutil.VIP4(92), loc(1, false, true, true), loc(2, false, true, true),
			loc(3, false, false, true), readyEP(4, false))
		c3, l3 := mk("tepl3", testutil.VIP4(93), kpEndpoint{backend: 4, serving: true, terminating: true})
		c4, l4 := mk("tepl4", testutil.VIP4(94), loc(4, false, false, true), kpEndpoint{backend: 3, terminating: true})
		return []flow{
			{name: "ready endpoints exist: pod to clusterIP", from: fromPod, to: c1, want: "b0,b1,b4"},
			{name: "ready endpoints exist: external to LB", from: fromExternal, to: l1, want: "b0,b1"},
			{name: "only terminating endpoints exist: pod to clusterIP", from: fromPod, to: c2, want: "b4"},
			{name: "only terminating endpoints exist: external to LB", from: fromExternal, to: l2, want: "b1,b2"},
			{name: "terminating endpoints on remote node: pod to clusterIP", from: fromPod, to: c3, want: "b4"},
			{name: "terminating endpoints on remote node: external to LB, no locally-usable endpoints", from: fromExternal, to: l3, want: "DROP"},
			{name: "no usable endpoints on any node: pod to clusterIP", from: fromPod, to: c4, want: "REJECT"},
			{name: "no usable endpoints on any node: external to LB", from: fromExternal, to: l4, want: "REJECT"},
		}
	}},
	{"InternalTrafficPolicy", func(e *env) []flow {
		// kube-proxy's TestInternalTrafficPolicy, each case a Service of
		// its own; "endpoints deleted" is a Service without any.
		mk := func(name string, local bool, eps ...kpEndpoint) netip.AddrPort {
			s := service(name, corev1.ServiceTypeClusterIP)
			s.Spec.Ports = s.Spec.Ports[:1]
			if local {
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			} else {
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
			}
			svc := e.createService(s)
			if len(eps) > 0 {
				e.kpSlice(name, name+"-1", false, eps...)
			}
			return ap(cip(svc), 80)
		}
		cluster := mk("itp1", false, readyEP(0, true), readyEP(1, false), readyEP(2, false))
		one := mk("itp2", true, readyEP(0, true), readyEP(1, false), readyEP(2, false))
		multi := mk("itp3", true, readyEP(0, true), readyEP(1, true), readyEP(2, false))
		none := mk("itp4", true, readyEP(0, false), readyEP(1, false), readyEP(2, false))
		deleted := mk("itp5", true)
		return []flow{
			{name: "internalTrafficPolicy is cluster: pod to ClusterIP hits all endpoints", from: fromPod, to: cluster, want: "b0,b1,b2"},
			{name: "internalTrafficPolicy is local and there is one local endpoint: pod to ClusterIP hits only local endpoint", from: fromPod, to: one, want: "b0"},
			{name: "internalTrafficPolicy is local and there are multiple local endpoints: pod to ClusterIP hits all local endpoints", from: fromPod, to: multi, want: "b0,b1"},
			{name: "internalTrafficPolicy is local and there are no local endpoints: no endpoints", from: fromPod, to: none, want: "DROP"},
			{name: "endpoints deleted", from: fromPod, to: deleted, want: "REJECT"},
		}
	}},
	{"TopologyAwareHints", func(e *env) []flow {
		// kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go) with
		// real traffic: the node is in zone-a; the hints are what the
		// EndpointSlice controller writes for trafficDistribution
		// (PreferClose: forZones; PreferSameNode: forNodes too).
		e.setZone("zone-a")
		topoService := func(name string, td string, etpLocal bool) *corev1.Service {
			s := service(name, corev1.ServiceTypeNodePort)
			s.Spec.Ports = s.Spec.Ports[:1]
			s.Spec.TrafficDistribution = ptr.To(td)
			if etpLocal {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
			return e.createService(s)
		}
		zone := topoService("topo-zone", corev1.ServiceTrafficDistributionPreferSameZone, true)
		e.kpSlice("topo-zone", "topo-zone-1", false, zoned(0, "zone-a"), kpEndpoint{backend: 1, ready: true, serving: true, local: true, zones: []string{"zone-b"}}, zoned(2, "zone-a"))
		node := topoService("topo-node", corev1.ServiceTrafficDistributionPreferSameNode, false)
		e.kpSlice("topo-node", "topo-node-1", false,
			kpEndpoint{backend: 0, ready: true, serving: true, zones: []string{"zone-a"}, nodes: []string{"other"}},
			kpEndpoint{backend: 1, ready: true, serving: true, local: true, zones: []string{"zone-a"}, nodes: []string{"self"}},
			kpEndpoint{backend: 2, ready: true, serving: true, zones: []string{"zone-b"}, nodes: []string{"other2"}})
		missing := topoService("topo-missing", corev1.ServiceTrafficDistributionPreferClose, false)
		e.kpSlice("topo-missing", "topo-missing-1", false, zoned(0, "zone-a"), zoned(1, "zone-b"), readyEP(2, false))
		unready := topoService("topo-unready", corev1.ServiceTrafficDistributionPreferClose, false)
		e.kpSlice("topo-unready", "topo-unready-1", false,
			kpEndpoint{backend: 0, zones: []string{"zone-a"}}, zoned(1, "zone-b"), zoned(2, "zone-c"))
		np := zone.Spec.Ports[0].NodePort
		return []flow{
			{name: "zone hints: pod to cluster IP hits the endpoints of the node's zone", from: fromPod, to: ap(cip(zone), 80), want: "b0,b2"},
			{name: "zone hints: external to NodePort with eTP:Local ignores them", from: fromExternal, to: ap(e.LB.IPv4, np), want: "b1"},
			{name: "node hints: pod to cluster IP hits the endpoint for this node", from: fromPod, to: ap(cip(node), 80), want: "b1"},
			{name: "an endpoint without a hint: every endpoint", from: fromPod, to: ap(cip(missing), 80), want: "b0,b1,b2"},
			{name: "the zone's only endpoint is not ready: every ready endpoint", from: fromPod, to: ap(cip(unready), 80), want: "b1,b2"},
		}
	}},
	{"TopologyZoneChange", func(e *env) []flow {
		// The node's zone label changes: every Service is synced again
		// with the hints of the new zone; without the label, hints are
		// ignored.
		get := func(name string) *corev1.Service {
			s, err := e.client.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
			if err != nil {
				e.t.Fatalf("get %s: %v", name, err)
			}
			return s
		}
		zone, node := get("topo-zone"), get("topo-node")
		e.setZone("zone-b")
		return []flow{
			{name: "zone-b: pod to cluster IP hits zone-b's endpoint", from: fromPod, to: ap(cip(zone), 80), want: "b1"},
			{name: "zone-b: node hints still win", from: fromPod, to: ap(cip(node), 80), want: "b1"},
		}
	}},
	{"TopologyNoZoneLabel", func(e *env) []flow {
		zone, err := e.client.CoreV1().Services(e.ns).Get(e.ctx, "topo-zone", metav1.GetOptions{})
		if err != nil {
			e.t.Fatalf("get topo-zone: %v", err)
		}
		e.setZone("")
		return []flow{
			{name: "no zone label: pod to cluster IP hits every endpoint", from: fromPod, to: ap(cip(zone), 80), want: "b0,b1,b2"},
		}
	}},
}

// kpSliceNamed is kpSlice for one TCP port name.
func (e *env) kpSliceNamed(svc, name, port string, eps ...kpEndpoint) {
	e.t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "xlb-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(port), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, ep := range eps {
		node := "remote"
		if ep.local {
			node = e.node
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.Backends[ep.backend].IPv4.String()},
			NodeName:   ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ep.ready), Serving: ptr.To(ep.serving), Terminating: ptr.To(ep.terminating)},
		})
	}
	if _, err := e.client.DiscoveryV1().EndpointSlices(e.ns).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("endpoint slice %s: %v", name, err)
	}
}
