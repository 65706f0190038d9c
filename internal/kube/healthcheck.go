package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// ListenFunc opens a listening socket (net.Listen, or one in another
// network namespace in tests).
type ListenFunc func(network, addr string) (net.Listener, error)

// healthChecks serves spec.healthCheckNodePort of LoadBalancer Services with
// externalTrafficPolicy Local, as kube-proxy does: an external load balancer
// asks each node and sends traffic only to nodes that answer 200 (the node
// has local endpoints); others answer 503.
type healthChecks struct {
	log    *slog.Logger
	listen ListenFunc

	mu      sync.Mutex
	byPort  map[uint16]*hcServer
	portFor map[string]uint16 // Service key -> port
}

type hcServer struct {
	srv   *http.Server
	mu    sync.Mutex
	ns    string
	name  string
	local int
}

func newHealthChecks(log *slog.Logger, listen ListenFunc) *healthChecks {
	if listen == nil {
		listen = net.Listen
	}
	return &healthChecks{log: log, listen: listen, byPort: map[uint16]*hcServer{}, portFor: map[string]uint16{}}
}

// healthCheckPort returns the health check node port a Service asks for, or 0.
func healthCheckPort(svc *corev1.Service) uint16 {
	if svc == nil || svc.Spec.Type != corev1.ServiceTypeLoadBalancer ||
		svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		svc.Spec.HealthCheckNodePort <= 0 || svc.Spec.HealthCheckNodePort > 65535 {
		return 0
	}
	return uint16(svc.Spec.HealthCheckNodePort)
}

// countLocalEndpoints counts the distinct usable endpoints of a Service on node
// (ready ones, or serving terminating ones when none is ready).
func countLocalEndpoints(eps []*discoveryv1.EndpointSlice, node string) int {
	seen := map[string]bool{}
	var ready, term int
	for _, s := range eps {
		for _, e := range s.Endpoints {
			if e.NodeName == nil || *e.NodeName != node || len(e.Addresses) == 0 || seen[e.Addresses[0]] {
				continue
			}
			c := e.Conditions
			isReady := c.Ready == nil || *c.Ready
			serving := isReady
			if c.Serving != nil {
				serving = *c.Serving
			}
			switch {
			case isReady:
				ready++
			case serving && c.Terminating != nil && *c.Terminating:
				term++
			default:
				continue
			}
			seen[e.Addresses[0]] = true
		}
	}
	if ready > 0 {
		return ready
	}
	return term
}

// update sets the health check of one Service (svc nil: gone).
func (h *healthChecks) update(key string, svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node string) {
	port := healthCheckPort(svc)
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.portFor[key]; ok && old != port {
		h.stop(old)
		delete(h.portFor, key)
	}
	if port == 0 {
		return
	}
	s, ok := h.byPort[port]
	if !ok {
		ln, err := h.listen("tcp", net.JoinHostPort("", strconv.Itoa(int(port))))
		if err != nil {
			h.log.Warn("health check node port", "service", key, "port", port, "err", err)
			return
		}
		s = &hcServer{}
		s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second,
			ErrorLog: slog.NewLogLogger(h.log.Handler(), slog.LevelWarn)}
		go func() { _ = s.srv.Serve(ln) }()
		h.byPort[port] = s
		h.log.Info("serving health check node port", "service", key, "port", port)
	}
	h.portFor[key] = port
	s.mu.Lock()
	s.ns, s.name, s.local = svc.Namespace, svc.Name, countLocalEndpoints(eps, node)
	s.mu.Unlock()
}

func (h *healthChecks) stop(port uint16) {
	if s, ok := h.byPort[port]; ok {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.srv.Shutdown(ctx)
		cancel()
		delete(h.byPort, port)
	}
}

// close stops every health check server.
func (h *healthChecks) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.byPort {
		h.stop(p)
	}
	h.portFor = map[string]uint16{}
}

// ServeHTTP answers like kube-proxy's service health server.
func (s *hcServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	ns, name, n := s.ns, s.name, s.local
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", fmt.Sprint(n))
	if n == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"service":        map[string]string{"namespace": ns, "name": name},
		"localEndpoints": n,
	})
}
