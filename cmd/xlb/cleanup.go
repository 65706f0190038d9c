package main

import (
	"context"
	"errors"
	"fmt"
)

// runCleanup is `xlb daemon --cleanup`: every object of xlb's in this
// namespace's kernel goes (setup.Cleanup), for both data planes, and the
// command exits. The saved state stays: a daemon started later programs
// it again.
func (a *app) runCleanup(ctx context.Context, o daemonOptions) error {
	if a.cleanup == nil {
		return errors.New("--cleanup: not available in this build")
	}
	removed, left, err := a.cleanup(ctx, o.dp)
	for _, r := range removed {
		fmt.Fprintf(a.out, "removed %s\n", r)
	}
	for _, l := range left {
		fmt.Fprintf(a.out, "still attached (held by another pin path or process): %s\n", l)
	}
	if len(removed) == 0 && err == nil {
		fmt.Fprintln(a.out, "nothing of xlb's in the kernel")
	}
	if err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	return nil
}
