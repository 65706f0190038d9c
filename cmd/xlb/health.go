package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/health"
)

// startHealth starts the health monitor of the daemon's farms and the
// event broker. It returns what wires both into the API server, the
// monitor (the BGP announcer reads its checks), and a function that stops
// the monitor.
func startHealth(ctx context.Context, log *slog.Logger, eng *engine.Engine, dp dataplane.Dataplane) (func(*api.Server) *api.Server, *health.Monitor, func()) {
	broker := events.NewBroker(events.DefaultKeep)
	eng.SetEvents(broker)
	mon := health.New(log.With("component", "health"), eng, health.Options{})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); mon.Run(ctx) }()
	go func() { defer wg.Done(); mon.Watch(ctx, eng) }()
	wire := func(s *api.Server) *api.Server {
		s.SetChecks(mon)
		s.SetEvents(broker)
		return s
	}
	return wire, mon, func() { cancel(); wg.Wait() }
}
