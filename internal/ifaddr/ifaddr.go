// Package ifaddr lists the interface addresses of a network namespace and
// reports their changes: the addresses kube-proxy serves NodePorts on when
// --nodeport-addresses gives CIDRs (kube-proxy's GetNodeIPs reads the
// node's interfaces, not the Node object).
package ifaddr

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Source reads one namespace's addresses.
type Source struct {
	ns netns.NsHandle // zero or netns.None(): the current namespace
}

// New returns the Source of namespace ns (zero or netns.None(): the
// current one).
func New(ns netns.NsHandle) *Source { return &Source{ns: ns} }

// Addrs returns the namespace's addresses that can serve a NodePort: every
// interface address but link-local ones (a link-local address means nothing
// without its interface) and ::1 (IPv6 cannot route a loopback address off
// the host), sorted, without duplicates. IPv4 loopback addresses are listed:
// kube-proxy serves localhost NodePorts on them when --nodeport-addresses
// names them (the caller decides).
func (s *Source) Addrs() ([]netip.Addr, error) {
	h, err := s.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	list, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && Serves(ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out), nil
}

// Serves reports whether a can serve NodePorts: not IPv6 loopback, not
// link-local, not unspecified or multicast.
func Serves(a netip.Addr) bool {
	return a.IsValid() && !(a.Is6() && a.IsLoopback()) && !a.IsLinkLocalUnicast() && !a.IsUnspecified() && !a.IsMulticast()
}

// Watch calls changed after addresses are added to or removed from the
// namespace, until ctx is done. It returns at once with an error if it
// cannot subscribe; a subscription the kernel ends later (its socket
// overflowed: updates were lost) is renewed after calling changed, so no
// change goes unseen.
func (s *Source) Watch(ctx context.Context, changed func()) error {
	updates, done, err := s.subscribe()
	if err != nil {
		return err
	}
	go func() {
		for {
			s.consume(ctx, updates, changed)
			close(done)
			if ctx.Err() != nil {
				return
			}
			changed()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				if updates, done, err = s.subscribe(); err == nil {
					break
				}
			}
		}
	}()
	return nil
}

func (s *Source) subscribe() (chan netlink.AddrUpdate, chan struct{}, error) {
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	opts := netlink.AddrSubscribeOptions{}
	if s.ns > 0 {
		ns := s.ns
		opts.Namespace = &ns
	}
	if err := netlink.AddrSubscribeWithOptions(updates, done, opts); err != nil {
		return nil, nil, fmt.Errorf("subscribe to address changes: %w", err)
	}
	return updates, done, nil
}

// consume calls changed for updates until ctx is done or the subscription
// ends; several updates in a row (an interface's addresses going at once)
// make one call.
func (s *Source) consume(ctx context.Context, updates chan netlink.AddrUpdate, changed func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-updates:
			if !ok {
				return
			}
			for drained := false; !drained; {
				select {
				case _, ok := <-updates:
					if !ok {
						return
					}
				default:
					drained = true
				}
			}
			changed()
		}
	}
}

func (s *Source) handle() (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if s.ns > 0 {
		h, err = netlink.NewHandleAt(s.ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle for addresses: %w", err)
	}
	return h, nil
}
