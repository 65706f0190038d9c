package kube

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/model"
)

func svc(mut ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mut {
		m(s)
	}
	return s
}

type ep struct {
	addr           string
	node           string
	ready, serving *bool
	terminating    *bool
}

func slice(family discoveryv1.AddressType, port int32, portName string, proto corev1.Protocol, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: "web-" + string(family), Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(proto)}},
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating}}
		if e.node != "" {
			x.NodeName = ptr.To(e.node)
		}
		s.Endpoints = append(s.Endpoints, x)
	}
	return s
}

func backendAddrs(f *model.Farm) []string {
	var out []string
	for _, b := range f.Backends {
		out = append(out, netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	return out
}

func farmByName(t *testing.T, farms []model.Farm, name string) *model.Farm {
	t.Helper()
	for i := range farms {
		if farms[i].Name == name {
			return &farms[i]
		}
	}
	var names []string
	for _, f := range farms {
		names = append(names, f.Name)
	}
	t.Fatalf("no farm %q; farms: %v", name, names)
	return nil
}

var node1 = Node{Name: "node1", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}}

func TestFarmsClusterIP(t *testing.T) {
	eps := []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 8080, "http", corev1.ProtocolTCP,
		ep{addr: "10.244.0.2"}, ep{addr: "10.244.0.1", ready: ptr.To(true)}, ep{addr: "10.244.0.3", ready: ptr.To(false)})}
	farms, err := Farms(svc(), eps, node1)
	if err != nil {
		t.Fatal(err)
	}
	if len(farms) != 1 {
		t.Fatalf("got %d farms, want 1", len(farms))
	}
	f := farms[0]
	if f.Name != "shop.web.http.cluster-10.96.0.10" {
		t.Errorf("name %q", f.Name)
	}
	if f.VirtualAddr.String() != "10.96.0.10" || f.VirtualPorts[0] != (model.PortRange{First: 80, Last: 80}) ||
		f.Protocol != model.ProtoTCP || f.Family != model.FamilyIPv4 || f.Mode != model.ModeDNAT || f.Scheduler != model.SchedRR {
		t.Errorf("farm %s", f.AppendJSON(nil))
	}
	// Not ready endpoints are left out; the order is by address.
	if got, want := backendAddrs(&f), []string{"10.244.0.1:8080", "10.244.0.2:8080"}; !slices.Equal(got, want) {
		t.Errorf("backends %v, want %v", got, want)
	}
	if f.Backends[0].Name != "10.244.0.1_8080" {
		t.Errorf("backend name %q", f.Backends[0].Name)
	}
	if err := f.Validate(); err != nil {
		t.Errorf("farm does not validate: %v", err)
	}
}

func TestFarmsTypes(t *testing.T) {
	s := svc(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalIPs = []string{"198.51.100.7"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "203.0.113.9"},
			{IP: "203.0.113.10", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}, // not programmed
			{Hostname: "lb.example"}, // no IP: nothing to program
		}
	})
	eps := []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 8080, "http", corev1.ProtocolTCP, ep{addr: "10.244.0.1"})}
	farms, err := Farms(s, eps, node1)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range farms {
		names = append(names, f.Name)
	}
	want := []string{
		"shop.web.http.cluster-10.96.0.10",
		"shop.web.http.external-198.51.100.7",
		"shop.web.http.lb-203.0.113.9",
		"shop.web.http.node-192.0.2.1",
		"shop.web.http.node-2001-db8--1",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("farms %v\nwant %v", names, want)
	}
	if !slices.Equal(FarmNames(s, node1), want) {
		t.Errorf("FarmNames %v, want %v", FarmNames(s, node1), want)
	}
	np := farmByName(t, farms, "shop.web.http.node-192.0.2.1")
	if np.VirtualPorts[0].First != 30080 || np.Mode != model.ModeSNAT || len(np.Backends) != 1 {
		t.Errorf("nodeport farm %s", np.AppendJSON(nil))
	}
	// The IPv6 node address has no IPv6 endpoints: a farm without backends.
	np6 := farmByName(t, farms, "shop.web.http.node-2001-db8--1")
	if np6.Family != model.FamilyIPv6 || len(np6.Backends) != 0 {
		t.Errorf("ipv6 nodeport farm %s", np6.AppendJSON(nil))
	}
	for _, n := range want[1:3] {
		f := farmByName(t, farms, n)
		if f.VirtualPorts[0].First != 80 || f.Mode != model.ModeSNAT {
			t.Errorf("farm %s", f.AppendJSON(nil))
		}
	}
	for i := range farms {
		if err := farms[i].Validate(); err != nil {
			t.Errorf("%v", err)
		}
	}
	// ClusterIP Services have no NodePort farms even if a nodePort is set;
	// ExternalName and headless Services have no farms at all.
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.ExternalIPs = nil
	if got := FarmNames(s, node1); !slices.Equal(got, want[:1]) {
		t.Errorf("ClusterIP Service farms %v", got)
	}
	s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"}
	if got := FarmNames(s, node1); len(got) != 0 {
		t.Errorf("headless Service farms %v", got)
	}
	s.Spec.Type = corev1.ServiceTypeExternalName
	if got := FarmNames(s, node1); len(got) != 0 {
		t.Errorf("ExternalName Service farms %v", got)
	}
}

