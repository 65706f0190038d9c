package dataplane

import (
	"context"

	"github.com/xlb-lb/xlb/internal/model"
)

// BackendFlusher is implemented by data planes that can cut a backend's
// established connections at once: the health checks' `on-down: flush`.
// The nft plane deletes them from the kernel's conntrack (internal/
// conntrack); the eBPF plane expires the flows of a backend whose
// effective state is down by itself, so it needs no flush.
type BackendFlusher interface {
	// FlushBackend deletes the tracked connections of farm f that were
	// sent to backend b, and returns how many it deleted.
	FlushBackend(ctx context.Context, f *model.Farm, b *model.Backend) (int, error)
}
