package dataplane

import (
	"context"

	"github.com/xlb-lb/xlb/internal/model"
)

// FlowFlusher is implemented by what can cut a backend's established
// connections at once: the health checks' `on-down: flush`. A data plane
// may implement it; the engine can also be given one (the nft plane's
// connections live in the kernel's conntrack, deleted over netlink by
// internal/conntrack).
type FlowFlusher interface {
	// FlushBackend deletes the tracked connections of farm f that were
	// sent to backend b, and returns how many it deleted.
	FlushBackend(ctx context.Context, f *model.Farm, b *model.Backend) (int, error)
}
