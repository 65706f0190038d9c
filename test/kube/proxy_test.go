package kube_test

import (
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestServiceLifecycle: a NodePort Service with three endpoints is served on
// its cluster IP (TCP and UDP) and on the node's address, spread over all
// three; removing an endpoint takes it out; when no endpoint is ready the
// serving terminating one takes over; deleting the Service removes its farms
// and its address stops answering.
func TestServiceLifecycle(t *testing.T) {
	e := newEnv(t, 3)
	e.startServers()
	svc := e.createService(service("web", corev1.ServiceTypeNodePort))
	cip := netip.MustParseAddr(svc.Spec.ClusterIP)
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	clusterFarm := kube.FarmName(e.ns, "web", "tcp", kube.KindCluster, cip)
	nodeFarm := kube.FarmName(e.ns, "web", "tcp", kube.KindNodePort, e.LB.IPv4)
	udpFarm := kube.FarmName(e.ns, "web", "udp", kube.KindCluster, cip)

	// Without endpoints the farms exist with no backends.
	e.waitFarm(clusterFarm, hasBackends(0))
	e.setEndpoints("web", false, ready(0, 1, 2))
	e.waitFarm(clusterFarm, hasBackends(3))
	e.waitFarm(nodeFarm, hasBackends(3))
	e.waitFarm(udpFarm, hasBackends(3))

	for _, c := range []struct {
		what string
		addr netip.AddrPort
		udp  bool
	}{
		{"cluster IP tcp", netip.AddrPortFrom(cip, 80), false},
		{"cluster IP udp", netip.AddrPortFrom(cip, 80), true},
		{"node port tcp", netip.AddrPortFrom(e.LB.IPv4, nodePort), false},
	} {
		got := e.spread(c.addr, c.udp, 30)
		if keys(got) != "b0,b1,b2" {
			t.Errorf("%s: answers %v, want all of b0,b1,b2", c.what, got)
		}
		for name, n := range got {
			if n != 10 {
				t.Errorf("%s: %s answered %d of 30, want 10 (round robin)", c.what, name, n)
			}
		}
	}
	// NodePort traffic is masqueraded (externalTrafficPolicy Cluster);
	// cluster IP traffic keeps the client's address.
	if got, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(e.LB.IPv4, nodePort)); err != nil {
		t.Fatal(err)
	} else if _, from, _ := testutil.ParseReply(got); from.Addr() != e.LBBack4 {
		t.Errorf("node port: backend saw %s, want the node's %s (snat)", from, e.LBBack4)
	}
	if got, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(cip, 80)); err != nil {
		t.Fatal(err)
	} else if _, from, _ := testutil.ParseReply(got); from.Addr() != e.Client.IPv4 {
		t.Errorf("cluster IP: backend saw %s, want the client's %s (dnat)", from, e.Client.IPv4)
	}

	// Endpoint removal.
	e.setEndpoints("web", false, ready(0, 2))
	e.waitFarm(clusterFarm, hasBackends(2))
	if got := e.spread(netip.AddrPortFrom(cip, 80), false, 20); keys(got) != "b0,b2" {
		t.Errorf("after removing b1: answers %v", got)
	}
	if got := e.spread(netip.AddrPortFrom(cip, 80), true, 20); keys(got) != "b0,b2" {
		t.Errorf("udp after removing b1: answers %v", got)
	}

	// No ready endpoint: the serving terminating one takes over, the
	// terminating not-serving one does not.
	e.setEndpoints("web", false, []endpoint{
		{backend: 0, ready: false, serving: false, terminating: true},
		{backend: 2, ready: false, serving: true, terminating: true},
	})
	e.waitFarm(clusterFarm, hasBackends(1))
	if got := e.spread(netip.AddrPortFrom(cip, 80), false, 10); keys(got) != "b2" {
		t.Errorf("terminating fallback: answers %v, want only b2", got)
	}

	// Deleting the Service removes all its farms.
	if err := e.client.CoreV1().Services(e.ns).Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{clusterFarm, nodeFarm, udpFarm} {
		e.waitFarm(n, nil)
	}
	if got, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(cip, 80)); err == nil {
		t.Errorf("deleted Service still answered %q", got)
	}
}