func TestFarmsProtocolsAndPorts(t *testing.T) {
	s := svc(func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
			{Name: "sig", Port: 3868, Protocol: corev1.ProtocolSCTP},
		}
	})
	eps := []*discoveryv1.EndpointSlice{{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: "a"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: ptr.To(corev1.ProtocolUDP)},
			{Name: ptr.To("dns-tcp"), Port: ptr.To[int32](5354), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("sig"), Port: ptr.To[int32](3869), Protocol: ptr.To(corev1.ProtocolSCTP)},
		},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.1"}}},
	}}
	farms, err := Farms(s, eps, node1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		proto   model.Protocol
		backend string
	}{
		{"shop.web.dns.cluster-10.96.0.10", model.ProtoUDP, "10.244.0.1:5353"},
		{"shop.web.dns-tcp.cluster-10.96.0.10", model.ProtoTCP, "10.244.0.1:5354"},
		{"shop.web.sig.cluster-10.96.0.10", model.ProtoSCTP, "10.244.0.1:3869"},
	} {
		f := farmByName(t, farms, c.name)
		if f.Protocol != c.proto || !slices.Equal(backendAddrs(f), []string{c.backend}) {
			t.Errorf("%s: protocol %s backends %v, want %s %s", c.name, f.Protocol, backendAddrs(f), c.proto, c.backend)
		}
	}
	// An unnamed single port is named by its number.
	s = svc(func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Port: 443, Protocol: corev1.ProtocolTCP}}
	})
	if got := FarmNames(s, node1); !slices.Equal(got, []string{"shop.web.443.cluster-10.96.0.10"}) {
		t.Errorf("unnamed port: %v", got)
	}
}

func TestFarmsDualStack(t *testing.T) {
	s := svc(func(s *corev1.Service) {
		s.Spec.ClusterIPs = []string{"fd00:96::a", "10.96.0.10"}
		s.Spec.ClusterIP = "fd00:96::a"
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	})
	eps := []*discoveryv1.EndpointSlice{
		slice(discoveryv1.AddressTypeIPv4, 8080, "http", corev1.ProtocolTCP, ep{addr: "10.244.0.1"}),
		slice(discoveryv1.AddressTypeIPv6, 8080, "http", corev1.ProtocolTCP, ep{addr: "fd00:244::1"}, ep{addr: "fd00:244::2"}),
	}
	farms, err := Farms(s, eps, node1)
	if err != nil {
		t.Fatal(err)
	}
	f6 := farmByName(t, farms, "shop.web.http.cluster-fd00-96--a")
	f4 := farmByName(t, farms, "shop.web.http.cluster-10.96.0.10")
	if f6.Family != model.FamilyIPv6 || !slices.Equal(backendAddrs(f6), []string{"[fd00:244::1]:8080", "[fd00:244::2]:8080"}) {
		t.Errorf("ipv6 farm %s", f6.AppendJSON(nil))
	}
	if f4.Family != model.FamilyIPv4 || !slices.Equal(backendAddrs(f4), []string{"10.244.0.1:8080"}) {
		t.Errorf("ipv4 farm %s", f4.AppendJSON(nil))
	}
	if f6.Backends[0].Name != "fd00-244--1_8080" {
		t.Errorf("ipv6 backend name %q", f6.Backends[0].Name)
	}
	for i := range farms {
		if err := farms[i].Validate(); err != nil {
			t.Error(err)
		}
	}
}

