package api

import (
	"net/http"
	"strings"
	"time"
)

// RequestObserver is told of every request the API served
// (internal/observe counts them by route and status).
type RequestObserver interface {
	ObserveRequest(method, route string, code int, d time.Duration)
}

// SetRequestObserver makes the server report each request to o.
func (s *Server) SetRequestObserver(o RequestObserver) { s.requests = o }

// route is the request's route for metrics: the API path pattern it
// matched ("/farms/{name}"), so that the label's values are bounded;
// "other" for paths the API does not serve.
func (s *Server) route(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		// Refused before routing (no key): find what it would have
		// matched.
		_, p = s.mux.Handler(r)
	}
	if i := strings.IndexByte(p, ' '); i >= 0 {
		p = p[i+1:]
	}
	if p == "" || p == "/" {
		return "other"
	}
	return p
}
