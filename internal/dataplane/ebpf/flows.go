package ebpf

import (
	"golang.org/x/sys/unix"

	"fmt"
	"net/netip"
)

// UDPFlow names the tracked UDP flows to VIP:Port that were sent to
// Backend.
type UDPFlow struct {
	VIP     netip.Addr
	Port    uint16
	Backend netip.Addr
}

// DeleteUDPFlows removes the tracked UDP flows (both conntrack entries) to
// each VIP:Port that were sent to its Backend, so the next datagram of such
// a flow is scheduled afresh. A configuration change never cuts tracked
// flows by itself; this is for a caller that knows a backend is gone for
// good (the Kubernetes proxy, when an endpoint goes away: a UDP client that
// keeps its source port would otherwise stay on it until the flow idles
// out). The table is walked once; it returns the number of flows removed.
func (p *Plane) DeleteUDPFlows(flows []UDPFlow) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	type fwd struct {
		vip  [4]uint32
		port uint16
		be   [4]uint32
	}
	want := map[fwd]bool{}
	for _, f := range flows {
		want[fwd{addrWords(f.VIP), ne16(f.Port), addrWords(f.Backend)}] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var k xlbCtKey
	var v xlbCtVal
	var del []xlbCtKey
	it := p.objs.XlbCt.Iterate()
	for it.Next(&k, &v) {
		if k.Proto != unix.IPPROTO_UDP || v.Dir != ctFwd || !want[fwd{k.Dst, k.Dport, v.Dst}] {
			continue
		}
		// The reply entry's key is the forward entry's value reversed
		// (ct_peer_key in bpf/xlb_lb.c).
		peer := xlbCtKey{Src: v.Dst, Dst: v.Src, Sport: v.Dport, Dport: v.Sport, Proto: k.Proto, Family: k.Family}
		del = append(del, k, peer)
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("walk the conntrack table: %w", err)
	}
	for i := range del {
		// Either entry may be gone already (LRU eviction, expiry).
		_ = p.objs.XlbCt.Delete(&del[i])
	}
	return len(del) / 2, nil
}
