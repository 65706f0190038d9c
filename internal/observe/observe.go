// Package observe makes what xlb does visible: Prometheus metrics
// (GET /metrics on the daemon and on the Kubernetes proxy), traffic rates
// estimated as IPVS does (`xlb list --rate`), and the per-backend
// connection counts of the listing. Events (health transitions) are
// internal/events'; connection listing is the engine's and the planes'.
//
// Nothing here costs anything per packet or per change beyond a few
// histogram observations: per-farm and per-backend metrics are read at
// scrape time from the engine's snapshot, the health table and the data
// plane's counters.
//
// Other components register their own metrics with Registerer (names
// xlb_<component>_..., e.g. xlb_api_auth_failures_total); they are served
// with the rest.
package observe

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/health"
	"github.com/xlb-lb/xlb/internal/model"
)

// CheckStatus gives the last check of a checked backend (the health
// monitor).
type CheckStatus interface {
	Status(farm, backend string) (health.Status, bool)
}

// Options configure Metrics.
type Options struct {
	Engine *engine.Engine
	Log    *slog.Logger
	// Registry holds the metrics of other components (the Kubernetes
	// proxy's xlb_kubeproxy_*); nil: a new one. Go runtime and process
	// collectors are added to it unless NoRuntime.
	Registry  *prometheus.Registry
	NoRuntime bool
	// Checks, when set, gives each checked backend's last check.
	Checks CheckStatus
	// Version and Dataplane label xlb_build_info.
	Version, Dataplane string
	// ConnWalkEvery is the shortest time between two walks of the
	// connection table for the active/inactive counts (a scrape in
	// between reuses the last walk). Default 1 s.
	ConnWalkEvery time.Duration
	// Rates, when set, is the rate estimator, which reads every counter
	// every 2 s: a scrape serves its last read (if under two ticks old)
	// rather than read the plane again. On the nft plane a read of 1,000
	// farms of 10 backends takes 0.1-0.2 s (a dump of its counter sets).
	Rates *RateEstimator
}

// Metrics serves xlb's Prometheus metrics.
type Metrics struct {
	opts Options
	reg  *prometheus.Registry

	changeDur, kernelDur, diskDur prometheus.Histogram
	changeFailures                prometheus.Counter
	fsyncDur                      prometheus.Histogram
	apiRequests                   *prometheus.CounterVec
	apiDur                        *prometheus.HistogramVec
	checkDur                      *prometheus.HistogramVec
	// checkObs: checkDur's histogram of each check type and result
	// (fail 0, pass 1), looked up once: at 10,000 checks a second the
	// label values' hashing and lookup per check were a few per cent of
	// the checker's CPU in a profile (bench/results/health-cpu.md).
	checkObsMu    sync.Mutex
	checkObs      [256][2]prometheus.Observer
	collectDur    prometheus.Gauge
	collectErrors *prometheus.CounterVec

	conns connCache

	checksMu sync.Mutex // guards opts.Checks (SetChecks)

	bufMu   sync.Mutex
	lastLen int // size of the last exposition, to size the next buffer
}

// latencyBuckets span 50 µs to ~3 s: an engine change is about 1-2 ms, an
// fsync about 0.7 ms on this project's VM, a restore of 16,000 farms 0.3 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.00005, 2, 17)

