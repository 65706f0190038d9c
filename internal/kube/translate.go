// Package kube turns Kubernetes Services, EndpointSlices and Nodes into xlb
// farms (translate.go: pure functions) and keeps the engine in step with the
// API server (controller.go: client-go informers, one engine transaction per
// changed Service). See docs/kube-proxy.md for the mapping.
package kube

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xlb-lb/xlb/internal/model"
)

// DefaultAffinityTimeout is Kubernetes' default
// sessionAffinityConfig.clientIP.timeoutSeconds (3 hours).
const DefaultAffinityTimeout = 10800

// Node is what translation needs to know about the node xlb runs on.
type Node struct {
	// Name is the node's name as endpoints' nodeName spell it
	// (--hostname-override).
	Name string
	// Addrs are the addresses NodePorts are served on.
	Addrs []netip.Addr
	// PodInterface is the interface Pods' traffic arrives on (a CNI
	// bridge such as cni0): mode dsr for a cluster IP works at netdev
	// ingress of one interface, and a cluster IP is held by none (kube-nftlb
	// used its configured Docker bridge the same way). Empty: the
	// xlb.io/iface annotation must name it.
	PodInterface string
	// MasqueradeAll: cluster farms masquerade (snat) every client, as
	// kube-proxy's masqueradeAll does, instead of keeping its address.
	MasqueradeAll bool
	// Zone is the Node's topology.kubernetes.io/zone label ("" without
	// it): EndpointSlice zone hints are matched against it (topology.go).
	Zone string
	// ClusterCIDRs are kube-proxy's clusterCIDR (the Pods' addresses):
	// with them, traffic is told apart by source as kube-proxy does
	// (clustercidr.go). Empty: not.
	ClusterCIDRs []netip.Prefix
}

// Kind says which address of a Service a farm serves.
type Kind string

// Farm kinds; each is the middle part of the farm's name.
const (
	KindCluster  Kind = "cluster"  // spec.clusterIPs
	KindExternal Kind = "external" // spec.externalIPs
	KindLB       Kind = "lb"       // status.loadBalancer.ingress[].ip
	KindNodePort Kind = "node"     // the node's addresses, port spec.ports[].nodePort
)