// TestDualStackAndLocalPolicy: a dual-stack Service is served on both
// cluster IPs; with externalTrafficPolicy Local its NodePort uses only the
// endpoints on this node and keeps the client's address.
func TestDualStackAndLocalPolicy(t *testing.T) {
	e := newEnv(t, 3)
	e.startServers()
	s := service("dual", corev1.ServiceTypeNodePort)
	pol := corev1.IPFamilyPolicyRequireDualStack
	s.Spec.IPFamilyPolicy = &pol
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc := e.createService(s)
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("cluster IPs %v, want two", svc.Spec.ClusterIPs)
	}
	cip4, cip6 := netip.MustParseAddr(svc.Spec.ClusterIPs[0]), netip.MustParseAddr(svc.Spec.ClusterIPs[1])
	local := []endpoint{{backend: 0, ready: true, serving: true}, {backend: 1, ready: true, serving: true, otherNode: true}, {backend: 2, ready: true, serving: true}}
	e.setEndpoints("dual", false, local)
	e.setEndpoints("dual", true, local)
	e.waitFarm(kube.FarmName(e.ns, "dual", "tcp", kube.KindCluster, cip6), hasBackends(3))
	e.waitFarm(kube.FarmName(e.ns, "dual", "tcp", kube.KindCluster, cip4), hasBackends(3))
	e.waitFarm(kube.FarmName(e.ns, "dual", "tcp", kube.KindNodePort, e.LB.IPv6), hasBackends(2))

	if got := e.spread(netip.AddrPortFrom(cip6, 80), false, 15); keys(got) != "b0,b1,b2" {
		t.Errorf("ipv6 cluster IP: answers %v", got)
	}
	if got := e.spread(netip.AddrPortFrom(cip4, 80), true, 15); keys(got) != "b0,b1,b2" {
		t.Errorf("ipv4 cluster IP udp: answers %v", got)
	}
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	for _, a := range []netip.Addr{e.LB.IPv4, e.LB.IPv6} {
		got := e.spread(netip.AddrPortFrom(a, nodePort), false, 12)
		if keys(got) != "b0,b2" {
			t.Errorf("node port on %s (Local): answers %v, want only the local b0,b2", a, got)
		}
		reply, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(a, nodePort))
		if err != nil {
			t.Fatal(err)
		}
		if _, from, _ := testutil.ParseReply(reply); from.Addr() != e.Client.Addr(a.Is6()) {
			t.Errorf("node port on %s (Local): backend saw %s, want the client's address", a, from)
		}
	}
}

