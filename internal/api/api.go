// Package api serves xlb's REST API: nftlb's JSON wire format (farms and
// backends, every value a string) with its Key header, plus whole-state dump
// and restore. Every change goes through the engine as one transaction.
//
// The routes are listed once, in the table returned by Routes; both the mux
// and the OpenAPI consistency test (api/openapi.yaml) use it.
package api

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/model"
)

// Body limits. A bulk body of 16,000 farms with a few backends each is about
// 10 MiB; whole-state restores get more room.
const (
	MaxBulkBody = 64 << 20 // /farms and /state
	MaxBody     = 8 << 20  // one farm or its backends
)

// KeyHeader is the header carrying the API key (nftlb's name).
const KeyHeader = "Key"

// Server is the API's HTTP handler.
type Server struct {
	log  *slog.Logger
	eng  *engine.Engine
	key  []byte
	mux  *http.ServeMux
	auth *authLimiter

	checks  CheckStatus    // health.go; nil: no last checks shown
	passive PassiveStatus  // health.go; nil: no passive counts shown
	events  *events.Broker // events.go; nil: GET /events answers 501
	streams streams        // events.go
	bgp     BGPStatus      // bgp.go; nil: GET /bgp answers 501
	sync    SyncStatus     // bgp.go; nil: GET /sync answers 501

	requests RequestObserver // metrics.go; nil: not counted
	rates    RateSource      // observe.go; nil: no rates
	metrics  http.Handler    // observe.go; nil: GET /metrics answers 501
}

// Route is one method and path the API serves.
type Route struct {
	Method string
	Path   string // a net/http ServeMux pattern path, also the OpenAPI path
	Write  bool   // changes state (logged at Info; reads at Debug)
	handle func(s *Server, w http.ResponseWriter, r *http.Request) error
}

// routes are every route: farms' (here), tables' (tables.go) and nftlb's
// policies (policies.go).
var routes = slices.Concat(farmRoutes, tableRoutes, policyRoutes)

var farmRoutes = []Route{
	{Method: http.MethodGet, Path: "/farms", handle: (*Server).getFarms},
	{Method: http.MethodPost, Path: "/farms", Write: true, handle: (*Server).putFarms},
	{Method: http.MethodPut, Path: "/farms", Write: true, handle: (*Server).putFarms},
	{Method: http.MethodDelete, Path: "/farms", Write: true, handle: (*Server).deleteFarms},
	{Method: http.MethodGet, Path: "/farms/{name}", handle: (*Server).getFarm},
	{Method: http.MethodPut, Path: "/farms/{name}", Write: true, handle: (*Server).putFarm},
	{Method: http.MethodDelete, Path: "/farms/{name}", Write: true, handle: (*Server).deleteFarm},
	{Method: http.MethodGet, Path: "/farms/{name}/backends", handle: (*Server).getBackends},
	{Method: http.MethodPost, Path: "/farms/{name}/backends", Write: true, handle: (*Server).putBackends},
	{Method: http.MethodPut, Path: "/farms/{name}/backends", Write: true, handle: (*Server).putBackends},
	{Method: http.MethodDelete, Path: "/farms/{name}/backends", Write: true, handle: (*Server).deleteBackends},
	{Method: http.MethodDelete, Path: "/farms/{name}/backends/{backend}", Write: true, handle: (*Server).deleteBackend},
	{Method: http.MethodDelete, Path: "/farms/{name}/addresses/{address}", Write: true, handle: (*Server).deleteFarmAddress},
	{Method: http.MethodGet, Path: "/farms/{name}/counters", handle: (*Server).getCounters},
	{Method: http.MethodGet, Path: "/farms/{name}/rates", handle: (*Server).getRates},
	{Method: http.MethodGet, Path: "/farms/{name}/connections", handle: (*Server).getFarmConnections},
	{Method: http.MethodDelete, Path: "/farms/{name}/connections", Write: true, handle: (*Server).deleteFarmConnections},
	{Method: http.MethodGet, Path: "/connections", handle: (*Server).getConnections},
	{Method: http.MethodGet, Path: "/metrics", handle: (*Server).getMetrics},
	{Method: http.MethodGet, Path: "/farms/{name}/sessions", handle: (*Server).getSessions},
	{Method: http.MethodDelete, Path: "/farms/{name}/sessions", Write: true, handle: (*Server).deleteAllSessions},
	{Method: http.MethodDelete, Path: "/farms/{name}/sessions/{client}", Write: true, handle: (*Server).deleteClientSessions},
	{Method: http.MethodDelete, Path: "/farms/{name}/backends/{backend}/sessions", Write: true, handle: (*Server).deleteBackendSessions},
	{Method: http.MethodGet, Path: "/addresses", handle: (*Server).getAddresses},
	{Method: http.MethodPost, Path: "/addresses", Write: true, handle: (*Server).putAddresses},
	{Method: http.MethodPut, Path: "/addresses", Write: true, handle: (*Server).putAddresses},
	{Method: http.MethodGet, Path: "/addresses/{address}", handle: (*Server).getAddress},
	{Method: http.MethodDelete, Path: "/addresses/{address}", Write: true, handle: (*Server).deleteAddress},
	{Method: http.MethodGet, Path: "/state", handle: (*Server).getState},
	{Method: http.MethodPut, Path: "/state", Write: true, handle: (*Server).putState},
	{Method: http.MethodGet, Path: "/state/problems", handle: (*Server).getProblems},
	{Method: http.MethodPost, Path: "/reconcile", Write: true, handle: (*Server).postReconcile},
	{Method: http.MethodGet, Path: "/version", handle: (*Server).getVersion},
	{Method: http.MethodGet, Path: "/events", handle: (*Server).getEvents},
	{Method: http.MethodGet, Path: "/bgp", handle: (*Server).getBGP},
	{Method: http.MethodGet, Path: "/sync", handle: (*Server).getSync},
}