// FarmName returns the name of the farm that serves one address of one port
// of a Service:
//
//	<namespace>.<service>.<port>.<kind>-<address>
//
// where <port> is the port's name, or its number when the Service has one
// unnamed port, and <address> has ':' written as '-'. Farm names are limited
// to 64 characters of [A-Za-z0-9_.-] (they appear in URLs and log
// prefixes), so '/' and ':' are not used; '.' cannot appear in namespace,
// Service or port names, so the parts stay unambiguous. A name longer than
// 64 characters keeps its end (kind and address) and replaces the end of its
// first part with '-' and 8 hex digits of a SHA-256 of the whole name.
func FarmName(namespace, service, port string, kind Kind, addr netip.Addr) string {
	head := namespace + "." + service + "." + port
	tail := "." + string(kind) + "-" + strings.ReplaceAll(addr.String(), ":", "-")
	name := head + tail
	if len(name) <= model.MaxNameLen {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	keep := model.MaxNameLen - len(tail) - 9
	return head[:keep] + "-" + hex.EncodeToString(sum[:4]) + tail
}

// portID names a Service port inside farm names.
func portID(sp *corev1.ServicePort) string {
	if sp.Name != "" {
		return sp.Name
	}
	return strconv.Itoa(int(sp.Port))
}

// endpoint is one address and port of an EndpointSlice, with its conditions
// as kube-proxy reads them.
type endpoint struct {
	addr        netip.Addr
	port        uint16
	ready       bool
	serving     bool
	terminating bool
	local       bool
	// zoneHints and nodeHints are the endpoint's hints.forZones and
	// hints.forNodes names (topology.go).
	zoneHints, nodeHints []string
}

// endpointsFor collects the endpoints of one Service port in one address
// family from the Service's EndpointSlices, as kube-proxy does: the port is
// matched by name and protocol; an endpoint is its first address; a nil
// ready condition means ready, a nil serving condition means "as ready",
// and a nil terminating condition means not terminating. An address that
// appears in several slices (while slices are being rewritten) counts once,
// ready if any copy is.
func endpointsFor(sp *corev1.ServicePort, v6 bool, eps []*discoveryv1.EndpointSlice, nodeName string) []endpoint {
	want := discoveryv1.AddressTypeIPv4
	if v6 {
		want = discoveryv1.AddressTypeIPv6
	}
	var out []endpoint
	index := map[netip.AddrPort]int{}
	for _, s := range eps {
		if s == nil || s.AddressType != want {
			continue
		}
		var port uint16
		found := false
		for _, p := range s.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			if name == sp.Name && proto == sp.Protocol && p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
				port, found = uint16(*p.Port), true
				break
			}
		}
		if !found {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if len(e.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(e.Addresses[0])
			if err != nil || a.Is6() != v6 || a.Zone() != "" {
				continue
			}
			a = a.Unmap()
			c := e.Conditions
			ep := endpoint{addr: a, port: port, ready: c.Ready == nil || *c.Ready}
			ep.serving = ep.ready
			if c.Serving != nil {
				ep.serving = *c.Serving
			}
			ep.terminating = c.Terminating != nil && *c.Terminating
			ep.local = e.NodeName != nil && *e.NodeName == nodeName && nodeName != ""
			if h := e.Hints; h != nil {
				for _, z := range h.ForZones {
					ep.zoneHints = append(ep.zoneHints, z.Name)
				}
				for _, n := range h.ForNodes {
					ep.nodeHints = append(ep.nodeHints, n.Name)
				}
			}
			key := netip.AddrPortFrom(a, port)
			if j, dup := index[key]; dup {
				o := &out[j]
				o.ready = o.ready || ep.ready
				o.serving = o.serving || ep.serving
				o.terminating = o.terminating && ep.terminating
				o.local = o.local || ep.local
				o.zoneHints = union(o.zoneHints, ep.zoneHints)
				o.nodeHints = union(o.nodeHints, ep.nodeHints)
				continue
			}
			index[key] = len(out)
			out = append(out, ep)
		}
	}
	slices.SortFunc(out, func(a, b endpoint) int {
		return cmp.Or(a.addr.Compare(b.addr), cmp.Compare(a.port, b.port))
	})
	return out
}

// union returns a with the names of b it lacks.
func union(a, b []string) []string {
	for _, x := range b {
		if !slices.Contains(a, x) {
			a = append(a, x)
		}
	}
	return a
}

// BackendName is the backend name of an endpoint: its address (':' written
// as '-') and port joined by '_', e.g. "10.244.1.5_8080".
func BackendName(a netip.Addr, port uint16) string {
	return strings.ReplaceAll(a.String(), ":", "-") + "_" + strconv.Itoa(int(port))
}

func backends(eps []endpoint) []model.Backend {
	out := make([]model.Backend, 0, len(eps))
	for _, e := range eps {
		b := model.NewBackend(BackendName(e.addr, e.port))
		b.Addr = e.addr
		b.Port = e.port
		out = append(out, b)
	}
	return out
}

// ServiceAddr is one address a Service is reachable on, and what kind of
// address it is.
type ServiceAddr struct {
	Kind Kind
	Addr netip.Addr
}

// serviceAddrs lists the addresses of a Service for one Service port,
// in a fixed order: cluster IPs, external IPs, load balancer IPs, node
// addresses (for the port's nodePort). Addresses that do not parse are
// skipped (the API server validates them; "None" is a headless Service).
func serviceAddrs(svc *corev1.Service, sp *corev1.ServicePort, node Node) []ServiceAddr {
	var out []ServiceAddr
	seen := map[ServiceAddr]bool{}
	add := func(k Kind, s string) {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || a.Zone() != "" || a.IsUnspecified() {
			return
		}
		sa := ServiceAddr{k, a.Unmap()}
		if !seen[sa] {
			seen[sa] = true
			out = append(out, sa)
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, ip := range ips {
		add(KindCluster, ip)
	}
	for _, ip := range svc.Spec.ExternalIPs {
		add(KindExternal, ip)
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			// ipMode Proxy: the load balancer proxies to the node; traffic
			// never arrives for the LB IP, so kube-proxy does not program it.
			if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
				continue
			}
			add(KindLB, in.IP)
		}
	}
	if sp.NodePort != 0 && (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) {
		for _, a := range node.Addrs {
			add(KindNodePort, a.String())
		}
	}
	return out
}

