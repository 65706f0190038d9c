package kube

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
)

// kube-proxy's /healthz and /livez (kubernetes pkg/proxy/healthcheck,
// ProxyHealthServer): the same paths, status codes, JSON bodies and
// headers, so probes and scripts written for kube-proxy read them.

// toBeDeletedTaint is the Cluster Autoscaler's taint on a node it is about
// to delete: kube-proxy's /healthz then answers 503 (nodeEligible false),
// so load balancers drain the node first.
const toBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// nodeEligible is kube-proxy's rule: not being deleted, not tainted for
// deletion.
func nodeEligible(n *corev1.Node) bool {
	if n == nil || n.DeletionTimestamp != nil {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == toBeDeletedTaint {
			return false
		}
	}
	return true
}

// NodeEligible reports whether this node's Node object is eligible to
// receive load balancer traffic (kube-proxy's nodeEligible). True until the
// Node is first seen.
func (c *Controller) NodeEligible() bool {
	c.nodeMu.Lock()
	defer c.nodeMu.Unlock()
	return !c.nodeIneligible
}

// Live reports whether the controller keeps up (kube-proxy's /livez rule):
// no change has been pending for longer than timeout without a sync. It
// also holds while starting up, before the first sync, until changes wait
// longer than timeout. lastUpdated is the last sync (zero before the first).
func (c *Controller) Live(timeout time.Duration) (ok bool, lastUpdated time.Time) {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	since := c.lastSync
	if since.IsZero() {
		since = c.started
	}
	if c.queue.Len() > 0 && time.Since(since) > timeout {
		return false, c.lastSync
	}
	return true, c.lastSync
}

// healthMetrics are kube-proxy's kubeproxy_healthz_total and
// kubeproxy_livez_total, by status code.
type healthMetrics struct{ healthz, livez *prometheus.CounterVec }

// ProxyHealth serves kube-proxy's /healthz and /livez.
type ProxyHealth struct {
	ctl     *Controller
	timeout time.Duration
	m       healthMetrics
}

// NewProxyHealth returns the handlers of c's health with kube-proxy's
// timeout rule (kube-proxy: 2 × its sync period; xlb kube-proxy uses 60 s),
// counting answers in reg (nil: not counted).
func NewProxyHealth(c *Controller, timeout time.Duration, reg prometheus.Registerer) *ProxyHealth {
	h := &ProxyHealth{ctl: c, timeout: timeout}
	h.m.healthz = prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: "healthz_total",
		Help: "Cumulative proxy healthz HTTP status"}, []string{"code"})
	h.m.livez = prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "kubeproxy", Name: "livez_total",
		Help: "Cumulative proxy livez HTTP status"}, []string{"code"})
	if reg != nil {
		reg.MustRegister(h.m.healthz, h.m.livez)
	}
	return h
}

// Healthz is /healthz: 200 once the first full reconcile is done, while
// the controller keeps up (Live) and the node is eligible; else 503.
// (kube-proxy answers 200 before its first sync; xlb answers 503 until its
// rules are in place, so nothing sends traffic to a node that cannot
// serve it yet.)
func (h *ProxyHealth) Healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		eligible := h.ctl.NodeEligible()
		live, last := h.ctl.Live(h.timeout)
		h.write(w, h.m.healthz, live && h.ctl.Ready() && eligible, last, &eligible)
	})
}

// Livez is /livez: 200 while the controller keeps up (Live), whatever the
// node; else 503.
func (h *ProxyHealth) Livez() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		live, last := h.ctl.Live(h.timeout)
		h.write(w, h.m.livez, live, last, nil)
	})
}

func (h *ProxyHealth) write(w http.ResponseWriter, count *prometheus.CounterVec, healthy bool, last time.Time, eligible *bool) {
	now := time.Now()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	code := http.StatusOK
	if healthy {
		// kube-proxy's compatibility rule: a healthy proxy says it was
		// updated just now.
		last = now
	} else {
		code = http.StatusServiceUnavailable
	}
	count.WithLabelValues(fmt.Sprint(code)).Inc()
	w.WriteHeader(code)
	if eligible != nil {
		fmt.Fprintf(w, `{"lastUpdated": %q,"currentTime": %q, "nodeEligible": %v}`, last, now, *eligible)
		return
	}
	fmt.Fprintf(w, `{"lastUpdated": %q,"currentTime": %q}`, last, now)
}
