package kube

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestSourceRanges: the allow list holds the ranges (and the load balancer
// IPs when a range holds a node address), and only the lb farms of a
// family the ranges name attach it, as kube-proxy's per-family proxiers.
func TestSourceRanges(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec:   corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerSourceRanges: []string{"192.168.0.0/16", " 10.0.0.0/8"}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}, {IP: "2001:db8::1"}}}}}
	node := Node{Name: "n", Addrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}
	sr, err := parseSourceRanges(svc, node)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range sr.entries {
		keys = append(keys, e.Key)
	}
	if want := []string{"192.168.0.0/16", "10.0.0.0/8", "198.51.100.1/32", "2001:db8::1/128"}; !slices.Equal(keys, want) {
		t.Errorf("entries %v, want %v (the ranges, then the LB IPs: a range holds the node)", keys, want)
	}
	if sr.table.Verdict != model.ListAllow || sr.table.Name != "ns.web.lb-source-ranges" {
		t.Errorf("table %+v", sr.table)
	}

	// Without the node in a range: IPv4 only, so the IPv6 lb farm is
	// not filtered; cluster and node farms never are.
	node.Addrs = []netip.Addr{netip.MustParseAddr("172.16.0.1")}
	sr, _ = parseSourceRanges(svc, node)
	mk := func(kind Kind, a string) model.Farm {
		f := model.NewFarm(FarmName("ns", "web", "http", kind, netip.MustParseAddr(a)))
		f.VirtualAddr = netip.MustParseAddr(a)
		return f
	}
	farms := []model.Farm{mk(KindLB, "198.51.100.1"), mk(KindLB, "2001:db8::1"), mk(KindCluster, "10.96.0.1"), mk(KindNodePort, "172.16.0.1")}
	sr.attach(farms)
	for i, want := range []bool{true, false, false, false} {
		if got := len(farms[i].Policies) > 0; got != want {
			t.Errorf("farm %s: policy %v, want %v", farms[i].Name, got, want)
		}
	}

	// A port named like a kind does not fool the kind test.
	f := model.NewFarm(FarmName("ns", "web", "lb-x", KindCluster, netip.MustParseAddr("10.96.0.1")))
	f.VirtualAddr = netip.MustParseAddr("10.96.0.1")
	if isKind(&f, KindLB) {
		t.Errorf("%s taken for an lb farm", f.Name)
	}

	// Long names are cut and hashed within the table name limit.
	long := SourceRangesTableName(strings.Repeat("n", 63), strings.Repeat("s", 63))
	if len(long) > model.MaxTableNameLen || !strings.HasSuffix(long, sourceRangesSuffix) {
		t.Errorf("long name %q (%d)", long, len(long))
	}

	svc.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"}
	if _, err := parseSourceRanges(svc, node); err == nil || !strings.Contains(err.Error(), "spec.loadBalancerSourceRanges[0]") {
		t.Errorf("bad range: %v", err)
	}
}