// FarmNames returns the names of the farms a Service maps to on this node,
// whatever its annotations say (names never depend on them).
func FarmNames(svc *corev1.Service, node Node) []string {
	var out []string
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		for _, sa := range serviceAddrs(svc, sp, node) {
			out = append(out, FarmName(svc.Namespace, svc.Name, portID(sp), sa.Kind, sa.Addr))
		}
	}
	return out
}

// UnsupportedError says a Service uses something xlb cannot serve.
type UnsupportedError struct {
	Field, Value, Problem string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("field %q value %q: %s", e.Field, e.Value, e.Problem)
}

// Farms translates one Service and its EndpointSlices into the farms that
// serve it on node: one farm per Service port and address (cluster IP,
// external IP, load balancer IP, node address for NodePorts).
//
//   - Backends are the usable endpoints of the port in the farm's family
//     (topology.go): with internalTrafficPolicy Local (cluster IPs) or
//     externalTrafficPolicy Local (the other kinds), only this node's;
//     otherwise every ready one, narrowed by the EndpointSlices' topology
//     hints when they apply to this node.
//   - Mode: dnat for cluster IPs and for external traffic with
//     externalTrafficPolicy Local (the client's address is kept); snat for
//     other external traffic (replies must come back through this node).
//   - sessionAffinity ClientIP sets persistence srcip with the Service's
//     timeout (default 10800 s).
//   - Annotations (see parseAnnotations) override mode, scheduler,
//     sched-param, persistence, persist-ttl, helper, log, est-connlimit and
//     iface.
//
// An annotation is a request, never a condition of service: on an invalid
// one Farms returns the farms built with the defaults (no annotation
// applied) together with the *AnnotationError, and the caller serves those.
func Farms(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node Node) ([]model.Farm, error) {
	set, aerr := parseAnnotations(svc.Annotations)
	if aerr != nil {
		set = settings{}
	}
	farms, err := buildFarms(svc, eps, node, &set)
	if err != nil {
		return nil, err
	}
	return farms, aerr
}

// DefaultFarms is Farms without the Service's annotations: what it falls
// back to when the farms its annotations make are refused.
func DefaultFarms(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node Node) ([]model.Farm, error) {
	return buildFarms(svc, eps, node, &settings{})
}

// HasAnnotations reports whether a Service carries annotations that change
// its farms (valid ones: an invalid one changes nothing).
func HasAnnotations(svc *corev1.Service) bool {
	set, err := parseAnnotations(svc.Annotations)
	return err == nil && set.any()
}

