// Package fake is an in-memory data plane for engine tests that need to
// inject kernel failures (a real kernel cannot be made to fail on demand).
// Everything that checks traffic uses the real nft data plane instead.
package fake

import (
	"context"
	"errors"
	"sync"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Plane records the farms it holds, like a kernel would.
type Plane struct {
	mu      sync.Mutex
	farms   map[string]*model.Farm
	applies int
	// FailApply, when set, fails the next Apply calls for which it returns an error.
	FailApply func(d plan.Diff) error
	// FailReconcile, when set, fails Reconcile calls for which it returns an error.
	FailReconcile func(farms []*model.Farm) error
	// Refuse, when set, is the plane's Check.
	Refuse func(f *model.Farm) error
	// FailTables, when set, fails ApplyTables calls for which it returns
	// an error.
	FailTables func(d plan.TableDiff) error

	tables *tableKernel // tables.go

	// drift.go: Tamper's count, the watch's callback, and whether the
	// "table" is gone.
	tampered uint64
	drifted  func(string)
	gone     bool
}

// New returns an empty fake plane.
func New() *Plane { return &Plane{farms: map[string]*model.Farm{}} }

// ErrInjected is the error injected failures return.
var ErrInjected = errors.New("injected kernel failure")

func (p *Plane) Name() string { return "fake" }

func (p *Plane) Check(f *model.Farm) error {
	if p.Refuse != nil {
		return p.Refuse(f)
	}
	return nil
}

func (p *Plane) Apply(ctx context.Context, d plan.Diff) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.FailApply != nil {
		if err := p.FailApply(d); err != nil {
			return err
		}
	}
	if p.gone {
		return errGone
	}
	p.applies++
	for _, c := range d.Changes {
		if c.Old != nil {
			delete(p.farms, c.Old.Name)
		}
		if c.New != nil {
			p.farms[c.New.Name] = c.New
		}
	}
	return nil
}

func (p *Plane) Reconcile(ctx context.Context, farms []*model.Farm) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.FailReconcile != nil {
		if err := p.FailReconcile(farms); err != nil {
			return err
		}
	}
	p.farms = map[string]*model.Farm{}
	p.gone = false
	for _, f := range farms {
		p.farms[f.Name] = f
	}
	return nil
}

func (p *Plane) Close() error { return nil }

// Farms returns a copy of what the plane holds, by name.
func (p *Plane) Farms() map[string]*model.Farm {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]*model.Farm, len(p.farms))
	for k, v := range p.farms {
		out[k] = v
	}
	return out
}

// Applies counts successful Apply calls.
func (p *Plane) Applies() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applies
}
