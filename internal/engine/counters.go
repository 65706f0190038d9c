package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// NotSupportedError says the data plane cannot do what was asked (HTTP 501).
type NotSupportedError struct{ Msg string }

func (e *NotSupportedError) Error() string { return e.Msg }

// counterReader returns the data plane's counters, or why there are none.
func (e *Engine) counterReader() (dataplane.CounterReader, error) {
	cr, ok := e.dp.(dataplane.CounterReader)
	if !ok {
		return nil, &NotSupportedError{Msg: fmt.Sprintf("the %s data plane keeps no per-farm counters (the nft and ebpf data planes do)", e.dp.Name())}
	}
	return cr, nil
}

// Counters reads a farm's traffic counters (and its backends') from the
// data plane. Counters are kernel state: reading them takes no lock of the
// engine.
func (e *Engine) Counters(ctx context.Context, farm string) (*model.Farm, dataplane.FarmCounters, error) {
	f, ok := e.Snapshot().Farm(farm)
	if !ok {
		return nil, dataplane.FarmCounters{}, &NotFoundError{What: fmt.Sprintf("farm %q", farm)}
	}
	cr, err := e.counterReader()
	if err != nil {
		return nil, dataplane.FarmCounters{}, err
	}
	if !f.Listens() {
		return f, zeroCounters(f), nil // not in the kernel: nothing counted
	}
	c, err := cr.Counters(ctx, f)
	return f, c, notSupported(err)
}

// notSupported turns a plane's "no counters" into a NotSupportedError
// (HTTP 501).
func notSupported(err error) error {
	if errors.Is(err, dataplane.ErrNoCounters) {
		return &NotSupportedError{Msg: err.Error()}
	}
	return err
}

// zeroCounters are the counters of a farm the kernel does not hold.
func zeroCounters(f *model.Farm) dataplane.FarmCounters {
	c := dataplane.FarmCounters{Backends: make([]dataplane.BackendCounters, len(f.Backends))}
	for i, b := range f.Backends {
		c.Backends[i].Name = b.Name
	}
	return c
}

// AllCounters reads the counters of every farm, in the snapshot's order.
func (e *Engine) AllCounters(ctx context.Context) ([]*model.Farm, []dataplane.FarmCounters, error) {
	cr, err := e.counterReader()
	if err != nil {
		return nil, nil, err
	}
	farms := e.Snapshot().Farms()
	if br, ok := cr.(dataplane.BulkCounterReader); ok {
		// One read for every farm (the nft plane dumps its counter
		// sets once).
		out, err := br.AllCounters(ctx, farms)
		if err != nil {
			return nil, nil, notSupported(err)
		}
		for i, f := range farms {
			if !f.Listens() {
				out[i] = zeroCounters(f)
			}
		}
		return farms, out, nil
	}
	out := make([]dataplane.FarmCounters, len(farms))
	for i, f := range farms {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if !f.Listens() {
			out[i] = zeroCounters(f)
			continue
		}
		if out[i], err = cr.Counters(ctx, f); err != nil {
			return nil, nil, fmt.Errorf("farm %q: %w", f.Name, err)
		}
	}
	return farms, out, nil
}

// TableCounters reads the packets and bytes each entry of a table matched
// in the data plane (entries that never matched are left out).
func (e *Engine) TableCounters(ctx context.Context, name string) (*model.Table, dataplane.TableCounters, error) {
	t, ok := e.Snapshot().Table(name)
	if !ok {
		return nil, nil, &NotFoundError{What: fmt.Sprintf("table %q", name)}
	}
	cr, ok := e.dp.(dataplane.TableCounterReader)
	if !ok {
		return nil, nil, &NotSupportedError{Msg: fmt.Sprintf("the %s data plane keeps no per-entry counters (the ebpf and nft data planes do)", e.dp.Name())}
	}
	c, err := cr.TableCounters(ctx, t)
	if err != nil {
		return nil, nil, fmt.Errorf("read counters of table %q: %w", name, err)
	}
	return t, c, nil
}
