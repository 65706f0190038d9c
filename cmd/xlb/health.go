package main

import (
	"context"
	"log/slog"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/health"
)

// startHealth starts the health checks of the daemon's farms (active, and
// passive on the ebpf plane) and the event broker. It returns what wires
// both into the API server, the active checks' monitor (the BGP announcer
// reads its checks), and a function that stops the checks.
func startHealth(ctx context.Context, log *slog.Logger, eng *engine.Engine, dp dataplane.Dataplane, opts health.Options) (func(*api.Server) *api.Server, *health.Monitor, func()) {
	broker := events.NewBroker(events.DefaultKeep)
	eng.SetEvents(broker)
	c := health.Start(ctx, log, eng, dp, opts)
	wire := func(s *api.Server) *api.Server {
		s.SetChecks(c.Monitor)
		if c.Ejector != nil {
			s.SetPassive(c.Ejector)
		}
		s.SetEvents(broker)
		return s
	}
	return wire, c.Monitor, c.Stop
}
