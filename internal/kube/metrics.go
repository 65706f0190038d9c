package kube

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the controller's Prometheus metrics, named after kube-proxy's
// (kubeproxy_sync_proxy_rules_*) under the xlb_kubeproxy_ prefix. A nil
// *Metrics records nothing.
type Metrics struct {
	syncDuration    prometheus.Histogram
	queueLatency    prometheus.Histogram
	fullDuration    prometheus.Histogram
	lastSync        prometheus.Gauge
	lastFullSync    prometheus.Gauge
	pending         prometheus.Gauge
	farms           prometheus.Gauge
	errors          prometheus.Counter
	rejectedChanges prometheus.Counter
	kp              *kubeProxyMetrics
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	// 0.1 ms to ~3 s: one Service's sync is expected in well under 10 ms.
	buckets := prometheus.ExponentialBuckets(0.0001, 2, 16)
	m := &Metrics{
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "xlb_kubeproxy_sync_proxy_rules_duration_seconds", Buckets: buckets,
			Help: "Time to translate one Service and apply its farms to the kernel (one engine transaction).",
		}),
		queueLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "xlb_kubeproxy_network_programming_duration_seconds", Buckets: buckets,
			Help: "Time from the informer seeing a change of a Service or its EndpointSlices until its farms are in the kernel.",
		}),
		fullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "xlb_kubeproxy_full_sync_duration_seconds", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
			Help: "Time of a full reconcile of every Service (at start and after errors).",
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xlb_kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			Help: "Unix time of the last sync (of one Service or of all).",
		}),
		lastFullSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xlb_kubeproxy_full_sync_last_timestamp_seconds",
			Help: "Unix time of the last full reconcile.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xlb_kubeproxy_sync_proxy_rules_pending_changes",
			Help: "Services whose changes are waiting to be applied.",
		}),
		farms: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xlb_kubeproxy_farms",
			Help: "Farms programmed for Services.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xlb_kubeproxy_sync_errors_total",
			Help: "Syncs that failed in the kernel or on disk (each is followed by a full reconcile).",
		}),
		rejectedChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xlb_kubeproxy_rejected_changes_total",
			Help: "Service syncs that could not program a Service as asked (invalid or refused annotations: the defaults serve; farms refused by the data plane or clashing with another Service: left out).",
		}),
	}
	reg.MustRegister(m.syncDuration, m.queueLatency, m.fullDuration, m.lastSync, m.lastFullSync,
		m.pending, m.farms, m.errors, m.rejectedChanges)
	m.kp = newKubeProxyMetrics(reg)
	return m
}

func (m *Metrics) synced(took, sinceQueued time.Duration, now time.Time, pending int) {
	if m == nil {
		return
	}
	m.syncDuration.Observe(took.Seconds())
	m.queueLatency.Observe(sinceQueued.Seconds())
	m.lastSync.Set(float64(now.UnixNano()) / 1e9)
	m.pending.Set(float64(pending))
	m.kp.syncDuration.Observe(took.Seconds())
	m.kp.partialDuration.Observe(took.Seconds())
	m.kp.networkProgramming.Observe(sinceQueued.Seconds())
	m.kp.lastSync.Set(float64(now.UnixNano()) / 1e9)
}

func (m *Metrics) fullSynced(took time.Duration, now time.Time) {
	if m == nil {
		return
	}
	m.fullDuration.Observe(took.Seconds())
	m.lastSync.Set(float64(now.UnixNano()) / 1e9)
	m.lastFullSync.Set(float64(now.UnixNano()) / 1e9)
	m.kp.syncDuration.Observe(took.Seconds())
	m.kp.fullDuration.Observe(took.Seconds())
	m.kp.lastSync.Set(float64(now.UnixNano()) / 1e9)
}

func (m *Metrics) setPending(n int) {
	if m != nil {
		m.pending.Set(float64(n))
	}
}

func (m *Metrics) syncError() {
	if m != nil {
		m.errors.Inc()
	}
}

func (m *Metrics) rejected() {
	if m != nil {
		m.rejectedChanges.Inc()
	}
}
