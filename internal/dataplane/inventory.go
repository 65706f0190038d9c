package dataplane

import "context"

// KernelInventory is implemented by data planes that can tell, before
// their first Reconcile, whether the kernel holds farms of theirs. The
// daemon asks when its saved state is empty: a lost or mistyped
// --state-dir must not make the Reconcile delete every farm of a running
// balancer.
type KernelInventory interface {
	// KernelObjects describes the objects of this data plane in the
	// kernel that carry farms, one line each ("table inet xlb-03: 4
	// elements"); none when the kernel holds no farm of xlb's.
	KernelObjects(ctx context.Context) ([]string, error)
}
