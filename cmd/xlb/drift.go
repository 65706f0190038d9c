package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/xlb-lb/xlb/internal/engine"
)

// watchDrift starts the engine's drift watch, if on (changes to xlb's
// kernel objects by other programs are repaired within a second), and
// reconciles on SIGHUP, until ctx ends. A watch that cannot start is
// logged, not fatal: the daemon still serves, and repairs at SIGHUP,
// `xlb reconcile` or a restart.
func watchDrift(ctx context.Context, log *slog.Logger, eng *engine.Engine, on bool) {
	if !on {
		log.Warn("--drift-watch=false: changes to xlb's kernel objects by other programs are repaired only by xlb reconcile, SIGHUP or a restart")
	} else if ok, err := eng.WatchDrift(ctx); err != nil {
		log.Error("no drift watch: changes to xlb's kernel objects by other programs are repaired only by xlb reconcile, SIGHUP or a restart", "err", err)
	} else if ok {
		log.Info("watching xlb's kernel objects for changes by other programs")
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				n, err := eng.Reconcile(ctx)
				if err != nil {
					log.Error("SIGHUP: reconcile failed", "err", err)
					continue
				}
				log.Info("SIGHUP: kernel reconciled with the state", "farms", n)
			}
		}
	}()
}
