package health

import (
	"context"
	"log/slog"
	"sync"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
)

// Checkers are the running health checks of one engine: the active
// checks' monitor and, on a plane that watches handshakes, the passive
// checks' ejector (nil otherwise).
type Checkers struct {
	Monitor *Monitor
	Ejector *Ejector
	stop    func()
}

// Start runs the checks of eng's farms (active ones, and passive ones when
// dp is a dataplane.PassiveReader) until ctx ends or Stop. Both binaries
// (xlb daemon, xlb kube-proxy) start them the same way.
func Start(ctx context.Context, log *slog.Logger, eng *engine.Engine, dp dataplane.Dataplane, opts Options) *Checkers {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	c := &Checkers{Monitor: New(log.With("component", "health"), eng, opts)}
	run := func(fn func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); fn(ctx) }()
	}
	run(c.Monitor.Run)
	run(func(ctx context.Context) { c.Monitor.Watch(ctx, eng) })
	if r, ok := dp.(dataplane.PassiveReader); ok {
		c.Ejector = NewEjector(log.With("component", "passive"), eng, r, 0)
		run(c.Ejector.Run)
		run(func(ctx context.Context) { c.Ejector.Watch(ctx, eng) })
	}
	c.stop = func() { cancel(); wg.Wait() }
	return c
}

// Stop ends the checks and waits for them.
func (c *Checkers) Stop() { c.stop() }