// TestInvalidAnnotation: an annotation is a request, never a condition of
// service. A Service whose annotation becomes invalid (or whose annotated
// farms the engine refuses) is served with the defaults, gets a Warning
// Event, and keeps following its endpoints: a removed endpoint stops
// receiving traffic at once. A new Service with a bad annotation is served
// with the defaults from the start. Fixing the annotation applies it.
func TestInvalidAnnotation(t *testing.T) {
	e := newEnv(t, 3)
	e.startServers()
	a := e.createService(service("a", corev1.ServiceTypeClusterIP))
	e.setEndpoints("a", false, ready(0, 1))
	aFarm := kube.FarmName(e.ns, "a", "tcp", kube.KindCluster, netip.MustParseAddr(a.Spec.ClusterIP))
	e.waitFarm(aFarm, hasBackends(2))
	aAddr := netip.AddrPortFrom(netip.MustParseAddr(a.Spec.ClusterIP), 80)

	// 1. A value no farm field accepts: the defaults serve.
	e.annotate("a", map[string]string{"xlb.io/mode": "fast"})
	ev := e.waitEvent("a", kube.ReasonInvalidAnnotation)
	for _, w := range []string{"xlb.io/mode", "fast", "snat, dnat", "serving with the defaults"} {
		if !strings.Contains(ev.Message, w) {
			t.Errorf("event message %q does not say %q", ev.Message, w)
		}
	}
	// The endpoint change of the Service is applied: b1 (a deleted Pod, in
	// a cluster) gets no more traffic.
	e.setEndpoints("a", false, ready(0, 2))
	e.waitFarm(aFarm, func(f *model.Farm) bool {
		return len(f.Backends) == 2 && f.Backends[1].Addr == e.Backends[2].IPv4 && f.Mode == model.ModeDNAT
	})
	if got := e.spread(aAddr, false, 10); keys(got) != "b0,b2" {
		t.Errorf("service a with an invalid annotation, after the endpoint change: answers %v, want b0,b2", got)
	}

	// 2. A new Service with a bad annotation is served with the defaults.
	bs := service("b", corev1.ServiceTypeClusterIP)
	bs.Annotations = map[string]string{"service.kubernetes.io/kube-nftlb-load-balancer-scheduler": "fastest"}
	b := e.createService(bs)
	e.setEndpoints("b", false, ready(1))
	bFarm := kube.FarmName(e.ns, "b", "tcp", kube.KindCluster, netip.MustParseAddr(b.Spec.ClusterIP))
	e.waitFarm(bFarm, hasBackends(1))
	if got := e.spread(netip.AddrPortFrom(netip.MustParseAddr(b.Spec.ClusterIP), 80), false, 4); keys(got) != "b1" {
		t.Errorf("new service b with a bad annotation: answers %v, want b1", got)
	}
	if ev := e.waitEvent("b", kube.ReasonInvalidAnnotation); !strings.Contains(ev.Message, "fastest") {
		t.Errorf("service b's event %q does not name the value", ev.Message)
	}

	// 3. Values that parse but make a farm the engine refuses: the
	// defaults serve, and endpoints are followed.
	e.annotate("a", map[string]string{"xlb.io/scheduler": "hash", "xlb.io/sched-param": "none"})
	ev = e.waitEvent("a", kube.ReasonRejected)
	if !strings.Contains(ev.Message, "sched-param") || !strings.Contains(ev.Message, "serving with the defaults") {
		t.Errorf("event message %q does not name sched-param and the fallback", ev.Message)
	}
	e.setEndpoints("a", false, ready(0))
	e.waitFarm(aFarm, func(f *model.Farm) bool { return len(f.Backends) == 1 && f.Scheduler == model.SchedRR })
	if got := e.spread(aAddr, false, 6); keys(got) != "b0" {
		t.Errorf("service a with refused annotations: answers %v, want b0", got)
	}

	// 4. Fixed: the annotation applies.
	e.annotate("a", map[string]string{"xlb.io/mode": "snat"})
	e.waitFarm(aFarm, func(f *model.Farm) bool { return f.Mode == model.ModeSNAT && len(f.Backends) == 1 })
	e.waitEvent("a", kube.ReasonSynced)
	reply, err := testutil.AskTCP(e.Client.NS, aAddr)
	if err != nil {
		t.Fatal(err)
	}
	if name, from, _ := testutil.ParseReply(reply); name != "b0" || from.Addr() != e.LBBack4 {
		t.Errorf("service a after the fix: %q, want b0 seeing the LB's %s (snat)", reply, e.LBBack4)
	}
}

// annotate replaces a Service's annotations.
func (e *env) annotate(name string, ann map[string]string) {
	e.t.Helper()
	svcs := e.client.CoreV1().Services(e.ns)
	s, err := svcs.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	s.Annotations = ann
	if _, err := svcs.Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("annotate %s: %v", name, err)
	}
}

// waitEvent waits for an Event with that reason on Service name.
func (e *env) waitEvent(name, reason string) corev1.Event {
	e.t.Helper()
	var found corev1.Event
	sel := fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", name),
		fields.OneTermEqualSelector("reason", reason)).String()
	e.waitFor("event "+reason+" on service "+name, func() bool {
		l, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil || len(l.Items) == 0 {
			return false
		}
		found = l.Items[len(l.Items)-1]
		return true
	})
	if found.Type == "" || found.InvolvedObject.Kind != "Service" {
		e.t.Errorf("event %+v", found)
	}
	_ = time.Second
	return found
}

// TestUDPStaleConntrack: a UDP client that keeps its source port stays on
// its endpoint through conntrack; when that endpoint is removed, its
// conntrack entry is deleted, so the next datagram goes to a remaining
// endpoint instead of the removed one.
func TestUDPStaleConntrack(t *testing.T) { udpStale(t, "nft") }

// TestEBPFUDPStaleFlows is TestUDPStaleConntrack on the ebpf data plane,
// whose own conntrack table holds the flows.
func TestEBPFUDPStaleFlows(t *testing.T) { udpStale(t, "ebpf") }

