package ebpf

import (
	"net/netip"

	"github.com/xlb-lb/xlb/internal/model"
)

// Hairpin masquerade: a backend of a dnat farm that connects to the farm's
// VIP and is given itself would get a packet from its own address, answer
// itself directly, and the connection would never complete (kube-proxy
// masquerades this: a Pod reaching its own Service). The program then
// handles the flow as mode snat (lb_flow_mode in bpf/xlb_lb.c), from the
// backend entry's snat address, which for dnat farms is filled for this
// only: the LB's address towards the backend.

// sourceCache memoizes sourceFor over one Apply or Reconcile: a full
// reconcile of a large cluster asks for the same Pod addresses from many
// farms (cluster IP, node ports, external IPs of one Service), and each
// answer is a netlink round trip.
type sourceCache map[netip.Addr]netip.Addr

// hairpinSource returns the snat address of a dnat farm's backend entry:
// the LB's address towards it, or the zero address when there is no route
// (the program then leaves a hairpin flow unmasqueraded, as before).
func (p *Plane) hairpinSource(f *model.Farm, b netip.Addr, cache sourceCache) netip.Addr {
	if f.Mode != model.ModeDNAT {
		return netip.Addr{}
	}
	if src, ok := cache[b]; ok {
		return src
	}
	src, err := p.sourceFor(b)
	if err != nil {
		src = netip.Addr{}
	}
	if cache != nil {
		cache[b] = src
	}
	return src
}
