package kube_test

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestEBPFServices runs the controller on the eBPF data plane (xlb kube-proxy
// --dataplane ebpf) and sends real traffic through it: a dual-stack NodePort
// Service is spread round robin over its three endpoints on both cluster
// IPs (TCP and UDP) and on the node's address (masqueraded); a
// sessionAffinity ClientIP Service keeps the client on one endpoint; an
// endpoint removal takes it out; a Service without endpoints refuses new
// connections (TCP and UDP, IPv4 and IPv6); a Service with an SCTP port,
// which the eBPF plane does not implement, gets an XLBRejected Event and
// its TCP port served, while the others keep working; and deleting a
// Service stops its traffic.
func TestEBPFServices(t *testing.T) {
	e := newWorld(t, 3)
	e.startController("ebpf")
	e.startServers()

	s := service("web", corev1.ServiceTypeNodePort)
	pol := corev1.IPFamilyPolicyRequireDualStack
	s.Spec.IPFamilyPolicy = &pol
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	svc := e.createService(s)
	cip4, cip6 := netip.MustParseAddr(svc.Spec.ClusterIPs[0]), netip.MustParseAddr(svc.Spec.ClusterIPs[1])
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	e.setEndpoints("web", false, ready(0, 1, 2))
	e.setEndpoints("web", true, ready(0, 1, 2))
	clusterFarm := kube.FarmName(e.ns, "web", "tcp", kube.KindCluster, cip4)
	e.waitFarm(clusterFarm, hasBackends(3))
	e.waitFarm(kube.FarmName(e.ns, "web", "udp", kube.KindCluster, cip4), hasBackends(3))
	e.waitFarm(kube.FarmName(e.ns, "web", "tcp", kube.KindCluster, cip6), hasBackends(3))
	e.waitFarm(kube.FarmName(e.ns, "web", "tcp", kube.KindNodePort, e.LB.IPv4), hasBackends(3))

	for _, c := range []struct {
		what string
		addr netip.AddrPort
		udp  bool
	}{
		{"cluster IP tcp", netip.AddrPortFrom(cip4, 80), false},
		{"cluster IP udp", netip.AddrPortFrom(cip4, 80), true},
		{"ipv6 cluster IP tcp", netip.AddrPortFrom(cip6, 80), false},
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
	// Cluster IP traffic keeps the client's address (dnat); NodePort
	// traffic is masqueraded (snat: externalTrafficPolicy Cluster).
	for _, c := range []struct {
		addr netip.AddrPort
		want netip.Addr
	}{
		{netip.AddrPortFrom(cip4, 80), e.Client.IPv4},
		{netip.AddrPortFrom(e.LB.IPv4, nodePort), e.LBBack4},
	} {
		reply, err := testutil.AskTCP(e.Client.NS, c.addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, from, _ := testutil.ParseReply(reply); from.Addr() != c.want {
			t.Errorf("%s: backend saw %s, want %s", c.addr, from, c.want)
		}
	}

	// Session affinity: every connection of the client to one endpoint.
	a := service("sticky", corev1.ServiceTypeClusterIP)
	a.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	a.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	asvc := e.createService(a)
	e.setEndpoints("sticky", false, ready(0, 1, 2))
	acip := netip.MustParseAddr(asvc.Spec.ClusterIP)
	e.waitFarm(kube.FarmName(e.ns, "sticky", "tcp", kube.KindCluster, acip), hasBackends(3))
	if got := e.spread(netip.AddrPortFrom(acip, 80), false, 12); len(got) != 1 {
		t.Errorf("sessionAffinity ClientIP: answers %v, want one endpoint for every connection", got)
	}

	// Endpoint removal.
	e.setEndpoints("web", false, ready(0, 2))
	e.waitFarm(clusterFarm, hasBackends(2))
	if got := e.spread(netip.AddrPortFrom(cip4, 80), false, 20); keys(got) != "b0,b2" {
		t.Errorf("after removing b1: answers %v", got)
	}

	// No endpoints: new connections are refused at once (ICMP port
	// unreachable from the cluster IP), TCP and UDP, IPv4 and IPv6.
	es := service("empty", corev1.ServiceTypeClusterIP)
	es.Spec.IPFamilyPolicy = &pol
	es.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	empty := e.createService(es)
	for _, ip := range empty.Spec.ClusterIPs {
		ecip := netip.MustParseAddr(ip)
		e.waitFarm(kube.FarmName(e.ns, "empty", "tcp", kube.KindCluster, ecip), hasBackends(0))
		e.waitFarm(kube.FarmName(e.ns, "empty", "udp", kube.KindCluster, ecip), hasBackends(0))
		to := netip.AddrPortFrom(ecip, 80)
		start := time.Now()
		if c, err := testutil.DialTCP(e.Client.NS, to, 2*time.Second); err == nil {
			c.Close()
			t.Errorf("%s without endpoints accepted a connection", to)
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("tcp %s without endpoints: %v after %s, want connection refused", to, err, time.Since(start).Round(time.Millisecond))
		}
		if got, err := testutil.AskUDP(e.Client.NS, to); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("udp %s without endpoints: %q, %v; want connection refused", to, got, err)
		}
	}

	// SCTP is not implemented by the eBPF plane: the SCTP port gets no
	// farm and the Service an Event; its TCP port is served, and the
	// other Services are unaffected.
	sc := service("sctp", corev1.ServiceTypeClusterIP)
	sc.Spec.Ports = []corev1.ServicePort{{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "sctp", Port: 81, Protocol: corev1.ProtocolSCTP}}
	scs := e.createService(sc)
	e.setEndpoints("sctp", false, ready(1))
	ev := e.waitEvent("sctp", kube.ReasonRejected)
	if !strings.Contains(ev.Message, "protocol") || !strings.Contains(ev.Message, "ebpf") {
		t.Errorf("event message %q does not name the protocol and the ebpf plane", ev.Message)
	}
	sccip := netip.MustParseAddr(scs.Spec.ClusterIP)
	e.waitFarm(kube.FarmName(e.ns, "sctp", "tcp", kube.KindCluster, sccip), hasBackends(1))
	if _, ok := e.eng.Snapshot().Farm(kube.FarmName(e.ns, "sctp", "sctp", kube.KindCluster, sccip)); ok {
		t.Errorf("the SCTP port has a farm on the ebpf plane")
	}
	if got := e.spread(netip.AddrPortFrom(sccip, 80), false, 3); keys(got) != "b1" {
		t.Errorf("the TCP port of the Service with an SCTP port: answers %v, want b1", got)
	}
	if got := e.spread(netip.AddrPortFrom(cip4, 80), false, 4); keys(got) != "b0,b2" {
		t.Errorf("web after the SCTP port was refused: answers %v", got)
	}

	// Deleting the Service removes its farms and its traffic.
	if err := e.client.CoreV1().Services(e.ns).Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFarm(clusterFarm, nil)
	if got, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(cip4, 80)); err == nil {
		t.Errorf("deleted Service still answered %q", got)
	}
}