func TestFarmsEndpointConditions(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	for _, c := range []struct {
		name string
		eps  []ep
		want []string
	}{
		{"nil conditions are ready", []ep{{addr: "10.0.0.1"}}, []string{"10.0.0.1:80"}},
		{"not ready left out", []ep{{addr: "10.0.0.1", ready: no, serving: no}}, nil},
		{"terminating only when no ready",
			[]ep{{addr: "10.0.0.1", ready: yes}, {addr: "10.0.0.2", ready: no, serving: yes, terminating: yes}},
			[]string{"10.0.0.1:80"}},
		{"serving terminating used when none ready",
			[]ep{{addr: "10.0.0.1", ready: no, serving: no, terminating: yes}, {addr: "10.0.0.2", ready: no, serving: yes, terminating: yes}},
			[]string{"10.0.0.2:80"}},
		{"nil serving follows ready", []ep{{addr: "10.0.0.3", ready: no, terminating: yes}}, nil},
		{"duplicate across slices counts once", []ep{{addr: "10.0.0.1"}, {addr: "10.0.0.1"}}, []string{"10.0.0.1:80"}},
		{"bad address skipped", []ep{{addr: "pod.example"}, {addr: "10.0.0.4"}}, []string{"10.0.0.4:80"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			farms, err := Farms(svc(), []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 80, "http", corev1.ProtocolTCP, c.eps...)}, node1)
			if err != nil {
				t.Fatal(err)
			}
			if got := backendAddrs(&farms[0]); !slices.Equal(got, c.want) {
				t.Errorf("backends %v, want %v", got, c.want)
			}
		})
	}
	// Slices whose port does not match by name or protocol are ignored.
	for _, s := range []*discoveryv1.EndpointSlice{
		slice(discoveryv1.AddressTypeIPv4, 80, "other", corev1.ProtocolTCP, ep{addr: "10.0.0.1"}),
		slice(discoveryv1.AddressTypeIPv4, 80, "http", corev1.ProtocolUDP, ep{addr: "10.0.0.1"}),
		slice(discoveryv1.AddressTypeFQDN, 80, "http", corev1.ProtocolTCP, ep{addr: "a.example"}),
	} {
		farms, _ := Farms(svc(), []*discoveryv1.EndpointSlice{s}, node1)
		if len(farms[0].Backends) != 0 {
			t.Errorf("slice %v/%v %s gave backends %v", *s.Ports[0].Name, *s.Ports[0].Protocol, s.AddressType, backendAddrs(&farms[0]))
		}
	}
}

