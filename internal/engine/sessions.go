package engine

import (
	"context"
	"fmt"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// sessionFarm returns the farm whose sessions are asked for and the data
// plane's session store, or why there is none. A farm that keeps no
// sessions (no persistence, or it listens nowhere) has a nil store: it has
// none to list or delete.
func (e *Engine) sessionFarm(farm, backend string) (*model.Farm, dataplane.SessionStore, error) {
	f, ok := e.Snapshot().Farm(farm)
	if !ok {
		return nil, nil, &NotFoundError{What: fmt.Sprintf("farm %q", farm)}
	}
	if backend != "" {
		if _, i := f.Backend(backend); i < 0 {
			return nil, nil, &NotFoundError{What: fmt.Sprintf("farm %q backend %q", farm, backend)}
		}
	}
	if f.Persistence == 0 || !f.Listens() {
		// No sessions to list or delete (nftlb answers an empty list).
		return f, nil, nil
	}
	ss, ok := e.dp.(dataplane.SessionStore)
	if !ok {
		return nil, nil, &model.FieldError{Object: fmt.Sprintf("farm %q", farm), Field: "persistence", Value: f.Persistence.String(),
			Problem: fmt.Sprintf("the %s data plane cannot list or delete sessions", e.dp.Name())}
	}
	return f, ss, nil
}

// Sessions lists a farm's persistence sessions as the data plane holds
// them. Sessions are kernel state, not desired state: reading them takes
// no lock of the engine.
func (e *Engine) Sessions(ctx context.Context, farm string) ([]dataplane.Session, error) {
	f, ss, err := e.sessionFarm(farm, "")
	if err != nil || ss == nil {
		return nil, err
	}
	return ss.Sessions(ctx, f)
}

// DeleteSessions deletes a farm's sessions of one client (client not "")
// or of one backend (backend not ""), so those clients are scheduled again
// on their next connection. It returns how many were deleted.
func (e *Engine) DeleteSessions(ctx context.Context, farm, client, backend string) (int, error) {
	f, ss, err := e.sessionFarm(farm, backend)
	if err != nil || ss == nil {
		return 0, err
	}
	return ss.DeleteSessions(ctx, f, client, backend)
}

// FlushSessions deletes every session of a farm (nftlb's DELETE
// /farms/{name}/sessions), one client at a time, and returns how many it
// deleted. Sessions that expire meanwhile are not counted.
func (e *Engine) FlushSessions(ctx context.Context, farm string) (int, error) {
	f, ss, err := e.sessionFarm(farm, "")
	if err != nil || ss == nil {
		return 0, err
	}
	list, err := ss.Sessions(ctx, f)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, s := range list {
		if s.Static {
			continue // configuration, not kernel state
		}
		n, err := ss.DeleteSessions(ctx, f, s.Client, "")
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}
