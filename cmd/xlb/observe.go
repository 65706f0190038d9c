package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/observe"
	"github.com/xlb-lb/xlb/internal/store"
)

// startObserve wires the daemon's metrics, rates and connection listing:
// the engine, the store and the API report to the metrics (the health
// monitor too: see SetChecks and ObserveCheck); the rate estimator samples
// the counters every 2 s. It serves /metrics without a key on metricsAddr
// (if not ""), and returns the metrics, what wires the API server and a
// function that stops everything it started.
func startObserve(ctx context.Context, log *slog.Logger, eng *engine.Engine, dp dataplane.Dataplane, st *store.Journal,
	metricsAddr string) (*observe.Metrics, func(*api.Server) *api.Server, func(), error) {
	rates := observe.NewRates(eng, log.With("component", "rates"))
	m := observe.New(observe.Options{Engine: eng, Log: log.With("component", "metrics"),
		Version: api.Version(), Dataplane: dp.Name(), Rates: rates})
	eng.SetObserver(m)
	st.SetSyncObserver(m.ObserveSync)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); rates.Run(ctx) }()
	var srv *http.Server
	if metricsAddr != "" {
		ln, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			cancel()
			<-done
			return nil, nil, nil, fmt.Errorf("listen for metrics on --metrics-listen %s: %w", metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", m)
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serve metrics", "err", err)
			}
		}()
		log.Info("serving metrics", "addr", ln.Addr().String())
	}
	wire := func(s *api.Server) *api.Server {
		s.SetRequestObserver(m)
		s.SetMetrics(m)
		s.SetRates(rates)
		return s
	}
	stop := func() {
		if srv != nil {
			sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer c()
			_ = srv.Shutdown(sctx)
		}
		cancel()
		<-done
	}
	return m, wire, stop, nil
}