func TestFarmsTrafficPolicyLocal(t *testing.T) {
	eps := []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 80, "http", corev1.ProtocolTCP,
		ep{addr: "10.0.0.1", node: "node1"}, ep{addr: "10.0.0.2", node: "node2"},
		ep{addr: "10.0.0.3", node: "node1", ready: ptr.To(false), serving: ptr.To(true), terminating: ptr.To(true)})}
	s := svc(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	farms, err := Farms(s, eps, node1)
	if err != nil {
		t.Fatal(err)
	}
	cl := farmByName(t, farms, "shop.web.http.cluster-10.96.0.10")
	np := farmByName(t, farms, "shop.web.http.node-192.0.2.1")
	if got := backendAddrs(cl); !slices.Equal(got, []string{"10.0.0.1:80", "10.0.0.2:80"}) {
		t.Errorf("cluster farm (internal policy Cluster) backends %v", got)
	}
	if got := backendAddrs(np); !slices.Equal(got, []string{"10.0.0.1:80"}) || np.Mode != model.ModeDNAT {
		t.Errorf("nodeport farm (external policy Local) backends %v mode %s, want only the local ready one and dnat", got, np.Mode)
	}
	s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	farms, _ = Farms(s, eps, Node{Name: "node2", Addrs: node1.Addrs})
	if got := backendAddrs(farmByName(t, farms, "shop.web.http.cluster-10.96.0.10")); !slices.Equal(got, []string{"10.0.0.2:80"}) {
		t.Errorf("cluster farm (internal policy Local) on node2: backends %v", got)
	}
	// On node1 without ready local endpoints, the local terminating one serves.
	eps[0].Endpoints[0].Conditions.Ready = ptr.To(false)
	farms, _ = Farms(s, eps, node1)
	if got := backendAddrs(farmByName(t, farms, "shop.web.http.node-192.0.2.1")); !slices.Equal(got, []string{"10.0.0.3:80"}) {
		t.Errorf("local terminating fallback: backends %v", got)
	}
	// A node without local endpoints: no backends (traffic is not sent
	// elsewhere), and, as the Service has endpoints on other nodes, the
	// drop-all allow list (kube-proxy drops there, rejects only a Service
	// without usable endpoints), on both the node port and (internal
	// policy Local) the cluster farm.
	farms, _ = Farms(s, eps, Node{Name: "node3", Addrs: node1.Addrs})
	dropped := []model.PolicyRef{{Name: DropAllTableName}}
	for _, name := range []string{"shop.web.http.node-192.0.2.1", "shop.web.http.cluster-10.96.0.10"} {
		f := farmByName(t, farms, name)
		if got := backendAddrs(f); len(got) != 0 || !slices.Equal(f.Policies, dropped) {
			t.Errorf("node3 %s: backends %v policies %v, want none and %v", name, got, f.Policies, dropped)
		}
	}
	// Local endpoints: no drop.
	farms, _ = Farms(s, eps, Node{Name: "node2", Addrs: node1.Addrs})
	if f := farmByName(t, farms, "shop.web.http.node-192.0.2.1"); len(f.Policies) != 0 {
		t.Errorf("node2: policies %v, want none", f.Policies)
	}
	// No usable endpoint anywhere: rejected (no policy, no backends).
	for i := range eps[0].Endpoints {
		eps[0].Endpoints[i].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false)}
	}
	farms, _ = Farms(s, eps, Node{Name: "node3", Addrs: node1.Addrs})
	if f := farmByName(t, farms, "shop.web.http.node-192.0.2.1"); len(f.Backends) != 0 || len(f.Policies) != 0 {
		t.Errorf("no usable endpoints: backends %v policies %v, want none", backendAddrs(f), f.Policies)
	}
}

func TestFarmsSessionAffinity(t *testing.T) {
	s := svc(func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP })
	farms, err := Farms(s, nil, node1)
	if err != nil {
		t.Fatal(err)
	}
	if f := farms[0]; f.Persistence != model.KeySrcIP || f.PersistTTL != 10800 {
		t.Errorf("persistence %s ttl %d, want srcip 10800", f.Persistence, f.PersistTTL)
	}
	s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	farms, _ = Farms(s, nil, node1)
	if f := farms[0]; f.Persistence != model.KeySrcIP || f.PersistTTL != 60 {
		t.Errorf("persistence %s ttl %d, want srcip 60", f.Persistence, f.PersistTTL)
	}
}

