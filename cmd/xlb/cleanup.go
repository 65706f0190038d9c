package main

import (
	"context"
	"errors"

	"github.com/xlb-lb/xlb/internal/setup"
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
	return setup.Report(a.out, removed, left, err)
}
