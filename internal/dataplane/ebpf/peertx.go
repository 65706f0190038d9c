package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
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
	return nil
}

// startPeerTxWatch keeps xlb_peer_tx current while the plane runs: any
// link change in the namespace (a container's veth created or deleted, a
// peer moved between namespaces) rewrites it from a fresh listing. While
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
	// Links that changed between attach's listing and the subscription.
	p.mu.Lock()
	err := p.writePeerTx()
	p.mu.Unlock()
	if err != nil {
		close(done)
		for range ch {
		}
		return err
	}
	p.watchStop = done
	p.watchDone = make(chan struct{})
	go func() {
		defer close(p.watchDone)
		for range ch {
			// Coalesce a burst of updates into one listing.
			for len(ch) > 0 {
				<-ch
			}
			p.mu.Lock()
			err := p.writePeerTx()
			p.mu.Unlock()
			if err != nil {
				p.log.Warn("update peer redirect interfaces", "err", err)
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
