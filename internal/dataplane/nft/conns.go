package nft

import (
	"context"

	"github.com/xlb-lb/xlb/internal/conntrack"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// The nft plane's connections are netfilter's conntrack entries of its
// namespace, listed, counted and deleted over netlink (internal/conntrack).
var (
	_ dataplane.ConnLister  = (*Plane)(nil)
	_ dataplane.ConnCounter = (*Plane)(nil)
)

// Connections implements dataplane.ConnLister.
func (s *Plane) Connections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) ([]dataplane.Conn, error) {
	return conntrack.Table{NS: s.opts.NetNS}.Connections(ctx, farms, flt)
}

// DeleteConnections implements dataplane.ConnLister.
func (s *Plane) DeleteConnections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) (int, error) {
	return conntrack.Table{NS: s.opts.NetNS}.DeleteConnections(ctx, farms, flt)
}

// CountConns implements dataplane.ConnCounter.
func (s *Plane) CountConns(ctx context.Context, farms []*model.Farm, owners *plan.ConnOwners) (dataplane.ConnTable, error) {
	return conntrack.Table{NS: s.opts.NetNS}.CountConns(ctx, farms, owners)
}