// Routes returns every (method, path) the API serves.
func Routes() []Route { return slices.Clone(routes) }

// New returns the API handler. Every request must carry key in the Key
// header; an empty key refuses every request (the daemon never serves
// without one). Failed authentications are limited per client address
// (authlimit.go); opts, if given, tune that.
func New(log *slog.Logger, eng *engine.Engine, key string, opts ...Options) *Server {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	s := &Server{log: log, eng: eng, key: []byte(key), mux: http.NewServeMux(), auth: newAuthLimiter(log, o.withDefaults())}
	allowed := map[string][]string{}
	for _, rt := range routes {
		if o.ReadOnly && rt.Write {
			continue // answered below, with why
		}
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
		allowed[rt.Path] = append(allowed[rt.Path], rt.Method)
	}
	if o.ReadOnly {
		for _, rt := range routes {
			if !rt.Write {
				continue
			}
			allow := strings.Join(allowed[rt.Path], ", ")
			s.mux.HandleFunc(rt.Method+" "+rt.Path, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Allow", allow)
				writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("this API is read-only: %s", o.ReadOnlyReason))
			})
		}
	}
	// Other methods on a known path: nftlb's 404 "invalid request", with
	// Allow.
	for path, methods := range allowed {
		allow := strings.Join(methods, ", ")
		if slices.Contains(methods, http.MethodGet) {
			allow += ", HEAD"
		}
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeResponse(w, http.StatusNotFound, fmt.Sprintf("%s. method %s is not allowed on %s; allowed: %s", textInvalidRequest, r.Method, path, allow))
		})
	}
	// Unknown paths: nftlb answers 400 to a GET, 404 to the others.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusNotFound
		if r.Method == http.MethodGet {
			status = http.StatusBadRequest
		}
		writeResponse(w, status, fmt.Sprintf("%s. no such API path %q", textInvalidRequest, model.Clip(r.URL.Path)))
	})
	return s
}

// ServeHTTP checks the key, routes the request and logs it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	client := clientOf(r)
	if retry, blocked := s.auth.limited(client, start); blocked {
		secs := int(retry/time.Second) + 1
		rec.Header().Set("Retry-After", fmt.Sprint(secs))
		writeError(rec, http.StatusTooManyRequests, fmt.Sprintf("too many failed authentications from %s; try again in %d s", client, secs))
	} else if msg, ok := s.authorized(r); !ok {
		s.auth.failure(client, start)
		writeError(rec, http.StatusUnauthorized, msg)
	} else {
		s.mux.ServeHTTP(rec, r)
	}
	level := slog.LevelDebug
	switch {
	case rec.status == http.StatusUnauthorized || rec.status == http.StatusTooManyRequests:
		// Counted in the periodic summary (authlimit.go), not a line each.
	case r.Method != http.MethodGet && r.Method != http.MethodHead || rec.status >= 400 && rec.status != http.StatusNotFound:
		level = slog.LevelInfo
	}
	took := time.Since(start)
	if s.requests != nil {
		s.requests.ObserveRequest(r.Method, s.route(r), rec.status, took)
	}
	s.log.LogAttrs(r.Context(), level, "api request",
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", rec.status), slog.Duration("duration", took))
}

// FlushLog logs the pending summary of failed authentications now (the
// daemon calls it when it stops).
func (s *Server) FlushLog() { s.auth.flush() }

func (s *Server) authorized(r *http.Request) (string, bool) {
	if len(s.key) == 0 {
		return "the server has no API key configured", false
	}
	got := r.Header.Get(KeyHeader)
	if got == "" {
		return "missing " + KeyHeader + " header (the API key)", false
	}
	if subtle.ConstantTimeCompare([]byte(got), s.key) != 1 {
		return "wrong API key in the " + KeyHeader + " header", false
	}
	return "", true
}

func (s *Server) wrap(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := rt.handle(s, w, r); err != nil {
			status, text := reply(err)
			writeResponse(w, status, text)
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// httpError carries the status of an error found by the API itself
// (malformed requests).
type httpError struct {
	status int
	err    error
}

func (e *httpError) Error() string { return e.err.Error() }
func (e *httpError) Unwrap() error { return e.err }

func badRequest(err error) error {
	var fe *model.FieldError
	if errors.As(err, &fe) {
		return err
	}
	return &httpError{status: http.StatusBadRequest, err: err}
}

// appendJSONText appends s as a JSON string.
func appendJSONText(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

// maxErrorLen bounds an error message: values in messages are clipped
// where they are quoted (model.Clip), and this catches any other path (a
// name from the URL, a kernel message).
const maxErrorLen = 2048

// clipMessage cuts msg to maxErrorLen bytes at a character boundary.
func clipMessage(msg string) string {
	if len(msg) <= maxErrorLen {
		return msg
	}
	cut := maxErrorLen
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (message of %d bytes cut)", msg[:cut], len(msg))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}
