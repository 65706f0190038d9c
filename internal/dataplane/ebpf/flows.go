package ebpf

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

var _ dataplane.FlowFlusher = (*Plane)(nil)

// DeleteUDPFlows implements dataplane.FlowFlusher: it removes the tracked
// UDP flows (both conntrack entries) to each VIP:Port that were sent to its
// Backend. The table is walked once.
func (p *Plane) DeleteUDPFlows(ctx context.Context, flows []dataplane.StaleFlow) (int, error) {
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
		if err := ctx.Err(); err != nil {
			return 0, err
		}
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
