// Command xlb is the xlb load balancer: `xlb daemon` runs it, and the other
// commands (farm, backend, list, dump, save, restore) manage it through its
// REST API, the only way in.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/xlb-lb/xlb/internal/setup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run executes one xlb command line and returns the exit code. Errors are
// printed as "xlb: <message>".
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{in: stdin, out: stdout, errOut: stderr, getenv: getenv, openDataplane: setup.Open,
		removeOtherPlane: setup.RemoveOtherPlane, cleanup: setup.Cleanup}
	return a.run(ctx, args)
}

func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCmd()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(a.errOut, "xlb: %s\n", err)
		return 1
	}
	return 0
}
