package kube

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// kubeProxyMetrics are kube-proxy's own metric names (kubernetes
// pkg/proxy/metrics), with its buckets, so dashboards and alerts written for
// kube-proxy keep working next to xlb's xlb_kubeproxy_* metrics. A sync in
// xlb is one Service's transaction (kube-proxy's "partial" sync) or a full
// reconcile (its "full" sync).
type kubeProxyMetrics struct {
	syncDuration    prometheus.Histogram // every sync
	fullDuration    prometheus.Histogram
	partialDuration prometheus.Histogram
	// networkProgramming is measured from the informer seeing the change,
	// not from the EndpointSlice's last-change-trigger-time annotation
	// kube-proxy reads (which the test API server's objects lack).
	networkProgramming prometheus.Histogram
	lastSync           prometheus.Gauge
	lastQueued         prometheus.Gauge
	endpointsPending   prometheus.Gauge
	endpointsTotal     prometheus.Counter
	servicesPending    prometheus.Gauge
	servicesTotal      prometheus.Counter
}

func newKubeProxyMetrics(reg prometheus.Registerer) *kubeProxyMetrics {
	sync := prometheus.ExponentialBuckets(0.001, 2, 15)
	var prog []float64
	prog = append(prog, 0.25, 0.5)
	for i := 1; i <= 59; i++ {
		prog = append(prog, float64(i))
	}
	for i := 0; i < 12; i++ {
		prog = append(prog, 60+5*float64(i))
	}
	for i := 0; i < 7; i++ {
		prog = append(prog, 120+30*float64(i))
	}
	h := func(name, help string, b []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Subsystem: "kubeproxy", Name: name, Help: help, Buckets: b})
	}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: "kubeproxy", Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: name, Help: help})
	}
	m := &kubeProxyMetrics{
		syncDuration:       h("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds (xlb: one Service's transaction, or a full reconcile)", sync),
		fullDuration:       h("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", sync),
		partialDuration:    h("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs (xlb: one Service)", sync),
		networkProgramming: h("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds (xlb: from the informer seeing the change)", prog),
		lastSync:           g("sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced"),
		lastQueued:         g("sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued"),
		endpointsPending:   g("sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes"),
		endpointsTotal:     c("sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes"),
		servicesPending:    g("sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes"),
		servicesTotal:      c("sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes"),
	}
	reg.MustRegister(m.syncDuration, m.fullDuration, m.partialDuration, m.networkProgramming, m.lastSync,
		m.lastQueued, m.endpointsPending, m.endpointsTotal, m.servicesPending, m.servicesTotal)
	return m
}

// queued records a change seen by an informer (of a Service, or of an
// EndpointSlice when slice) and the changes now pending of each kind.
func (m *Metrics) queued(slice bool, now time.Time, servicesPending, slicesPending int) {
	if m == nil {
		return
	}
	k := m.kp
	if slice {
		k.endpointsTotal.Inc()
	} else {
		k.servicesTotal.Inc()
	}
	k.lastQueued.Set(float64(now.UnixNano()) / 1e9)
	k.servicesPending.Set(float64(servicesPending))
	k.endpointsPending.Set(float64(slicesPending))
}

// pendingKinds sets the pending changes of each kind after a sync.
func (m *Metrics) pendingKinds(servicesPending, slicesPending int) {
	if m == nil {
		return
	}
	m.kp.servicesPending.Set(float64(servicesPending))
	m.kp.endpointsPending.Set(float64(slicesPending))
}
