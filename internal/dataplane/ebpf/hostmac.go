package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// Frames for other hosts. An interface in promiscuous mode, or a bridge or
// switch flooding a frame whose destination it has not learnt (a MAC that
// aged out, a node that died), hands the program frames for other hosts'
// MACs; the kernel marks them PACKET_OTHERHOST and its stack drops them,
// so the nft plane never answers them. The program balanced them: on a
// segment that floods, two nodes then served one flow. It now leaves them
// to the stack (lb_other_host, bpf/xlb_lb.c), unless their destination is
// another interface of the namespace: a bridge port sees the frames for its
// bridge's MAC as another host's, a lower device its macvlans', and those
// are this host's. xlb_host_mac holds those MACs.

// hostMACs returns the MAC addresses of links (Ethernet-sized ones: the
// loopback's and tunnels' have none or another size).
func hostMACs(links []netlink.Link) map[xlbHostMacKey]bool {
	out := map[xlbHostMacKey]bool{}
	for _, l := range links {
		mac := l.Attrs().HardwareAddr
		if len(mac) != 6 {
			continue
		}
		var k xlbHostMacKey
		copy(k.Mac[:], mac)
		out[k] = true
	}
	return out
}

// writeHostMACs makes xlb_host_mac hold exactly the MACs of links, the
// namespace's interfaces. attach writes it before the program is attached
// (a restarted daemon finds the pinned map as it was), and the link watch
// after every link change: between a MAC change and the watch's rewrite,
// frames for the new MAC on a bridge port go to the stack and frames for
// the old one are still served.
func (p *Plane) writeHostMACs(links []netlink.Link) error {
	want := hostMACs(links)
	var k xlbHostMacKey
	var v uint32
	var stale []xlbHostMacKey
	it := p.objs.XlbHostMac.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read the interfaces' MACs: %w", err)
	}
	for _, k := range stale {
		if err := p.objs.XlbHostMac.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete interface MAC %x: %w", k.Mac, err)
		}
	}
	for k := range want {
		if err := p.objs.XlbHostMac.Update(k, uint32(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write interface MAC %x: %w", k.Mac, err)
		}
	}
	return p.writeIfMACs(links)
}

// writeIfMACs makes xlb_if_mac hold each link's MAC at its index (those
// below its size), for the XDP program's first compare; an index whose
// interface is gone, or has no Ethernet MAC, is cleared.
func (p *Plane) writeIfMACs(links []netlink.Link) error {
	m := p.objs.XlbIfMac
	want := map[uint32]xlbIfMac{}
	for _, l := range links {
		a := l.Attrs()
		if a.Index <= 0 || uint32(a.Index) >= m.MaxEntries() || len(a.HardwareAddr) != 6 {
			continue
		}
		v := xlbIfMac{Set: 1}
		copy(v.Mac[:], a.HardwareAddr)
		want[uint32(a.Index)] = v
	}
	for idx := range p.ifMACs {
		if _, ok := want[idx]; !ok {
			if err := m.Update(idx, xlbIfMac{}, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("clear the MAC of interface %d: %w", idx, err)
			}
		}
	}
	for idx, v := range want {
		if err := m.Update(idx, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write the MAC of interface %d: %w", idx, err)
		}
	}
	p.ifMACs = want
	return nil
}