func TestFarmsAnnotations(t *testing.T) {
	for _, c := range []struct {
		name string
		ann  map[string]string
		chk  func(f *model.Farm) bool
	}{
		{"xlb mode and scheduler", map[string]string{"xlb.io/mode": "snat", "xlb.io/scheduler": "weight"},
			func(f *model.Farm) bool { return f.Mode == model.ModeSNAT && f.Scheduler == model.SchedWeight }},
		{"hash defaults to srcip", map[string]string{"xlb.io/scheduler": "hash"},
			func(f *model.Farm) bool { return f.Scheduler == model.SchedHash && f.SchedParam == model.KeySrcIP }},
		{"hash with keys", map[string]string{"xlb.io/scheduler": "hash", "xlb.io/sched-param": "srcip srcport"},
			func(f *model.Farm) bool { return f.SchedParam == model.KeySrcIP|model.KeySrcPort }},
		{"kube-nftlb hash-srcip", map[string]string{"service.kubernetes.io/kube-nftlb-load-balancer-scheduler": "hash-srcip"},
			func(f *model.Farm) bool { return f.Scheduler == model.SchedHash && f.SchedParam == model.KeySrcIP }},
		{"kube-nftlb hash-srcip-srcport", map[string]string{"service.kubernetes.io/kube-nftlb-load-balancer-scheduler": "hash-srcip-srcport"},
			func(f *model.Farm) bool {
				return f.Scheduler == model.SchedHash && f.SchedParam == model.KeySrcIP|model.KeySrcPort
			}},
		{"stateless mode hashes the flow, affinity by client address", map[string]string{"xlb.io/mode": "stlsdnat"},
			func(f *model.Farm) bool {
				return f.Mode == model.ModeStlsDNAT && f.Scheduler == model.SchedHash && f.SchedParam == model.KeySrcIP && f.Persistence == 0
			}},
		{"dsr keeps an asked scheduler", map[string]string{"xlb.io/mode": "dsr", "xlb.io/scheduler": "maglev", "xlb.io/iface": "cni0"},
			func(f *model.Farm) bool {
				return f.Mode == model.ModeDSR && f.Scheduler == model.SchedMaglev && f.Iface == "cni0"
			}},
		{"helper only on ports of its protocol", map[string]string{"xlb.io/helper": "tftp"},
			func(f *model.Farm) bool { return f.Helper == model.HelperNone }},
		{"maglev", map[string]string{"xlb.io/scheduler": "maglev"},
			func(f *model.Farm) bool { return f.Scheduler == model.SchedMaglev }},
		{"persistence with ttl", map[string]string{"xlb.io/persistence": "srcip-srcport", "xlb.io/persist-ttl": "30"},
			func(f *model.Farm) bool {
				return f.Persistence == model.KeySrcIP|model.KeySrcPort && f.PersistTTL == 30
			}},
		{"helper, log, limit", map[string]string{"xlb.io/helper": "ftp", "xlb.io/log": "forward", "xlb.io/est-connlimit": "100"},
			func(f *model.Farm) bool {
				return f.Helper == model.HelperFTP && f.Log == model.LogForward && f.EstConnLimit == 100
			}},
		{"kube-nftlb keys", map[string]string{
			"service.kubernetes.io/kube-nftlb-load-balancer-mode":          "snat",
			"service.kubernetes.io/kube-nftlb-load-balancer-scheduler":     "hash",
			"service.kubernetes.io/kube-nftlb-load-balancer-sched-param":   "srcip dstport",
			"service.kubernetes.io/kube-nftlb-load-balancer-persistence":   "srcip",
			"service.kubernetes.io/kube-nftlb-load-balancer-helper":        "sip",
			"service.kubernetes.io/kube-nftlb-load-balancer-est-connlimit": "7",
			"service.kubernetes.io/kube-nftlb-load-balancer-log":           "input",
		}, func(f *model.Farm) bool {
			return f.Mode == model.ModeSNAT && f.Scheduler == model.SchedHash && f.SchedParam == model.KeySrcIP|model.KeyDstPort &&
				f.Persistence == model.KeySrcIP && f.Helper == model.HelperSIP && f.EstConnLimit == 7 && f.Log == model.LogInput
		}},
		{"xlb.io wins over kube-nftlb", map[string]string{
			"service.kubernetes.io/kube-nftlb-load-balancer-mode": "dnat",
			"xlb.io/mode": "snat",
		}, func(f *model.Farm) bool { return f.Mode == model.ModeSNAT }},
		{"annotation persistence beats sessionAffinity", map[string]string{"xlb.io/persistence": "none"},
			func(f *model.Farm) bool { return f.Persistence == 0 }},
		{"a health check next to readiness", map[string]string{"xlb.io/check": `{"type":"http","path":"/healthz","inter":"5s"}`},
			func(f *model.Farm) bool {
				c := f.Check
				return c != nil && c.Type == model.CheckHTTP && c.Path == "/healthz" && c.Inter == 5*time.Second
			}},
		{"kube-nftlb had no check annotation", map[string]string{"service.kubernetes.io/kube-nftlb-load-balancer-check": `{"type":"tcp"}`},
			func(f *model.Farm) bool { return f.Check == nil }},
		{"other annotations ignored", map[string]string{"example.com/x": "y", "service.kubernetes.io/kube-nftlb-load-balancer-other": "z"},
			func(f *model.Farm) bool { return f.Mode == model.ModeDNAT }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := svc(func(s *corev1.Service) {
				s.Annotations = c.ann
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			})
			farms, err := Farms(s, nil, node1)
			if err != nil {
				t.Fatal(err)
			}
			if !c.chk(&farms[0]) {
				t.Errorf("farm %s", farms[0].AppendJSON(nil))
			}
		})
	}
}

