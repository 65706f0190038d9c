package kube

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
)

// StaleFlow is a UDP conntrack entry to delete: traffic to VIP:Port that
// was sent to Backend, an endpoint that went away.
type StaleFlow struct {
	VIP     netip.Addr
	Port    uint16
	Backend netip.Addr
}

// Conntrack deletes stale UDP conntrack entries. UDP has no end of
// connection, so without this a client that keeps sending from the same
// port stays pinned to a removed endpoint until the entry times out
// (kube-proxy's long-standing UDP black-hole bug).
type Conntrack interface {
	DeleteUDP(flows []StaleFlow) (int, error)
}

// NetlinkConntrack deletes conntrack entries over netlink in a network
// namespace (the data plane's).
type NetlinkConntrack struct {
	// NS is the namespace; netns.None() (or 0) means the current one.
	NS netns.NsHandle
}

// DeleteUDP deletes the UDP entries whose original destination is VIP:Port
// and whose reply comes from Backend. The kernel offers no filtered delete,
// so the table is dumped once per address family and matched here.
func (c NetlinkConntrack) DeleteUDP(flows []StaleFlow) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	var h *netlink.Handle
	var err error
	if c.NS.IsOpen() {
		h, err = netlink.NewHandleAt(c.NS, unix.NETLINK_NETFILTER)
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

// EBPFConntrack deletes the stale UDP flows of the ebpf data plane, which
// tracks connections itself (netfilter's conntrack is not in its path).
type EBPFConntrack struct {
	Plane *ebpf.Plane
}

// DeleteUDP removes the plane's tracked UDP flows to VIP:Port that were
// sent to Backend.
func (c EBPFConntrack) DeleteUDP(flows []StaleFlow) (int, error) {
	fl := make([]ebpf.UDPFlow, len(flows))
	for i, f := range flows {
		fl[i] = ebpf.UDPFlow{VIP: f.VIP, Port: f.Port, Backend: f.Backend}
	}
	return c.Plane.DeleteUDPFlows(fl)
}
