package kube

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Where NodePorts are served. Like kube-proxy 1.37's nftables mode:
//
//   - --nodeport-addresses not given: every InternalIP and ExternalIP of the
//     Node's status (kube-proxy's nftables mode defaults to "primary",
//     iptables mode to every interface address; see docs/kube-proxy.md);
//   - "primary" alone: the Node's first InternalIP (else ExternalIP) of each
//     family;
//   - CIDRs (and "localhost", "all"), with "primary" or not: the node's
//     interface addresses (Config.InterfaceAddrs) inside them, the primary
//     addresses counting as /32 and /128; a family without any prefix takes
//     all its addresses (kube-proxy's NewNodePortAddresses adds 0.0.0.0/0 or
//     ::/0 for it). IPv4 loopback addresses serve NodePorts only when a
//     prefix names them ("localhost", "all", 127.0.0.0/8: localhost
//     NodePorts, as kube-proxy's iptables mode serves them; see
//     LocalhostNodePorts); ::1 and link-local addresses never do.
//
// The interface addresses are watched: an address added or removed re-syncs
// the Services with NodePorts, as a Node change does.

// AddrSource lists and watches the node's interface addresses.
type AddrSource interface {
	// Addrs returns the addresses that may serve NodePorts.
	Addrs() ([]netip.Addr, error)
	// Watch calls changed after an address change, until ctx is done.
	Watch(ctx context.Context, changed func()) error
}

// fromInterfaces reports whether NodePorts follow the interface addresses.
func (c *Controller) fromInterfaces() bool {
	return c.cfg.InterfaceAddrs != nil && len(c.cfg.NodePortAddresses) > 0
}

// watchInterfaces starts the interface address watch, if NodePorts follow
// the interfaces, and takes the addresses a first time.
func (c *Controller) watchInterfaces(ctx context.Context) error {
	if !c.fromInterfaces() {
		return nil
	}
	if err := c.cfg.InterfaceAddrs.Watch(ctx, c.refreshNodeAddrs); err != nil {
		return fmt.Errorf("watch the node's interface addresses for --nodeport-addresses: %w", err)
	}
	c.refreshNodeAddrs()
	return nil
}

// nodeChanged records the Node and updates the NodePort addresses and the
// zone.
func (c *Controller) nodeChanged(obj any) {
	n, _ := obj.(*corev1.Node)
	zone := ""
	if n != nil {
		zone = n.Labels[corev1.LabelTopologyZone]
	}
	c.nodeMu.Lock()
	c.lastNode = n
	c.nodeIneligible = !nodeEligible(n)
	zoneChanged := zone != c.node.Zone
	c.node.Zone = zone
	c.nodeMu.Unlock()
	if zoneChanged {
		// Zone hints of any Service may now pick other endpoints, as
		// kube-proxy re-syncs everything on a topology label change.
		c.log.Info("node zone changed", "node", c.cfg.NodeName, "zone", zone)
		c.enqueueAll()
	}
	c.refreshNodeAddrs()
}

// enqueueAll queues every Service for a sync.
func (c *Controller) enqueueAll() {
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return
	}
	for _, s := range svcs {
		c.enqueue(s.Namespace + "/" + s.Name)
	}
}

// refreshNodeAddrs recomputes the NodePort addresses; if they changed,
// every Service with a NodePort is synced again.
func (c *Controller) refreshNodeAddrs() {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	c.nodeMu.Lock()
	n := c.lastNode
	c.nodeMu.Unlock()
	addrs, err := c.nodePortAddrs(n)
	if err != nil {
		// Keep serving the addresses we had: the next change retries.
		c.log.Error("node port addresses", "err", err)
		return
	}
	c.nodeMu.Lock()
	same := slices.Equal(addrs, c.node.Addrs)
	c.node.Addrs = addrs
	c.nodeMu.Unlock()
	if same {
		return
	}
	c.log.Info("node addresses changed", "node", c.cfg.NodeName, "addrs", fmt.Sprint(addrs))
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return
	}
	for _, s := range svcs {
		if s.Spec.Type == corev1.ServiceTypeNodePort || s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			c.enqueue(s.Namespace + "/" + s.Name)
		}
	}
}

// nodePortAddrs returns the addresses NodePorts are served on (see the
// comment at the top of the file).
func (c *Controller) nodePortAddrs(n *corev1.Node) ([]netip.Addr, error) {
	if c.fromInterfaces() {
		ifs, err := c.cfg.InterfaceAddrs.Addrs()
		if err != nil {
			return nil, err
		}
		within := slices.Clone(c.cfg.NodePortAddresses)
		if c.cfg.NodePortPrimary && n != nil {
			for _, a := range PrimaryNodeAddrs(n) {
				within = append(within, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		return FilterNodePortAddrs(ifs, within), nil
	}
	if n == nil {
		return nil, nil
	}
	if c.cfg.NodePortPrimary {
		return PrimaryNodeAddrs(n), nil
	}
	return NodeAddrs(n, c.cfg.NodePortAddresses), nil
}

// FilterNodePortAddrs returns the addresses of addrs inside within, as
// kube-proxy's NodePortAddresses filters interface addresses: per family,
// the prefixes of that family, or every address of a family without one;
// an IPv4 loopback address only inside a prefix (localhost NodePorts, see
// LocalhostNodePorts); never ::1 or a link-local address. The order of
// addrs is kept.
func FilterNodePortAddrs(addrs []netip.Addr, within []netip.Prefix) []netip.Addr {
	has := map[bool]bool{} // family (Is6) -> some prefix of it given
	for _, p := range within {
		has[p.Addr().Is6()] = true
	}
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if (a.IsLoopback() && a.Is6()) || a.IsLinkLocalUnicast() || slices.Contains(out, a) {
			continue
		}
		inside := slices.ContainsFunc(within, func(p netip.Prefix) bool { return p.Contains(a) })
		if (has[a.Is6()] || a.IsLoopback()) && !inside {
			continue
		}
		out = append(out, a)
	}
	return out
}

// LocalhostNodePorts reports whether the prefixes of --nodeport-addresses
// name an IPv4 loopback address, so NodePorts are served on 127.0.0.1 (as
// kube-proxy's iptables mode does). The nft data plane then needs the
// node's route_localnet (nft.EnableLocalhostNodePorts).
func LocalhostNodePorts(within []netip.Prefix) bool {
	return slices.ContainsFunc(within, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr("127.0.0.1")) })
}

// NodeAddrs returns the addresses of a Node that serve NodePorts: its
// InternalIP and ExternalIP status addresses, restricted to within if not
// empty, in the order the Node lists them.
func NodeAddrs(n *corev1.Node, within []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, na := range n.Status.Addresses {
		if na.Type != corev1.NodeInternalIP && na.Type != corev1.NodeExternalIP {
			continue
		}
		a, err := netip.ParseAddr(na.Address)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if len(within) > 0 && !slices.ContainsFunc(within, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// PrimaryNodeAddrs returns a Node's primary addresses, as kube-proxy's
// --nodeport-addresses primary takes them: the first InternalIP of each
// family, else the first ExternalIP of that family.
func PrimaryNodeAddrs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, v6 := range []bool{false, true} {
		for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
			found := false
			for _, na := range n.Status.Addresses {
				a, err := netip.ParseAddr(na.Address)
				if na.Type != typ || err != nil || a.Unmap().Is6() != v6 {
					continue
				}
				out = append(out, a.Unmap())
				found = true
				break
			}
			if found {
				break
			}
		}
	}
	return out
}