func TestFarmsInvalidAnnotation(t *testing.T) {
	for _, c := range []struct {
		key, value string
		want       []string // in the error text
	}{
		{"xlb.io/mode", "fast", []string{`"xlb.io/mode"`, `"fast"`, "snat, dnat, dsr, stlsdnat"}},
		{"xlb.io/scheduler", "random", []string{"rr, weight, hash, symhash, maglev"}},
		{"xlb.io/persistence", "cookie", []string{"srcip"}},
		{"xlb.io/est-connlimit", "-1", []string{"whole number"}},
		{"xlb.io/modee", "snat", []string{"unknown xlb.io annotation", "xlb.io/mode"}},
		{"service.kubernetes.io/kube-nftlb-load-balancer-helper", "http", []string{"ftp", "sip"}},
		{"xlb.io/check", `{"type":"icmp"}`, []string{`"xlb.io/check"`, `field "check.type"`, "tcp, http, https"}},
		{"xlb.io/check", `{"type":"http"`, []string{"must be a JSON check object"}},
		{"xlb.io/check", `"tcp"`, []string{`field "check"`, "must be an object"}},
	} {
		s := svc(func(s *corev1.Service) { s.Annotations = map[string]string{c.key: c.value} })
		farms, err := Farms(s, nil, node1)
		var ae *AnnotationError
		if !errors.As(err, &ae) {
			t.Errorf("%s=%s: error %v, want an AnnotationError", c.key, c.value, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s=%s: error %q does not say %q", c.key, c.value, err, w)
			}
		}
		// The farm names are still returned, so the caller knows what the
		// Service owns.
		if len(farms) != 1 || farms[0].Name != "shop.web.http.cluster-10.96.0.10" {
			t.Errorf("%s=%s: farms %v", c.key, c.value, farms)
		}
	}
}

func TestFarmName(t *testing.T) {
	long := strings.Repeat("n", 63)
	name := FarmName(long, strings.Repeat("s", 63), "https", KindCluster, netip.MustParseAddr("fd00:96::1234"))
	if len(name) > model.MaxNameLen || !model.ValidName(name) || !strings.HasSuffix(name, ".cluster-fd00-96--1234") || !strings.HasPrefix(name, "nnnn") {
		t.Errorf("long name %q (%d)", name, len(name))
	}
	other := FarmName(long, strings.Repeat("s", 62)+"t", "https", KindCluster, netip.MustParseAddr("fd00:96::1234"))
	if other == name {
		t.Errorf("two long names collide: %q", name)
	}
	if n := FarmName("default", "kubernetes", "https", KindCluster, netip.MustParseAddr("10.96.0.1")); n != "default.kubernetes.https.cluster-10.96.0.1" || !model.ValidName(n) {
		t.Errorf("short name %q", n)
	}
}

