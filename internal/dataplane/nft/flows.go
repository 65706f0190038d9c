package nft

import (
	"context"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

var _ dataplane.FlowFlusher = (*Plane)(nil)

// DeleteUDPFlows implements dataplane.FlowFlusher on netfilter's conntrack
// of the plane's namespace (conntrack is per namespace, not per table): it
// deletes the UDP entries whose original destination is VIP:Port and whose
// reply comes from Backend. The kernel offers no filtered delete, so the
// table is dumped once per address family and matched here.
func (s *Plane) DeleteUDPFlows(ctx context.Context, flows []dataplane.StaleFlow) (int, error) {
	return deleteUDPFlows(ctx, s.opts.NetNS, flows)
}

func deleteUDPFlows(ctx context.Context, ns netns.NsHandle, flows []dataplane.StaleFlow) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return 0, fmt.Errorf("netlink handle for conntrack: %w", err)
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