// New creates the metrics and registers them.
func New(o Options) *Metrics {
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.ConnWalkEvery <= 0 {
		o.ConnWalkEvery = time.Second
	}
	m := &Metrics{opts: o, reg: o.Registry}
	m.changeDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "xlb_engine_change_duration_seconds", Buckets: latencyBuckets,
		Help: "Time of a committed change from the start of its transaction to its publication (kernel and disk run at once).",
	})
	m.kernelDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "xlb_engine_kernel_duration_seconds", Buckets: latencyBuckets,
		Help: "Time the data plane took to apply a change (one kernel transaction), committed or not.",
	})
	m.diskDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "xlb_engine_store_duration_seconds", Buckets: latencyBuckets,
		Help: "Time the store took to save a change (encode, write, fdatasync), committed or not.",
	})
	m.changeFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "xlb_engine_change_failures_total",
		Help: "Changes the kernel or the disk refused (nothing of them was kept).",
	})
	m.fsyncDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "xlb_store_fsync_duration_seconds", Buckets: latencyBuckets,
		Help: "Time of each fdatasync of the state journal (one per change).",
	})
	m.apiRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "xlb_api_requests_total",
		Help: "REST API requests by method, route (the API's path pattern) and status code.",
	}, []string{"method", "route", "code"})
	m.apiDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "xlb_api_request_duration_seconds", Buckets: latencyBuckets,
		Help: "Time to serve a REST API request (event streams: until they end).",
	}, []string{"method", "route"})
	m.checkDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "xlb_check_duration_seconds", Buckets: latencyBuckets,
		Help: "Time of each health check by check type and result (pass, fail); a failed check that timed out takes its timeout.",
	}, []string{"type", "result"})
	m.collectDur = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "xlb_metrics_farms_collect_seconds",
		Help: "Time the last scrape took to read the farm and backend metrics (snapshot, health, counters, connection table).",
	})
	m.collectErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "xlb_metrics_collect_errors_total",
		Help: "Scrapes that could not read a source of farm metrics (the metrics of that source were left out).",
	}, []string{"source"})
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "xlb_build_info", Help: "xlb's version and data plane (always 1).",
		ConstLabels: prometheus.Labels{"version": o.Version, "dataplane": o.Dataplane},
	})
	build.Set(1)
	m.reg.MustRegister(m.changeDur, m.kernelDur, m.diskDur, m.changeFailures, m.fsyncDur,
		m.apiRequests, m.apiDur, m.checkDur, m.collectDur, m.collectErrors, build)
	if !o.NoRuntime {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// Registerer is where other components register their metrics (names
// xlb_<component>_...); they are served with the rest.
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

// ObserveChange implements engine.ChangeObserver.
func (m *Metrics) ObserveChange(c engine.ChangeStats) {
	m.kernelDur.Observe(c.Kernel.Seconds())
	m.diskDur.Observe(c.Disk.Seconds())
	if c.Err != nil {
		m.changeFailures.Inc()
		return
	}
	m.changeDur.Observe(c.Total.Seconds())
}

// ObserveCheck records one health check (health.Options.Observe).
func (m *Metrics) ObserveCheck(typ model.CheckType, r health.Result) {
	i := 0
	if r.OK {
		i = 1
	}
	m.checkObsMu.Lock()
	o := m.checkObs[typ][i]
	if o == nil {
		o = m.checkDur.WithLabelValues(typ.String(), [2]string{"fail", "pass"}[i])
		m.checkObs[typ][i] = o
	}
	m.checkObsMu.Unlock()
	o.Observe(r.Took.Seconds())
}

// SetChecks gives the metrics the health monitor, for each checked
// backend's last check (created after the metrics, as it reports to them).
func (m *Metrics) SetChecks(c CheckStatus) {
	m.checksMu.Lock()
	defer m.checksMu.Unlock()
	m.opts.Checks = c
}

func (m *Metrics) checks() CheckStatus {
	m.checksMu.Lock()
	defer m.checksMu.Unlock()
	return m.opts.Checks
}

// ObserveSync records one fdatasync of the store's journal.
func (m *Metrics) ObserveSync(d time.Duration) { m.fsyncDur.Observe(d.Seconds()) }

// ObserveRequest records one API request (api.RequestObserver).
func (m *Metrics) ObserveRequest(method, route string, code int, d time.Duration) {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions:
	default:
		method = "other" // the label's values stay bounded whatever clients send
	}
	m.apiRequests.WithLabelValues(method, route, strconv.Itoa(code)).Inc()
	m.apiDur.WithLabelValues(method, route).Observe(d.Seconds())
}

// contentType is the text exposition format (version 0.0.4), which every
// Prometheus reads.
var contentType = string(expfmt.NewFormat(expfmt.TypeTextPlain))

// ServeHTTP serves the metrics in the text exposition format: the
// registry's (client_golang), then the farm and backend families, which
// are written directly: 1,000 farms of 10 backends are about 150,000
// samples, and client_golang's const metrics cost about 3.7 µs each to
// create, gather and encode (measured: 366 ms a scrape), the direct
// writer a fraction of that (BenchmarkScrape).
func (m *Metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reg, farms, err := m.expose(r.Context())
	if err != nil {
		http.Error(w, "collect metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(reg)+len(farms)))
	w.Write(reg)
	w.Write(farms)
}

// Expose returns the whole exposition.
func (m *Metrics) Expose(ctx context.Context) ([]byte, error) {
	reg, farms, err := m.expose(ctx)
	return append(reg, farms...), err
}

// expose returns the registry's families and the farm families.
func (m *Metrics) expose(ctx context.Context) ([]byte, []byte, error) {
	m.bufMu.Lock()
	size := m.lastLen + m.lastLen/8
	m.bufMu.Unlock()
	// The farm families first: their collection time is then part of
	// the registry's exposition (xlb_metrics_farms_collect_seconds).
	start := time.Now()
	farms := m.appendFarms(ctx, make([]byte, 0, max(size, 16<<10)))
	m.collectDur.Set(time.Since(start).Seconds())
	m.bufMu.Lock()
	m.lastLen = len(farms)
	m.bufMu.Unlock()
	mfs, err := m.reg.Gather()
	if err != nil {
		// Gather returns what it could with the error; serve that.
		m.opts.Log.Warn("gather metrics", "err", err)
	}
	buf := bytes.NewBuffer(make([]byte, 0, 32<<10))
	enc := expfmt.NewEncoder(buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, nil, err
		}
	}
	return buf.Bytes(), farms, nil
}
