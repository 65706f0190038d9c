// Package conntrack deletes the kernel's (netfilter's) conntrack entries
// over netlink: the nft data plane's established connections live there,
// so cutting a backend's connections (health checks' on-down flush) means
// deleting its entries.
package conntrack

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Flusher implements dataplane.FlowFlusher with netfilter's conntrack.
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
	var h *netlink.Handle
	var err error
	if c.NS > 0 {
		h, err = netlink.NewHandleAt(c.NS, unix.NETLINK_NETFILTER)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return 0, fmt.Errorf("netlink handle for conntrack: %w", err)
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
