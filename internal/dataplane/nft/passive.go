package nft

import (
	"context"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Passive checks on this plane: the handshakes of farms with a passive
// check are watched in netfilter's conntrack, through its events
// (conntrack.Passive, which listens only while such a farm exists).
var _ dataplane.PassiveReader = (*Plane)(nil)

// PassiveCounts implements dataplane.PassiveReader.
func (s *Plane) PassiveCounts(ctx context.Context) ([]dataplane.PassiveCount, error) {
	return s.passive.Counts(ctx)
}

// ResetPassive implements dataplane.PassiveReader.
func (s *Plane) ResetPassive(ctx context.Context, farm, backend string) error {
	return s.passive.Reset(ctx, farm, backend)
}

// watchPassive records the farms of a change that was applied: those with
// a passive check are watched. Callers hold s.mu.
func (s *Plane) watchPassive(d plan.Diff) {
	changed := false
	for _, c := range d.Changes {
		name := c.Name()
		if name == "" {
			continue
		}
		_, had := s.passiveFarms[name]
		if c.New != nil && c.New.Check != nil && c.New.Check.Passive != nil {
			s.passiveFarms[name] = c.New
			changed = true
		} else if had {
			delete(s.passiveFarms, name)
			changed = true
		}
	}
	if changed {
		s.setPassive()
	}
}

// watchPassiveAll makes the watched farms those of farms. Callers hold s.mu.
func (s *Plane) watchPassiveAll(farms []*model.Farm) {
	had := len(s.passiveFarms) > 0
	clear(s.passiveFarms)
	for _, f := range farms {
		if f.Check != nil && f.Check.Passive != nil {
			s.passiveFarms[f.Name] = f
		}
	}
	if had || len(s.passiveFarms) > 0 {
		s.setPassive()
	}
}

func (s *Plane) setPassive() {
	fs := make([]*model.Farm, 0, len(s.passiveFarms))
	for _, f := range s.passiveFarms {
		fs = append(fs, f)
	}
	s.passive.SetFarms(fs)
}