func udpStale(t *testing.T, plane string) {
	e := newWorld(t, 2)
	e.startController(plane)
	e.startServers()
	svc := e.createService(service("dns", corev1.ServiceTypeClusterIP))
	e.setEndpoints("dns", false, ready(0, 1))
	cip := netip.MustParseAddr(svc.Spec.ClusterIP)
	e.waitFarm(kube.FarmName(e.ns, "dns", "udp", kube.KindCluster, cip), hasBackends(2))
	to := netip.AddrPortFrom(cip, 80)
	from := netip.AddrPortFrom(e.Client.IPv4, 40000)
	ask := func() string {
		got, err := testutil.AskUDPFrom(e.Client.NS, from, to)
		if err != nil {
			t.Fatalf("udp from %s to %s: %v", from, to, err)
		}
		name, _, _ := testutil.ParseReply(got)
		return name
	}
	first := ask()
	for range 3 {
		if got := ask(); got != first {
			t.Fatalf("same source port answered by %s then %s: conntrack should keep the flow on one endpoint", first, got)
		}
	}
	keep := 1
	if first == "b1" {
		keep = 0
	}
	e.setEndpoints("dns", false, ready(keep))
	e.waitFarm(kube.FarmName(e.ns, "dns", "udp", kube.KindCluster, cip), hasBackends(1))
	// The entry is deleted right after the farm is applied. Without the
	// deletion every datagram would refresh it (UDP timeout 30 s), so the
	// removed endpoint would keep answering for as long as we ask.
	//
	// One datagram may be lost on the way: when the entry is deleted while
	// the removed endpoint's answer is in flight, the answer finds no entry
	// to reverse the NAT and the client's connected socket drops it. UDP
	// promises no more than that, and kube-proxy behaves the same; what must
	// not happen is the removed endpoint answering on.
	want := "b" + strconv.Itoa(keep)
	deadline := time.Now().Add(3 * time.Second)
	lost := 0
	for {
		got, err := testutil.AskUDPWithin(e.Client.NS, from, to, time.Second)
		if err == nil {
			got, _, _ = testutil.ParseReply(got)
		} else if lost++; lost > 1 {
			t.Fatalf("udp from %s to %s after removing %s: %v (%d datagrams lost)", from, to, first, err, lost)
		}
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("3s after removing %s it still answers (%q): stale conntrack entry not deleted", first, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLoadBalancerLocal: a LoadBalancer Service with externalTrafficPolicy
// Local is served on its status IP by this node's endpoints only, keeping
// the client's address, and its healthCheckNodePort answers 200 with the
// local endpoint count while there are local endpoints and 503 when there
// are none.
func TestLoadBalancerLocal(t *testing.T) {
	e := newEnv(t, 2)
	e.startServers()
	s := service("lb", corev1.ServiceTypeLoadBalancer)
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc := e.createService(s)
	if svc.Spec.HealthCheckNodePort == 0 {
		t.Fatal("the API server allocated no healthCheckNodePort")
	}
	lbIP := testutil.VIP4(50)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP.String()}}
	if _, err := e.client.CoreV1().Services(e.ns).UpdateStatus(e.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.setEndpoints("lb", false, []endpoint{{backend: 0, ready: true, serving: true}, {backend: 1, ready: true, serving: true, otherNode: true}})
	e.waitFarm(kube.FarmName(e.ns, "lb", "tcp", kube.KindLB, lbIP), hasBackends(1))
	if got := e.spread(netip.AddrPortFrom(lbIP, 80), false, 6); keys(got) != "b0" {
		t.Errorf("load balancer IP (Local): answers %v, want only the local b0", got)
	}
	reply, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(lbIP, 80))
	if err != nil {
		t.Fatal(err)
	}
	if _, from, _ := testutil.ParseReply(reply); from.Addr() != e.Client.IPv4 {
		t.Errorf("load balancer IP (Local): backend saw %s, want the client's %s", from, e.Client.IPv4)
	}

	hc := fmt.Sprintf("http://%s/", netip.AddrPortFrom(e.LB.IPv4, uint16(svc.Spec.HealthCheckNodePort)))
	check := func(wantCode int, wantLocal string) {
		t.Helper()
		e.waitFor(fmt.Sprintf("health check %d %s", wantCode, wantLocal), func() bool {
			resp, err := testutil.HTTPClient(e.Client.NS).Get(hc)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == wantCode && strings.Contains(string(b), `"localEndpoints":`+wantLocal)
		})
	}
	check(200, "1")
	e.setEndpoints("lb", false, []endpoint{{backend: 1, ready: true, serving: true, otherNode: true}})
	check(503, "0")
}
