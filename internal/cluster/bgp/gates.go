package bgp

import "context"

// JoinGates is a Gate open when every one of gates is (nil ones are left
// out; nil when none is left). Why it is closed is the first closed
// gate's reason. Its Changed channel forwards every gate's until ctx ends.
func JoinGates(ctx context.Context, gates ...Gate) Gate {
	var gs []Gate
	for _, g := range gates {
		if g != nil {
			gs = append(gs, g)
		}
	}
	switch len(gs) {
	case 0:
		return nil
	case 1:
		return gs[0]
	}
	j := &joined{gates: gs, changed: make(chan struct{}, 1)}
	for _, g := range gs {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-g.Changed():
					select {
					case j.changed <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return j
}

type joined struct {
	gates   []Gate
	changed chan struct{}
}

func (j *joined) Ready() (bool, string) {
	for _, g := range j.gates {
		if ok, why := g.Ready(); !ok {
			return false, why
		}
	}
	return true, ""
}

func (j *joined) Changed() <-chan struct{} { return j.changed }
