package nft

import (
	"fmt"
	"net/netip"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// Family dual: a farm with an IPv4 and an IPv6 VIP (model.Farm.VirtualAddr2),
// each served by the backends of its family (nftables NAT cannot translate
// between families). The plane programs it as two farms, one per VIP, with
// everything else the same: the first keeps the farm's name, the second is
// named "<name>/ipv6" (or "/ipv4"), which no farm can be called ('/' is not
// allowed in names). So a dual farm has two chains, two backend maps and
// (with persistence) two session maps; its log lines name the half.

// halves returns the farms the plane programs for f: f itself, or for a
// family dual farm with two VIPs one farm per VIP. A source-addr applies to
// the half of its family; the other half masquerades. Nil gives nil.
func halves(f *model.Farm) []*model.Farm {
	if f == nil {
		return nil
	}
	if f.Family != model.FamilyDual || !f.VirtualAddr2.IsValid() {
		return []*model.Farm{f}
	}
	out := make([]*model.Farm, 0, 2)
	for i, vip := range f.VirtualAddrs() {
		h := f.Clone()
		h.VirtualAddr, h.VirtualAddr2 = vip, netip.Addr{}
		h.Family = model.FamilyIPv4
		if vip.Is6() {
			h.Family = model.FamilyIPv6
		}
		if i == 1 {
			h.Name = f.Name + "/" + h.Family.String()
		}
		if h.SourceAddr.IsValid() && h.SourceAddr.Is6() != vip.Is6() {
			h.SourceAddr = netip.Addr{}
		}
		h.Backends = h.Backends[:0]
		for _, b := range f.Backends {
			if b.Addr.Is6() == vip.Is6() {
				h.Backends = append(h.Backends, b)
			}
		}
		out = append(out, &h)
	}
	return out
}

// expandDiff returns d with every family dual farm split into its halves
// (halves of one farm change together; a half that is gone is removed).
func expandDiff(d dataplane.Diff) dataplane.Diff {
	var out dataplane.Diff
	for _, c := range d.Changes {
		olds, news := halves(c.Old), halves(c.New)
		if len(olds) <= 1 && len(news) <= 1 {
			out.Changes = append(out.Changes, c)
			continue
		}
		oldBy := map[string]*model.Farm{}
		for _, o := range olds {
			oldBy[o.Name] = o
		}
		for _, n := range news {
			out.Changes = append(out.Changes, dataplane.FarmChange{Old: oldBy[n.Name], New: n})
			delete(oldBy, n.Name)
		}
		for _, o := range olds {
			if _, gone := oldBy[o.Name]; gone {
				out.Changes = append(out.Changes, dataplane.FarmChange{Old: o})
			}
		}
	}
	return out
}

func expandFarms(farms []*model.Farm) []*model.Farm {
	out := make([]*model.Farm, 0, len(farms))
	for _, f := range farms {
		out = append(out, halves(f)...)
	}
	return out
}

// checkDual refuses a dual farm the plane cannot serve and checks each half.
func (p *Plane) checkDual(f *model.Farm) error {
	if !f.VirtualAddr2.IsValid() {
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "family", Value: f.Family.String(),
			Problem: "the " + PlaneName + " data plane serves a dual farm with an IPv4 and an IPv6 virtual-addr (e.g. \"10.0.0.1,fd00::1\"), each by the backends of its family: nftables cannot translate between families"}
	}
	for _, h := range halves(f) {
		if err := p.Check(h); err != nil {
			return err
		}
	}
	return nil
}

// dualSessions runs fn on each half of a dual farm that has the backend
// (any, when backend is "").
func dualSessions(f *model.Farm, backend string, fn func(h *model.Farm) error) error {
	for _, h := range halves(f) {
		if backend != "" {
			if _, i := h.Backend(backend); i < 0 {
				continue
			}
		}
		if err := fn(h); err != nil {
			return err
		}
	}
	return nil
}
