package nft

import (
	"fmt"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Family dual: the plane programs a dual farm as its two halves
// (plan.Halves), one per VIP, so a dual farm has two chains, two backend
// maps and (with persistence) two session maps; its log lines name the
// half.

// checkDual refuses a dual farm the plane cannot serve and checks each half.
func (p *Plane) checkDual(f *model.Farm) error {
	if !f.VirtualAddr2.IsValid() {
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "family", Value: f.Family.String(),
			Problem: "the " + PlaneName + " data plane serves a dual farm with an IPv4 and an IPv6 virtual-addr (e.g. \"10.0.0.1,fd00::1\"), each by the backends of its family: nftables cannot translate between families"}
	}
	for _, h := range plan.Halves(f) {
		if err := p.Check(h); err != nil {
			return err
		}
	}
	return nil
}

// dualSessions runs fn on each half of a dual farm that has the backend
// (any, when backend is "").
func dualSessions(f *model.Farm, backend string, fn func(h *model.Farm) error) error {
	for _, h := range plan.Halves(f) {
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
