package plan

import (
	"net/netip"
	"strings"

	"github.com/xlb-lb/xlb/internal/model"
)

// Family dual: a farm with an IPv4 and an IPv6 VIP (model.Farm.VirtualAddr2),
// each served by the backends of its family. Neither plane translates
// between families (that would be NAT64, which no nftables NAT expression
// and no part of the eBPF program does), and none is needed: a client of
// the IPv4 VIP goes to an IPv4 backend, one of the IPv6 VIP to an IPv6
// backend. So a plane programs a dual farm as two farms, its halves, one
// per VIP, with everything else the same.
//
// The first half keeps the farm's name; the second is named
// "<name>/ipv6" (or "/ipv4"), which no farm can be called ('/' is not
// allowed in names). A plane that names kernel objects, counters or log
// lines after a farm names them after the half.

// Halves returns the farms a plane programs for f: f itself, or for a
// family dual farm with two VIPs one farm per VIP. A source-addr applies
// to the half of its family; the other half uses the LB's address. Nil
// gives nil.
func Halves(f *model.Farm) []*model.Farm {
	if f == nil {
		return nil
	}
	if !IsDual(f) {
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

// IsDual reports whether f is a family dual farm with both VIPs, which
// Halves splits.
func IsDual(f *model.Farm) bool {
	return f.Family == model.FamilyDual && f.VirtualAddr2.IsValid()
}

// FarmOf returns the name of the farm a half of that name belongs to (the
// name itself for a farm that is not split).
func FarmOf(half string) string {
	name, _, _ := strings.Cut(half, "/")
	return name
}

// SplitDiff returns d with every family dual farm split into its halves
// (the halves of one farm change together; a half that is gone is
// removed). A diff without dual farms is returned as it is.
func SplitDiff(d Diff) Diff {
	dual := false
	for _, c := range d.Changes {
		dual = dual || c.Old != nil && IsDual(c.Old) || c.New != nil && IsDual(c.New)
	}
	if !dual {
		return d
	}
	var out Diff
	for _, c := range d.Changes {
		olds, news := Halves(c.Old), Halves(c.New)
		if len(olds) <= 1 && len(news) <= 1 {
			out.Changes = append(out.Changes, c)
			continue
		}
		oldBy := map[string]*model.Farm{}
		for _, o := range olds {
			oldBy[o.Name] = o
		}
		for _, n := range news {
			out.Changes = append(out.Changes, FarmChange{Old: oldBy[n.Name], New: n})
			delete(oldBy, n.Name)
		}
		for _, o := range olds {
			if _, gone := oldBy[o.Name]; gone {
				out.Changes = append(out.Changes, FarmChange{Old: o})
			}
		}
	}
	return out
}

// SplitFarms returns farms with every family dual farm split into its
// halves.
func SplitFarms(farms []*model.Farm) []*model.Farm {
	out := make([]*model.Farm, 0, len(farms))
	for _, f := range farms {
		out = append(out, Halves(f)...)
	}
	return out
}
