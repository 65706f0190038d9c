package nft

import (
	"context"

	"github.com/xlb-lb/xlb/internal/conntrack"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// The nft plane's connections are netfilter's conntrack entries of its
// namespace (conntrack is per namespace, not per table).
var (
	_ dataplane.FlowFlusher    = (*Plane)(nil)
	_ dataplane.BackendFlusher = (*Plane)(nil)
)

// DeleteUDPFlows implements dataplane.FlowFlusher: it deletes the UDP
// entries whose original destination is VIP:Port and whose reply comes
// from Backend.
func (s *Plane) DeleteUDPFlows(ctx context.Context, flows []dataplane.StaleFlow) (int, error) {
	return conntrack.DeleteUDPFlows(ctx, s.opts.NetNS, flows)
}

// FlushBackend implements dataplane.BackendFlusher: it deletes the entries
// of f's connections to b.
func (s *Plane) FlushBackend(ctx context.Context, f *model.Farm, b *model.Backend) (int, error) {
	return conntrack.Flusher{NS: s.opts.NetNS}.FlushBackend(ctx, f, b)
}
