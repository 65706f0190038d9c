package main

import (
	"context"
	"log/slog"

	"github.com/xlb-lb/xlb/internal/cluster/bgp"
	"github.com/xlb-lb/xlb/internal/engine"
)

// startBGP starts the BGP speaker and its announcer (--bgp-config). The
// returned function blocks until the announcer has drained (every route
// withdrawn, DrainWait waited, sessions closed) after ctx ends.
func startBGP(ctx context.Context, log *slog.Logger, cfg *bgp.Config, eng *engine.Engine, checks bgp.Checks, gate bgp.Gate) (*bgp.Announcer, func(), error) {
	log = log.With("component", "bgp")
	sp, err := bgp.NewSpeaker(ctx, log, cfg)
	if err != nil {
		return nil, nil, err
	}
	an := bgp.NewAnnouncer(log, cfg, sp, eng, eng.Events(), checks, gate)
	done := make(chan struct{})
	go func() { defer close(done); an.Run(ctx) }()
	return an, func() { <-done }, nil
}
