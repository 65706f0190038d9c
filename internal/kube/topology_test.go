package kube

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// tep is an endpoint of a topology case, in kube-proxy's terms.
type tep struct {
	addr                        string
	zones, nodes                []string
	ready, serving, terminating bool
	local                       bool
}

// TestCategorizeEndpoints ports kube-proxy's TestCategorizeEndpoints
// (kubernetes pkg/proxy/topology_test.go, v1.37.2), case by case: the
// endpoints a Cluster-policy farm takes (cluster) and a Local-policy farm
// takes (local). nil means the Service uses no farm of that policy
// (kube-proxy's UsesClusterEndpoints / UsesLocalEndpoints); the
// allReachableEndpoints and hasAnyEndpoints results are not ported (xlb
// keeps no per-Service union of the two). The case "PreferSameNode falls
// back to same-zone when feature gate disabled" is left out: the gate is
// GA and locked on in 1.37.
func TestCategorizeEndpoints(t *testing.T) {
	a := []string{"zone-a"}
	cases := []struct {
		name               string
		nodeName, zone     string
		itpLocal, etpLocal bool
		nodePort           bool // externally accessible
		eps                []tep
		cluster, local     []string
	}{{
		name: "should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone",
		zone: "zone-a",
		eps: []tep{
			{addr: "10.1.2.3", zones: a, ready: true}, {addr: "10.1.2.4", zones: []string{"zone-b"}, ready: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, ready: true}, {addr: "10.1.2.6", zones: a, ready: true}},
		cluster: []string{"10.1.2.3", "10.1.2.6"},
	}, {
		name: "externalTrafficPolicy: Local, topology ignored for Local endpoints",
		zone: "zone-a", etpLocal: true, nodePort: true,
		eps: []tep{
			{addr: "10.1.2.3", zones: a, ready: true, local: true}, {addr: "10.1.2.4", zones: []string{"zone-b"}, ready: true, local: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, ready: true}, {addr: "10.1.2.6", zones: a, ready: true}},
		cluster: []string{"10.1.2.3", "10.1.2.6"},
		local:   []string{"10.1.2.3", "10.1.2.4"},
	}, {
		name: "internalTrafficPolicy: Local, topology ignored for Local endpoints",
		zone: "zone-a", itpLocal: true, nodePort: true,
		eps: []tep{
			{addr: "10.1.2.3", zones: a, ready: true, local: true}, {addr: "10.1.2.4", zones: []string{"zone-b"}, ready: true, local: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, ready: true}, {addr: "10.1.2.6", zones: a, ready: true}},
		cluster: []string{"10.1.2.3", "10.1.2.6"},
		local:   []string{"10.1.2.3", "10.1.2.4"},
	}, {
		name:    "empty node labels",
		eps:     []tep{{addr: "10.1.2.3", zones: a, ready: true}},
		cluster: []string{"10.1.2.3"},
	}, {
		name: "node in different zone, no endpoint filtering",
		zone: "zone-b", eps: []tep{{addr: "10.1.2.3", zones: a, ready: true}},
		cluster: []string{"10.1.2.3"},
	}, {
		name: "unready endpoint",
		zone: "zone-a",
		eps: []tep{
			{addr: "10.1.2.3", zones: a, ready: true}, {addr: "10.1.2.4", zones: []string{"zone-b"}, ready: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, ready: true}, {addr: "10.1.2.6", zones: a}},
		cluster: []string{"10.1.2.3"},
	}, {
		name: "only unready endpoints in same zone (should not filter)",
		zone: "zone-a",
		eps: []tep{
			{addr: "10.1.2.3", zones: a}, {addr: "10.1.2.4", zones: []string{"zone-b"}, ready: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, ready: true}, {addr: "10.1.2.6", zones: a}},
		cluster: []string{"10.1.2.4", "10.1.2.5"},
	}, {
		name: "missing hints, no filtering applied",
		zone: "zone-a",
		eps: []tep{
			{addr: "10.1.2.3", zones: a, ready: true}, {addr: "10.1.2.4", zones: []string{"zone-b"}, ready: true},
			{addr: "10.1.2.5", ready: true}, {addr: "10.1.2.6", zones: a, ready: true}},
		cluster: []string{"10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6"},
	}, {
		name: "multiple hints per endpoint, filtering includes any endpoint with zone included",
		zone: "zone-c",
		eps: []tep{
			{addr: "10.1.2.3", zones: []string{"zone-a", "zone-b", "zone-c"}, ready: true},
			{addr: "10.1.2.4", zones: []string{"zone-b", "zone-c"}, ready: true},
			{addr: "10.1.2.5", zones: []string{"zone-b", "zone-d"}, ready: true},
			{addr: "10.1.2.6", zones: []string{"zone-c"}, ready: true}},
		cluster: []string{"10.1.2.3", "10.1.2.4", "10.1.2.6"},
	}, {
		name:     "PreferSameNode available",
		nodeName: "node-1", zone: "zone-a",
		eps: []tep{
			{addr: "10.1.2.3", zones: a, nodes: []string{"node-1"}, ready: true},
			{addr: "10.1.2.4", zones: []string{"zone-b"}, nodes: []string{"node-2"}, ready: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, nodes: []string{"node-3"}, ready: true},
			{addr: "10.1.2.6", zones: a, nodes: []string{"node-4"}, ready: true}},
		cluster: []string{"10.1.2.3"},
	}, {
		name:     "PreferSameNode ignored if some endpoints unhinted",
		nodeName: "node-1", zone: "zone-a",
		eps: []tep{
			{addr: "10.1.2.3", zones: a, nodes: []string{"node-1"}, ready: true},
			{addr: "10.1.2.4", ready: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, nodes: []string{"node-3"}, ready: true},
			{addr: "10.1.2.6", zones: a, nodes: []string{"node-4"}, ready: true}},
		cluster: []string{"10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6"},
	}, {
		name:     "PreferSameNode falls back to PreferSameZone if no endpoint for node",
		nodeName: "node-0", zone: "zone-a",
		eps: []tep{
			{addr: "10.1.2.3", zones: a, nodes: []string{"node-1"}, ready: true},
			{addr: "10.1.2.4", zones: []string{"zone-b"}, nodes: []string{"node-2"}, ready: true},
			{addr: "10.1.2.5", zones: []string{"zone-c"}, nodes: []string{"node-3"}, ready: true},
			{addr: "10.1.2.6", zones: a, nodes: []string{"node-4"}, ready: true}},
		cluster: []string{"10.1.2.3", "10.1.2.6"},
	}, {
		name: "conflicting topology and localness require merging allEndpoints",
		zone: "zone-a", etpLocal: true, nodePort: true,
		eps: []tep{
			{addr: "10.0.0.0", zones: a, ready: true, local: true}, {addr: "10.0.0.1", zones: []string{"zone-b"}, ready: true, local: true},
			{addr: "10.0.0.2", zones: a, ready: true}, {addr: "10.0.0.3", zones: []string{"zone-b"}, ready: true}},
		cluster: []string{"10.0.0.0", "10.0.0.2"},
		local:   []string{"10.0.0.0", "10.0.0.1"},
	}, {
		name:     "internalTrafficPolicy: Local, with empty endpoints",
		itpLocal: true,
		local:    []string{},
	}, {
		name:     "internalTrafficPolicy: Local, but all endpoints are remote",
		itpLocal: true,
		eps:      []tep{{addr: "10.0.0.0", ready: true}, {addr: "10.0.0.1", ready: true}},
		local:    []string{},
	}, {
		name:     "internalTrafficPolicy: Local, all endpoints are local",
		itpLocal: true,
		eps:      []tep{{addr: "10.0.0.0", ready: true, local: true}, {addr: "10.0.0.1", ready: true, local: true}},
		local:    []string{"10.0.0.0", "10.0.0.1"},
	}, {
		name:     "internalTrafficPolicy: Local, some endpoints are local",
		itpLocal: true,
		eps:      []tep{{addr: "10.0.0.0", ready: true, local: true}, {addr: "10.0.0.1", ready: true}},
		local:    []string{"10.0.0.0"},
	}, {
		name:    "Cluster traffic policy, endpoints not Ready",
		eps:     []tep{{addr: "10.0.0.0"}, {addr: "10.0.0.1"}},
		cluster: []string{},
	}, {
		name:    "Cluster traffic policy, some endpoints are Ready",
		eps:     []tep{{addr: "10.0.0.0"}, {addr: "10.0.0.1", ready: true}},
		cluster: []string{"10.0.0.1"},
	}, {
		name: "Cluster traffic policy, all endpoints are terminating",
		eps: []tep{
			{addr: "10.0.0.0", serving: true, terminating: true, local: true},
			{addr: "10.0.0.1", serving: true, terminating: true}},
		cluster: []string{"10.0.0.0", "10.0.0.1"},
	}, {
		name:     "iTP: Local, eTP: Cluster, some endpoints local",
		itpLocal: true, nodePort: true,
		eps:     []tep{{addr: "10.0.0.0", ready: true, local: true}, {addr: "10.0.0.1", ready: true}},
		cluster: []string{"10.0.0.0", "10.0.0.1"},
		local:   []string{"10.0.0.0"},
	}, {
		name:     "iTP: Cluster, eTP: Local, some endpoints local",
		etpLocal: true, nodePort: true,
		eps:     []tep{{addr: "10.0.0.0", ready: true, local: true}, {addr: "10.0.0.1", ready: true}},
		cluster: []string{"10.0.0.0", "10.0.0.1"},
		local:   []string{"10.0.0.0"},
	}, {
		name:     "iTP: Local, eTP: Local, some endpoints local",
		itpLocal: true, etpLocal: true, nodePort: true,
		eps:     []tep{{addr: "10.0.0.0", ready: true, local: true}, {addr: "10.0.0.1", ready: true}},
		cluster: []string{"10.0.0.0", "10.0.0.1"},
		local:   []string{"10.0.0.0"},
	}, {
		name:     "iTP: Local, eTP: Local, all endpoints remote",
		itpLocal: true, etpLocal: true, nodePort: true,
		eps:     []tep{{addr: "10.0.0.0", ready: true}, {addr: "10.0.0.1", ready: true}},
		cluster: []string{"10.0.0.0", "10.0.0.1"},
		local:   []string{},
	}, {
		name:     "iTP: Local, eTP: Local, all endpoints remote and terminating",
		itpLocal: true, etpLocal: true, nodePort: true,
		eps: []tep{
			{addr: "10.0.0.0", serving: true, terminating: true},
			{addr: "10.0.0.1", serving: true, terminating: true}},
		cluster: []string{"10.0.0.0", "10.0.0.1"},
		local:   []string{},
	}, {
		name:     "iTP: Cluster, eTP: Local, with terminating endpoints",
		etpLocal: true, nodePort: true,
		eps: []tep{
			{addr: "10.0.0.0", ready: true},
			{addr: "10.0.0.1", local: true},
			{addr: "10.0.0.2", serving: true, terminating: true, local: true},
			{addr: "10.0.0.3", serving: true, terminating: true}},
		cluster: []string{"10.0.0.0"},
		local:   []string{"10.0.0.2"},
	}, {
		name:     "externalTrafficPolicy ignored if not externally accessible",
		etpLocal: true,
		eps:      []tep{{addr: "10.0.0.0", ready: true}, {addr: "10.0.0.1", ready: true, local: true}},
		cluster:  []string{"10.0.0.0", "10.0.0.1"},
	}, {
		name:     "no cluster endpoints for iTP:Local internal-only service",
		itpLocal: true,
		eps:      []tep{{addr: "10.0.0.0", ready: true}, {addr: "10.0.0.1", ready: true, local: true}},
		local:    []string{"10.0.0.1"},
	}, {
		name:    "empty endpoints when no service endpoints exist",
		cluster: []string{},
	}, {
		name:    "single endpoint not ready, not serving, not terminating",
		zone:    "zone-a",
		eps:     []tep{{addr: "10.0.0.0", terminating: false}},
		cluster: []string{},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var eps []endpoint
			for _, e := range tc.eps {
				eps = append(eps, endpoint{addr: netip.MustParseAddr(e.addr), port: 80, ready: e.ready,
					serving: e.serving || e.ready, terminating: e.terminating, local: e.local,
					zoneHints: e.zones, nodeHints: e.nodes})
			}
			// kube-proxy's UsesClusterEndpoints / UsesLocalEndpoints:
			// the farms this Service has on the node, by policy.
			usesCluster := !tc.itpLocal || tc.nodePort
			usesLocal := tc.itpLocal || (tc.etpLocal && tc.nodePort)
			check := func(what string, uses bool, got []endpoint, want []string) {
				t.Helper()
				if !uses {
					if want != nil {
						t.Fatalf("%s: the case expects %v but the Service uses no such farm", what, want)
					}
					return
				}
				names := []string{}
				for _, e := range got {
					names = append(names, e.addr.String())
				}
				slices.Sort(names)
				if want == nil {
					want = []string{}
				}
				if !slices.Equal(names, want) {
					t.Errorf("%s endpoints %v, want %v", what, names, want)
				}
			}
			check("cluster", usesCluster, clusterEndpoints(eps, tc.nodeName, tc.zone), tc.cluster)
			check("local", usesLocal, localEndpoints(eps), tc.local)
		})
	}
}

