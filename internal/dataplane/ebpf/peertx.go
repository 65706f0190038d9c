package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// peerTxLinks returns the ifindexes, among links, of the veth and netkit
// interfaces whose peer is in another network namespace: a link whose
// IFLA_LINK_NETNSID is set (vishvananda/netlink: NetNsID >= 0). Only there
// does bpf_redirect_peer work; the kernel drops a peer redirect to any other
// device (no ndo_get_peer_dev, or the peer in the same namespace).
func peerTxLinks(links []netlink.Link) map[uint32]bool {
	out := map[uint32]bool{}
	for _, l := range links {
		a := l.Attrs()
		if (l.Type() == "veth" || l.Type() == "netkit") && a.NetNsID >= 0 && a.Index > 0 {
			out[uint32(a.Index)] = true
		}
	}
	return out
}

// writePeerTx makes xlb_peer_tx hold exactly the namespace's interfaces
// that take a peer redirect (peerTxLinks). The program reads it when it
// resolves a flow's next hop (a flow's first packet, then once a second),
// so a change reaches tracked flows within a second.
func (p *Plane) writePeerTx() error {
	links, err := p.nl.LinkList()
	if err != nil {
		return fmt.Errorf("list interfaces for peer redirect: %w", err)
	}
	want := peerTxLinks(links)
	if p.opts.noPeerRedirect {
		clear(want)
	}
	var k, v uint32
	var stale []uint32
	it := p.objs.XlbPeerTx.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read peer redirect interfaces: %w", err)
	}
	for _, k := range stale {
		if err := p.objs.XlbPeerTx.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete peer redirect interface %d: %w", k, err)
		}
	}
	for idx := range want {
		if err := p.objs.XlbPeerTx.Update(idx, uint32(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write peer redirect interface %d: %w", idx, err)
		}
	}
	return p.writeBridgePorts(links, want)
}

// bridgePorts returns, for the bridges among links that do not filter
// VLANs, which port each MAC in fdb was learnt on (or added to), where that
// port takes a peer redirect (peer). The bridges' own addresses (permanent
// entries) and entries of the ports' own tables (self) are left out: a
// packet for them is for this namespace, not for a container.
func bridgePorts(links []netlink.Link, fdb []netlink.Neigh, peer map[uint32]bool) map[xlbBrPortKey]uint32 {
	bridges := map[int]bool{}
	for _, l := range links {
		if br, ok := l.(*netlink.Bridge); ok && (br.VlanFiltering == nil || !*br.VlanFiltering) {
			bridges[br.Attrs().Index] = true
		}
	}
	out := map[xlbBrPortKey]uint32{}
	for _, n := range fdb {
		if !bridges[n.MasterIndex] || n.Flags&unix.NTF_SELF != 0 || n.State&unix.NUD_PERMANENT != 0 ||
			len(n.HardwareAddr) != 6 || !peer[uint32(n.LinkIndex)] {
			continue
		}
		k := xlbBrPortKey{Bridge: uint32(n.MasterIndex)}
		copy(k.Mac[:], n.HardwareAddr)
		out[k] = uint32(n.LinkIndex)
	}
	return out
}

// writeBridgePorts makes xlb_br_port hold exactly bridgePorts (nothing
// without Options.BridgePortRedirect). Like xlb_peer_tx, the program reads
// it when it resolves a flow's next hop, so a MAC that moves to another
// port is followed within a second.
func (p *Plane) writeBridgePorts(links []netlink.Link, peer map[uint32]bool) error {
	want := map[xlbBrPortKey]uint32{}
	if p.opts.BridgePortRedirect && len(peer) > 0 {
		fdb, err := p.nl.NeighList(0, unix.AF_BRIDGE)
		if err != nil {
			return fmt.Errorf("list bridge forwarding entries: %w", err)
		}
		want = bridgePorts(links, fdb, peer)
	}
	var k xlbBrPortKey
	var v uint32
	var stale []xlbBrPortKey
	it := p.objs.XlbBrPort.Iterate()
	for it.Next(&k, &v) {
		if w, ok := want[k]; !ok || w != v {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read bridge ports: %w", err)
	}
	for _, k := range stale {
		if err := p.objs.XlbBrPort.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete bridge port of %x: %w", k.Mac, err)
		}
	}
	for k, port := range want {
		if err := p.objs.XlbBrPort.Update(k, port, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write bridge port of %x: %w", k.Mac, err)
		}
	}
	return nil
}

// startPeerTxWatch follows the namespace's interfaces while the plane
// runs: any link change (a container's veth created or deleted, a peer
// moved between namespaces) attaches the program to new interfaces and
// rewrites xlb_peer_tx from a fresh listing (linksChanged). While
// no plane runs (a daemon killed), the map stays as it was: interfaces
// created meanwhile take plain bpf_redirect, which is always safe.
func (p *Plane) startPeerTxWatch() error {
	ch := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	opts := netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case <-done: // closing: the socket's read fails
			default:
				p.log.Warn("watch interfaces for peer redirect", "err", err)
			}
		},
	}
	if p.ns >= 0 {
		ns := p.ns
		opts.Namespace = &ns
	}
	if err := netlink.LinkSubscribeWithOptions(ch, done, opts); err != nil {
		return fmt.Errorf("watch interfaces for peer redirect: %w", err)
	}
	// With BridgePortRedirect, the bridges' forwarding entries too (they
	// come as neighbour updates of family AF_BRIDGE, among ARP's and ND's).
	nch := make(chan netlink.NeighUpdate, 256)
	if p.opts.BridgePortRedirect {
		nopts := netlink.NeighSubscribeOptions{Namespace: opts.Namespace, ErrorCallback: opts.ErrorCallback}
		if err := netlink.NeighSubscribeWithOptions(nch, done, nopts); err != nil {
			close(done)
			for range ch {
			}
			return fmt.Errorf("watch bridge forwarding entries: %w", err)
		}
	} else {
		close(nch)
	}
	// Links that changed between attach's listing and the subscription.
	p.mu.Lock()
	err := p.linksChanged()
	p.mu.Unlock()
	if err != nil {
		close(done)
		for range ch {
		}
		for range nch {
		}
		return err
	}
	p.watchStop = done
	p.watchDone = make(chan struct{})
	go func() {
		defer close(p.watchDone)
		links, neighs := ch, nch
		for links != nil || neighs != nil {
			select {
			case _, ok := <-links:
				if !ok {
					links = nil
					continue
				}
			case n, ok := <-neighs:
				if !ok {
					neighs = nil
					continue
				}
				if n.Family != unix.AF_BRIDGE {
					continue // ARP and ND
				}
			}
			// Coalesce a burst of updates into one listing.
			for len(ch) > 0 {
				<-ch
			}
			for len(nch) > 0 {
				<-nch
			}
			p.mu.Lock()
			err := p.linksChanged()
			p.mu.Unlock()
			if err != nil {
				p.log.Warn("follow interface changes", "err", err)
			}
		}
	}()
	return nil
}

// stopPeerTxWatch stops the watch and waits for it.
func (p *Plane) stopPeerTxWatch() {
	if p.watchStop == nil {
		return
	}
	close(p.watchStop)
	<-p.watchDone
	p.watchStop = nil
}
