package kube_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// nodeAsk runs requests from a process of the node itself (the LB
// namespace, in cgroup cg) and checks that each socket saw the service
// address as its peer and each backend the node's own address; it counts
// answers per backend.
func (e *env) nodeAsk(cg *testutil.Cgroup, mode string, addr netip.AddrPort, n int) map[string]int {
	e.t.Helper()
	from := e.LBBack4
	if addr.Addr().Is6() {
		from = e.LBBack6
	}
	out := map[string]int{}
	for i, a := range cg.Ask(e.t, e.LB.Name, mode, addr, n) {
		if a.Err != "" {
			e.t.Fatalf("node %s request %d to %s: %s", mode, i, addr, a.Err)
		}
		if a.Peer != addr.String() {
			e.t.Errorf("node %s request %d: the socket's peer is %s, want the service address %s", mode, i, a.Peer, addr)
		}
		name, seen, err := testutil.ParseReply(a.Reply)
		if err != nil {
			e.t.Fatal(err)
		}
		if seen.Addr() != from {
			e.t.Errorf("node %s request %d: %s saw source %s, want the node's %s", mode, i, name, seen, from)
		}
		out[name]++
	}
	return out
}

// TestKubeProxyNodeTraffic runs the real `xlb kube-proxy --dataplane ebpf
// --socket-lb-cgroup` against the API server: a process of the node itself
// (hostNetwork: the LB namespace, in the cgroup the proxy was given)
// reaches a Service's cluster IPs (TCP IPv4 and IPv6, UDP) and its
// NodePort on the node's address, balanced round robin over every
// endpoint at connect time; and a Pod whose veth appears after the proxy
// started (a new namespace wired into the node) reaches the Service
// without a restart.
func TestKubeProxyNodeTraffic(t *testing.T) {
	e := newWorld(t, 3)
	api := apiserver(t)
	bin := xlbBinary(t)
	e.startServers()
	cg := testutil.NewCgroup(t)
	kubeconfig := e.proxyKubeconfig(api)
	p := e.startProxy(bin, kubeconfig, t.TempDir(), "--dataplane", "ebpf", "--pin-path", mountBPFFS(t),
		"--conn-table-size", "4096", "--socket-lb-cgroup", cg.Dir)
	e.waitHealthy()

	s := service("web", corev1.ServiceTypeNodePort)
	pol := corev1.IPFamilyPolicyRequireDualStack
	s.Spec.IPFamilyPolicy = &pol
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	svc := e.createService(s)
	e.setEndpoints("web", false, ready(0, 1, 2))
	e.setEndpoints("web", true, ready(0, 1, 2))
	cip4 := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIPs[0]), 80)
	cip6 := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIPs[1]), 80)
	nodePort := netip.AddrPortFrom(e.LB.IPv4, uint16(svc.Spec.Ports[0].NodePort))
	e.waitFor("all three endpoints from the client", func() bool { return len(e.spreadNow(cip4, false, 6)) == 3 })
	e.waitFor("all three IPv6 endpoints from the client", func() bool { return len(e.spreadNow(cip6, false, 6)) == 3 })

	const n = 30
	for _, c := range []struct {
		what string
		mode string
		addr netip.AddrPort
	}{
		{"cluster IP", testutil.AskTCPMode, cip4},
		{"IPv6 cluster IP", testutil.AskTCPMode, cip6},
		{"NodePort on the node's address", testutil.AskTCPMode, nodePort},
	} {
		got := e.nodeAsk(cg, c.mode, c.addr, n)
		if keys(got) != "b0,b1,b2" {
			t.Errorf("node to %s: answers %v, want b0,b1,b2", c.what, got)
		}
		for name, k := range got {
			if k < n/3-1 || k > n/3+1 {
				t.Errorf("node to %s: %s answered %d of %d, want %d+-1 (round robin)", c.what, name, k, n, n/3)
			}
		}
	}
	// UDP (a DNS client): one socket's datagrams to one endpoint, each
	// new socket the next one.
	seen := map[string]bool{}
	for range 3 {
		got := e.nodeAsk(cg, testutil.AskUDPMode, netip.AddrPortFrom(cip4.Addr(), 80), 4)
		if len(got) != 1 {
			t.Errorf("node UDP socket: answers %v, want one endpoint", got)
		}
		for k := range got {
			seen[k] = true
		}
	}
	if len(seen) != 3 {
		t.Errorf("three node UDP sockets reached %v, want three endpoints", seen)
	}

	// A Pod started after the proxy: its veth is new; the program is
	// attached to it as it appears.
	pod := e.AddClient(t, "pod0", netip.MustParsePrefix("10.101.0.0/24"))
	e.waitFor("the new Pod reaching all three endpoints", func() bool {
		seen := map[string]bool{}
		for range 6 {
			got, err := testutil.AskTCP(pod.NS, cip4)
			if err != nil {
				return false
			}
			name, from, _ := testutil.ParseReply(got)
			if from.Addr() != pod.IPv4 {
				t.Fatalf("the new Pod's connection reached %s from %s, want its own address %s (dnat)", name, from, pod.IPv4)
			}
			seen[name] = true
		}
		return len(seen) == 3
	})
	p.stop(t)
}