// buildFarms builds a Service's farms with the settings of its annotations
// (empty: the defaults).
func buildFarms(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node Node, set *settings) ([]model.Farm, error) {
	var out []model.Farm
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		var proto model.Protocol
		switch sp.Protocol {
		case corev1.ProtocolTCP, "":
			proto = model.ProtoTCP
		case corev1.ProtocolUDP:
			proto = model.ProtoUDP
		case corev1.ProtocolSCTP:
			proto = model.ProtoSCTP
		default:
			return nil, &UnsupportedError{Field: fmt.Sprintf("spec.ports[%d].protocol", i), Value: string(sp.Protocol), Problem: "allowed values are TCP, UDP, SCTP"}
		}
		if sp.Port <= 0 || sp.Port > 65535 {
			continue
		}
		addrs := serviceAddrs(svc, sp, node)
		if len(addrs) == 0 {
			continue
		}
		var eps4, eps6 []endpoint
		for _, sa := range addrs {
			if sa.Addr.Is4() && eps4 == nil {
				eps4 = endpointsFor(sp, false, eps, node.Name)
			}
			if sa.Addr.Is6() && eps6 == nil {
				eps6 = endpointsFor(sp, true, eps, node.Name)
			}
		}
		for _, sa := range addrs {
			f := model.NewFarm(FarmName(svc.Namespace, svc.Name, portID(sp), sa.Kind, sa.Addr))
			f.VirtualAddr = sa.Addr
			f.Family = model.FamilyIPv4
			all := eps4
			if sa.Addr.Is6() {
				f.Family = model.FamilyIPv6
				all = eps6
			}
			port := uint16(sp.Port)
			if sa.Kind == KindNodePort {
				port = uint16(sp.NodePort)
			}
			f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
			f.Protocol = proto
			var local bool
			// pods: a farm of its own serves clients in the cluster
			// CIDR (clustercidr.go), in dnat: Pods reaching an
			// eTP:Local Service's external addresses.
			var pods bool
			if sa.Kind == KindCluster {
				local = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
				f.Mode = model.ModeDNAT
				switch {
				case node.MasqueradeAll:
					f.Mode = model.ModeSNAT
				case len(node.ClusterCIDRs) > 0:
					// kube-proxy's "masquerade clusterIP traffic from
					// outside cluster": the cluster IP's farm
					// masquerades, and the Pods get a farm of their own
					// in dnat (clustercidr.go).
					f.Mode = model.ModeSNAT
					pods = true
				}
			} else {
				// 127.0.0.1 (localhost NodePorts) is reached only by the
				// node itself: kube-proxy's "short-circuit local traffic"
				// (masqueraded, to every endpoint, whatever
				// externalTrafficPolicy says); without the masquerade the
				// endpoint would answer its own loopback.
				local = svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && !sa.Addr.IsLoopback()
				f.Mode = model.ModeSNAT
				if local {
					f.Mode = model.ModeDNAT
				}
			}
			// dropAll: a Local policy with usable endpoints on other nodes
			// only (dropnolocal.go).
			var dropAll bool
			// podsBackends: the Pods' farm's backends.
			podsBackends := f.Backends
			if local && sa.Kind != KindCluster && !sa.Addr.IsLoopback() && len(node.ClusterCIDRs) > 0 {
				// kube-proxy's "short-circuit pod traffic": Pods
				// reaching an eTP:Local Service's external address get
				// every endpoint, unmasqueraded.
				pods = true
				podsBackends = backends(clusterEndpoints(all, node.Name, node.Zone))
			}
			if local {
				f.Backends = backends(localEndpoints(all))
				dropAll = len(f.Backends) == 0 && len(clusterEndpoints(all, node.Name, node.Zone)) > 0
			} else {
				f.Backends = backends(clusterEndpoints(all, node.Name, node.Zone))
			}
			if sa.Kind == KindCluster {
				podsBackends = f.Backends // the cluster IP's endpoints, for Pods too
			}
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				f.Persistence = model.KeySrcIP
				f.PersistTTL = DefaultAffinityTimeout
				if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
					f.PersistTTL = uint32(*c.ClientIP.TimeoutSeconds)
				}
			}
			set.override(&f)
			if dropAll {
				attachDropAll(&f)
			}
			if f.Mode == model.ModeDSR && f.Iface == "" && sa.Kind == KindCluster {
				// A cluster IP is on no interface and rarely routed:
				// its traffic arrives where the Pods are.
				f.Iface = node.PodInterface
			}
			out = append(out, f)
			if sa.Kind == KindCluster && f.Mode != model.ModeSNAT {
				pods = false // an annotation's mode: no masquerade to tell the Pods from
			}
			if pods && !dropAll {
				if pf, ok := podsFarm(svc, sp, sa, &f, podsBackends); ok {
					out = append(out, pf)
				}
			}
		}
	}
	return out, nil
}
