package main

import (
	"context"
	"errors"

	"github.com/xlb-lb/xlb/internal/setup"
)

// runCleanup is --cleanup: every object the proxy put in this namespace's
// kernel goes (setup.Cleanup, with the proxy's names: tables xlb-kube*,
// pins under /sys/fs/bpf/xlb-kube by default), and the command exits.
func (a *app) runCleanup(ctx context.Context, o kubeProxyOptions) error {
	if a.cleanup == nil {
		return errors.New("--cleanup: not available in this build")
	}
	removed, left, err := a.cleanup(ctx, o.dp)
	return setup.Report(a.out, removed, left, err)
}
