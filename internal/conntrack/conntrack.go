// Package conntrack deletes the kernel's (netfilter's) conntrack entries
// over netlink: the nft data plane's established connections live there,
// so cutting a backend's connections (health checks' on-down flush) or a
// gone endpoint's UDP flows (the Kubernetes proxy) means deleting its
// entries. It is the one place xlb speaks conntrack netlink.
package conntrack

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// Flusher implements dataplane.BackendFlusher with netfilter's conntrack.
type Flusher struct {
	// NS is the data plane's network namespace; zero or netns.None(): the
	// current one.
	NS netns.NsHandle
}

// backendFilter matches the entries of connections a farm sent to one
// backend: reply source = the backend's address (and port, when it has
// one), original destination = one of the farm's VIPs (any for a
// firewall-mark farm), and the farm's protocol.
type backendFilter struct {
	vips  []netip.Addr
	addr  netip.Addr
	port  uint16
	proto uint8 // 0: any
}

func (m backendFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	if m.proto != 0 && fl.Forward.Protocol != m.proto {
		return false
	}
	src, ok := netip.AddrFromSlice(fl.Reverse.SrcIP)
	if !ok || src.Unmap() != m.addr {
		return false
	}
	if m.port != 0 && fl.Reverse.SrcPort != m.port {
		return false
	}
	if len(m.vips) == 0 {
		return true
	}
	dst, _ := netip.AddrFromSlice(fl.Forward.DstIP)
	for _, v := range m.vips {
		if dst.Unmap() == v {
			return true
		}
	}
	return false
}

// FlushBackend deletes the conntrack entries of f's connections to b. The
// next packet of such a connection finds no entry: a TCP segment that is
// not a SYN is scheduled anew and answered with a reset by whichever
// backend it reaches, a UDP datagram goes to a serving backend.
func (c Flusher) FlushBackend(ctx context.Context, f *model.Farm, b *model.Backend) (int, error) {
	h, err := handle(c.NS)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	m := backendFilter{vips: f.VirtualAddrs(), addr: b.Addr, port: b.Port, proto: f.Protocol.Number()}
	fam := netlink.InetFamily(unix.AF_INET)
	if b.Addr.Is6() {
		fam = unix.AF_INET6
	}
	n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, m)
	if err != nil {
		return int(n), fmt.Errorf("delete conntrack entries of farm %q backend %q: %w", f.Name, b.Name, err)
	}
	return int(n), nil
}

// handle opens a conntrack netlink handle in ns (zero or netns.None():
// the current namespace; IsOpen would take zero for fd 0).
func handle(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if ns > 0 {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle for conntrack: %w", err)
	}
	return h, nil
}

// DeleteUDPFlows deletes the UDP entries of netfilter's conntrack in ns
// whose original destination is a flow's VIP:Port and whose reply comes
// from its Backend, and returns how many it deleted. The kernel offers no
// filtered delete, so the table is dumped once per address family and
// matched here.
func DeleteUDPFlows(ctx context.Context, ns netns.NsHandle, flows []dataplane.StaleFlow) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	h, err := handle(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	var f4, f6 []netlink.CustomConntrackFilter
	for _, fl := range flows {
		f := &netlink.ConntrackFilter{}
		if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return 0, err
		}
		if err := f.AddIP(netlink.ConntrackOrigDstIP, net.IP(fl.VIP.AsSlice())); err != nil {
			return 0, err
		}
		if err := f.AddPort(netlink.ConntrackOrigDstPort, fl.Port); err != nil {
			return 0, err
		}
		if err := f.AddIP(netlink.ConntrackReplySrcIP, net.IP(fl.Backend.AsSlice())); err != nil {
			return 0, err
		}
		if fl.VIP.Is4() {
			f4 = append(f4, f)
		} else {
			f6 = append(f6, f)
		}
	}
	total := 0
	for _, x := range []struct {
		fam     netlink.InetFamily
		filters []netlink.CustomConntrackFilter
	}{{unix.AF_INET, f4}, {unix.AF_INET6, f6}} {
		if len(x.filters) == 0 {
			continue
		}
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, x.fam, x.filters...)
		total += int(n)
		if err != nil {
			return total, fmt.Errorf("delete stale udp conntrack entries: %w", err)
		}
	}
	return total, nil
}
