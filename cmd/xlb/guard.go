package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/store"
)

// A lost or mistyped --state-dir must not wipe the kernel: with an empty
// saved state, the start-up Reconcile would delete every farm the kernel
// holds. So a daemon whose saved state is empty asks the data plane
// whether the kernel holds farms of xlb's, and if it does, refuses to
// start unless --force-empty says to delete them.
//
// xlb cannot yet read farms back from the kernel (neither plane keeps
// farm names or every field there), so it cannot rebuild the saved state
// from it: the way back is the right --state-dir, a copy of the state
// directory, or an `xlb save` file (docs/operations.md).

// guardEmptyState returns an error if the saved state is empty, the
// kernel holds farms of xlb's and forceEmpty is not set. existed says
// whether the state directory was there before the daemon opened it.
func guardEmptyState(ctx context.Context, log *slog.Logger, dp dataplane.Dataplane, st *store.Journal, stateDir string, existed, forceEmpty bool) error {
	empty, err := st.Empty(ctx)
	if err != nil || !empty {
		return nil // engine.New reports what loading says
	}
	inv, ok := dp.(dataplane.KernelInventory)
	if !ok {
		return nil
	}
	objs, err := inv.KernelObjects(ctx)
	if err != nil {
		if forceEmpty {
			log.Warn("--force-empty: could not list xlb's objects in the kernel; starting empty", "err", err)
			return nil
		}
		return fmt.Errorf("the saved state in %s is empty, and whether the kernel holds farms of xlb's cannot be told (%v): refusing to start, as starting would delete them; pass --force-empty to start empty anyway", stateDir, err)
	}
	if len(objs) == 0 {
		return nil
	}
	if forceEmpty {
		log.Warn("--force-empty: the saved state is empty; deleting the farms the kernel holds", "state_dir", stateDir, "kernel", strings.Join(objs, "; "))
		return nil
	}
	what := "holds no farm"
	if !existed {
		what = "did not exist"
	}
	return fmt.Errorf("the state directory %s %s, but the kernel holds farms of xlb's (%s) that starting would delete. "+
		"If --state-dir is wrong, start with the right one; if the directory was lost, put back a copy of it, or start with "+
		"--force-empty and load an `xlb save` file with `xlb restore` (the farms stop being balanced in between). "+
		"--force-empty starts empty and deletes them. xlb cannot rebuild its saved state from the kernel",
		stateDir, what, strings.Join(objs, "; "))
}
