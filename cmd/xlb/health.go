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
// event broker. It returns what wires both into the API server, and a
// function that stops the monitor.
func startHealth(ctx context.Context, log *slog.Logger, eng *engine.Engine, dp dataplane.Dataplane) (func(*api.Server) *api.Server, func()) {
	broker := events.NewBroker(events.DefaultKeep)
	eng.SetEvents(broker)
	mon := health.New(log.With("component", "health"), eng, health.Options{})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); mon.Run(ctx) }()
	go func() { defer wg.Done(); mon.Watch(ctx, eng) }()
	// Passive checks, on a plane that watches handshakes (ebpf).
	var ej *health.Ejector
	if r, ok := dp.(dataplane.PassiveReader); ok {
		ej = health.NewEjector(log.With("component", "passive"), eng, r, 0)
		wg.Add(2)
		go func() { defer wg.Done(); ej.Run(ctx) }()
		go func() { defer wg.Done(); ej.Watch(ctx, eng) }()
	}
	wire := func(s *api.Server) *api.Server {
		s.SetChecks(mon)
		if ej != nil {
			s.SetPassive(ej)
		}
		s.SetEvents(broker)
		return s
	}
	return wire, func() { cancel(); wg.Wait() }
}
