// Command xlb-kube-proxy is `xlb kube-proxy`: xlb as the Kubernetes service
// proxy. It is a binary of its own, which `xlb kube-proxy` runs, because
// client-go and its API types take milliseconds to initialise in every
// process that links them, and `xlb dump` or `xlb list` should not pay
// for that on each call.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/xlb-lb/xlb/internal/setup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := &app{errOut: os.Stderr, out: os.Stdout, getenv: os.Getenv, removeOtherPlane: setup.RemoveOtherPlane, cleanup: setup.Cleanup}
	cmd := a.kubeProxyCmd()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetArgs(os.Args[1:])
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "xlb kube-proxy: %s\n", err)
		os.Exit(1)
	}
}

// app is what the command needs from its process.
type app struct {
	errOut, out io.Writer
	getenv      func(string) string
	// removeOtherPlane and cleanup act on the current namespace's
	// kernel (package setup); nil: skipped.
	removeOtherPlane func(ctx context.Context, log *slog.Logger, c setup.Flags) error
	cleanup          func(ctx context.Context, c setup.Flags) (removed, left []string, err error)
}

// defaultStateDir is xlb daemon's default; the proxy keeps its state below.
const defaultStateDir = "/var/lib/xlb"