// TestTopologyFarms checks the hints as the translation reads them from
// EndpointSlices into farms: the cluster IP farm of a Service whose slice
// carries zone hints (what the EndpointSlice controller writes for
// trafficDistribution: PreferClose) takes the endpoints of this node's
// zone; an endpoint listed twice merges its hints; externalTrafficPolicy
// Local ignores the hints; the node without a zone label takes every
// endpoint.
func TestTopologyFarms(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			TrafficDistribution:   ptr.To(corev1.ServiceTrafficDistributionPreferClose),
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}},
		},
	}
	ep := func(addr, node, zone string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr.To(node), Zone: ptr.To(zone),
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-1"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			ep("10.244.0.1", "n1", "zone-a"), ep("10.244.0.2", "n2", "zone-b"), ep("10.244.0.3", "n3", "zone-a"),
		},
	}
	// The same endpoint in a second slice, hinted for zone-b too (a
	// slice being rewritten): it counts once, with both hints.
	slice2 := slice.DeepCopy()
	slice2.Name = "web-2"
	slice2.Endpoints = []discoveryv1.Endpoint{ep("10.244.0.2", "n2", "zone-c")}
	backendsOf := func(zone string) (cluster, node string) {
		t.Helper()
		farms, err := Farms(svc, []*discoveryv1.EndpointSlice{slice, slice2},
			Node{Name: "n2", Zone: zone, Addrs: []netip.Addr{netip.MustParseAddr("192.168.0.2")}})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range farms {
			var names []string
			for _, b := range f.Backends {
				names = append(names, b.Addr.String())
			}
			if strings.Contains(f.Name, ".cluster-") {
				cluster = strings.Join(names, ",")
			} else {
				node = strings.Join(names, ",")
			}
		}
		return cluster, node
	}
	for _, tc := range []struct{ zone, cluster, node string }{
		{"zone-a", "10.244.0.1,10.244.0.3", "10.244.0.2"},
		{"zone-c", "10.244.0.2", "10.244.0.2"},
		{"zone-x", "10.244.0.1,10.244.0.2,10.244.0.3", "10.244.0.2"}, // no hint for it: all
		{"", "10.244.0.1,10.244.0.2,10.244.0.3", "10.244.0.2"},       // no zone label: all
	} {
		cluster, node := backendsOf(tc.zone)
		if cluster != tc.cluster || node != tc.node {
			t.Errorf("zone %q: cluster farm %s, node farm %s; want %s and %s", tc.zone, cluster, node, tc.cluster, tc.node)
		}
	}
}
