package dataplane

import (
	"context"

	"github.com/xlb-lb/xlb/internal/model"
)

// DriftWatcher is implemented by data planes that notice changes made to
// their kernel objects by anything but xlb itself (`nft flush ruleset`,
// firewalld, an iptables-nft restore, bpftool...). The engine believes its
// view of the kernel only while nothing else touches it: it reconciles
// after such a change, and never acknowledges a change on top of one.
type DriftWatcher interface {
	// WatchDrift starts watching the plane's kernel objects until ctx
	// ends. After each change by others it calls drifted, from the
	// watch's own goroutine, with what changed ("delete rule in chain
	// inet xlb-03 prerouting by nft (pid 4242)"). It returns once the
	// watch runs.
	WatchDrift(ctx context.Context, drifted func(what string)) error
	// DriftSeen returns how many changes by others the watch has seen
	// since it started (a count that only grows; events the watch lost
	// count as one), once it has seen every change the kernel committed
	// before the call. An error means it cannot tell: the caller must
	// assume the kernel drifted.
	DriftSeen(ctx context.Context) (uint64, error)
}

// DriftRepairer is implemented by data planes that can repair drift
// without reconciling everything: only the objects their watch saw
// others change (and everything when it cannot tell). Farms are all the
// farms, as for Reconcile; those the watch did not see touched are
// already in the kernel as given.
type DriftRepairer interface {
	RepairDrift(ctx context.Context, farms []*model.Farm) error
}