func TestNodeAddrs(t *testing.T) {
	n := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node1"},
		{Type: corev1.NodeInternalIP, Address: "192.0.2.1"},
		{Type: corev1.NodeInternalIP, Address: "2001:db8::1"},
		{Type: corev1.NodeExternalIP, Address: "198.51.100.1"},
		{Type: corev1.NodeExternalIP, Address: "192.0.2.1"},
	}}}
	if got := NodeAddrs(n, nil); len(got) != 3 || got[0].String() != "192.0.2.1" || got[2].String() != "198.51.100.1" {
		t.Errorf("NodeAddrs %v", got)
	}
	if got := NodeAddrs(n, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}); len(got) != 1 || got[0].String() != "192.0.2.1" {
		t.Errorf("NodeAddrs within 192.0.2.0/24: %v", got)
	}
}

func TestFarmsClusterCIDR(t *testing.T) {
	eps := []*discoveryv1.EndpointSlice{slice(discoveryv1.AddressTypeIPv4, 80, "http", corev1.ProtocolTCP,
		ep{addr: "10.0.0.1", node: "node1"}, ep{addr: "10.0.0.2", node: "node2"})}
	s := svc(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	node := node1
	node.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	farms, err := Farms(s, eps, node)
	if err != nil {
		t.Fatal(err)
	}
	// The cluster IP: clients outside the cluster CIDR masqueraded, the
	// Pods (a farm of their own, every endpoint) not.
	if cl := farmByName(t, farms, "shop.web.http.cluster-10.96.0.10"); cl.Mode != model.ModeSNAT || cl.SourceTable != "" {
		t.Errorf("cluster farm: %s %q", cl.Mode, cl.SourceTable)
	}
	clp := farmByName(t, farms, "shop.web.http.cluster-pods-10.96.0.10")
	if got := backendAddrs(clp); !slices.Equal(got, []string{"10.0.0.1:80", "10.0.0.2:80"}) || clp.Mode != model.ModeDNAT || clp.SourceTable != ClusterCIDRTableName {
		t.Errorf("cluster Pods' farm: %v %s %q", got, clp.Mode, clp.SourceTable)
	}
	// The eTP:Local NodePort: local endpoints for everybody, every
	// endpoint for the Pods (short-circuit), both unmasqueraded.
	np := farmByName(t, farms, "shop.web.http.node-192.0.2.1")
	npp := farmByName(t, farms, "shop.web.http.node-pods-192.0.2.1")
	if got := backendAddrs(np); !slices.Equal(got, []string{"10.0.0.1:80"}) || np.Mode != model.ModeDNAT {
		t.Errorf("node port farm: %v %s", got, np.Mode)
	}
	if got := backendAddrs(npp); !slices.Equal(got, []string{"10.0.0.1:80", "10.0.0.2:80"}) || npp.Mode != model.ModeDNAT || npp.SourceTable != ClusterCIDRTableName {
		t.Errorf("node port Pods' farm: %v %s %q", got, npp.Mode, npp.SourceTable)
	}
	// externalTrafficPolicy Cluster: no Pods' farm on the node port.
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	farms, _ = Farms(s, eps, node)
	for _, f := range farms {
		if f.Name == "shop.web.http.node-pods-192.0.2.1" {
			t.Errorf("eTP:Cluster: a Pods' farm on the node port")
		}
	}
	// Without a cluster CIDR: none at all, the cluster IP in dnat.
	farms, _ = Farms(s, eps, node1)
	for _, f := range farms {
		if f.SourceTable != "" || (isKind(&f, KindCluster) && f.Mode != model.ModeDNAT) {
			t.Errorf("no cluster CIDR: farm %s mode %s source-table %q", f.Name, f.Mode, f.SourceTable)
		}
	}
	// Beside a policy (loadBalancerSourceRanges) a Pods' farm goes.
	np.Policies = []model.PolicyRef{{Name: "x"}}
	farms = dropPodsFarmsBesidePolicies([]model.Farm{*np, *npp})
	if len(farms) != 1 || isPodsFarm(&farms[0]) {
		t.Errorf("beside a policy: %d farms", len(farms))
	}
}
