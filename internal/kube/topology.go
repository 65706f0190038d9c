package kube

import "slices"

// Which endpoints a farm takes, as kube-proxy 1.37 picks them
// (kubernetes pkg/proxy/topology.go, CategorizeEndpoints):
//
//   - A farm of a traffic policy Cluster (cluster IPs without
//     internalTrafficPolicy Local; external, load balancer and node farms
//     without externalTrafficPolicy Local) takes clusterEndpoints: the ready
//     endpoints, narrowed by the EndpointSlice hints (topology-aware
//     routing) when they apply; if none is ready anywhere, the serving
//     terminating ones.
//   - A farm of a traffic policy Local takes localEndpoints: this node's
//     ready endpoints, else its serving terminating ones. Hints are not
//     used: the node is narrower than any zone.
//
// Hints are what topology-aware routing is made of for a proxy: the
// EndpointSlice controller writes them from the Service's
// trafficDistribution (PreferClose / PreferSameZone: hints.forZones with
// the endpoint's zone; PreferSameNode: hints.forNodes with its node too) or
// from the older topology-mode annotation. kube-proxy reads only the hints
// and the node's topology.kubernetes.io/zone label, never
// trafficDistribution itself, and so does xlb.

// Topology modes (kube-proxy's names, the Service's trafficDistribution
// values they come from).
const (
	topologyNone     = ""
	topologySameZone = "PreferSameZone"
	topologySameNode = "PreferSameNode"
)

// topologyMode says which hints narrow the ready endpoints, as kube-proxy's
// topologyModeFromHints (with PreferSameTrafficDistribution, GA and locked
// on since 1.35):
//
//   - PreferSameNode when every ready endpoint has a node hint and one of
//     them names this node;
//   - else PreferSameZone when every ready endpoint has a zone hint and one
//     of them names this node's zone (a node without the zone label has
//     zone "", which no hint names);
//   - else none: every ready endpoint, whatever its hints. This is the
//     fallback when any ready endpoint lacks a hint, or when no hint is for
//     this node or zone (the controller may not have caught up with a new
//     zone; sending traffic nowhere would be worse).
//
// Endpoints that are not ready count for nothing, whatever their hints.
func topologyMode(eps []endpoint, nodeName, zone string) string {
	anyReady := false
	allNodes, forNode := true, false
	allZones, forZone := true, false
	for i := range eps {
		e := &eps[i]
		if !e.ready {
			continue
		}
		anyReady = true
		if len(e.nodeHints) == 0 {
			allNodes = false
		} else if slices.Contains(e.nodeHints, nodeName) {
			forNode = true
		}
		if len(e.zoneHints) == 0 {
			allZones = false
		} else if slices.Contains(e.zoneHints, zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNodes && forNode:
		return topologySameNode
	case allZones && forZone:
		return topologySameZone
	}
	return topologyNone
}

// forTopology reports whether e may take traffic from this node in mode.
func (e *endpoint) forTopology(mode, nodeName, zone string) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(e.nodeHints, nodeName)
	case topologySameZone:
		return slices.Contains(e.zoneHints, zone)
	}
	return true
}

// clusterEndpoints returns the endpoints of a traffic policy Cluster farm:
// the ready ones the hints give this node (see topologyMode); if no
// endpoint is ready, the serving terminating ones, whatever their hints
// (connections drain into Pods that are shutting down rather than fail).
// When a topology mode applies, some ready endpoint matches it, so the
// fallback only happens when none is ready anywhere.
func clusterEndpoints(eps []endpoint, nodeName, zone string) []endpoint {
	mode := topologyMode(eps, nodeName, zone)
	var out []endpoint
	for _, e := range eps {
		if e.ready && e.forTopology(mode, nodeName, zone) {
			out = append(out, e)
		}
	}
	if len(out) > 0 {
		return out
	}
	for _, e := range eps {
		if e.serving && e.terminating {
			out = append(out, e)
		}
	}
	return out
}

// localEndpoints returns the endpoints of a traffic policy Local farm: this
// node's ready endpoints, or if it has none, its serving terminating ones.
// Hints are ignored.
func localEndpoints(eps []endpoint) []endpoint {
	var ready, terminating []endpoint
	for _, e := range eps {
		switch {
		case !e.local:
		case e.ready:
			ready = append(ready, e)
		case e.serving && e.terminating:
			terminating = append(terminating, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}
