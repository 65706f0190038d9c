package fake

import (
	"context"
	"errors"
	"fmt"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

var _ dataplane.DriftWatcher = (*Plane)(nil)

// errGone is Apply's error while the fake's "table" is deleted.
var errGone = errors.New("no such table (deleted by another program)")

// WatchDrift implements dataplane.DriftWatcher: Tamper reports to drifted.
func (p *Plane) WatchDrift(ctx context.Context, drifted func(string)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drifted = drifted
	return nil
}

// DriftSeen implements dataplane.DriftWatcher: how many Tamper calls.
func (p *Plane) DriftSeen(ctx context.Context) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tampered, nil
}

// Tamper changes the plane as another program would: it deletes the
// farm named name, or with name "" every farm and the table they are in
// (Apply fails until a Reconcile makes it again). The watch hears of it
// on its own goroutine, later, as a real one does; DriftSeen at once.
func (p *Plane) Tamper(name string) {
	p.mu.Lock()
	if name == "" {
		p.farms = nil
		p.gone = true
	} else {
		delete(p.farms, name)
	}
	p.tampered++
	drifted := p.drifted
	p.mu.Unlock()
	if drifted != nil {
		go drifted(fmt.Sprintf("fake: farm %q deleted by hand", name))
	}
}
