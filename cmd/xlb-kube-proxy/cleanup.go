package main

import (
	"context"
	"errors"
	"fmt"
)

// runCleanup is --cleanup: every object the proxy put in this namespace's
// kernel goes (setup.Cleanup, with the proxy's names: tables xlb-kube*,
// pins under /sys/fs/bpf/xlb-kube by default), and the command exits.
func (a *app) runCleanup(ctx context.Context, o kubeProxyOptions) error {
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
	if err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	return nil
}
