package api

import (
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Failed authentications are limited per client address and logged as a
// periodic summary. Without a limit, a client could try about 5,400 keys
// a second, and each try wrote an INFO line to the log.
//
// Each address has a token bucket of failures (burst AuthBurst, one token
// back every AuthRefill): a wrong or missing key takes a token; an address
// without a token is answered 429 with Retry-After, without its key being
// looked at, whatever key it sends, until a token comes back. A right key
// takes nothing. The log gets one line per AuthSummaryEvery with the
// failures, the refusals and the address that failed most, instead of a
// line per request.

// Defaults of the limit (Options).
const (
	DefaultAuthBurst        = 10
	DefaultAuthRefill       = time.Second
	DefaultAuthSummaryEvery = 10 * time.Second
	// maxAuthClients bounds the addresses tracked; past it, new
	// addresses share one bucket.
	maxAuthClients = 4096
)

// Options tune the API server; the zero value takes the defaults.
type Options struct {
	AuthBurst        int           // failed authentications an address may make at once
	AuthRefill       time.Duration // then one more per AuthRefill
	AuthSummaryEvery time.Duration // how often failures are logged (one line)
	// ReadOnly serves only the routes that change nothing (Route.Write
	// false); a write answers 405 with ReadOnlyReason. xlb kube-proxy
	// serves its state so: the API server's objects are its source.
	ReadOnly       bool
	ReadOnlyReason string
}

func (o Options) withDefaults() Options {
	if o.AuthBurst <= 0 {
		o.AuthBurst = DefaultAuthBurst
	}
	if o.AuthRefill <= 0 {
		o.AuthRefill = DefaultAuthRefill
	}
	if o.AuthSummaryEvery <= 0 {
		o.AuthSummaryEvery = DefaultAuthSummaryEvery
	}
	return o
}

// authLimiter is the per-address limit of failed authentications and
// their counted summary.
type authLimiter struct {
	log  *slog.Logger
	opts Options

	mu      sync.Mutex
	clients map[string]*rate.Limiter
	// Counts since the last summary.
	failed, refused int
	byClient        map[string]int
	timer           *time.Timer // pending summary, nil when none
}

func newAuthLimiter(log *slog.Logger, opts Options) *authLimiter {
	return &authLimiter{log: log, opts: opts, clients: map[string]*rate.Limiter{}, byClient: map[string]int{}}
}

// clientOf is the address a request's failures are counted under: the
// peer's IPv4 address, its IPv6 /64 (one host usually holds a whole /64,
// and would otherwise get a new bucket per address), "unix" for the Unix
// socket.
func clientOf(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		if r.RemoteAddr == "" || r.RemoteAddr == "@" {
			return "unix"
		}
		return r.RemoteAddr
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		p, _ := a.WithZone("").Prefix(64)
		return p.String()
	}
	return a.String()
}

// limited reports whether client has no failure left: it must be refused
// without looking at its key. retry is when it may try again.
func (l *authLimiter) limited(client string, now time.Time) (retry time.Duration, blocked bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.clients[client]
	if lim == nil || lim.TokensAt(now) >= 1 {
		return 0, false
	}
	l.refused++
	l.byClient[client]++
	l.scheduleSummary()
	missing := 1 - lim.TokensAt(now) // of a token
	return time.Duration(missing * float64(l.opts.AuthRefill)), true
}

// failure records a failed authentication of client.
func (l *authLimiter) failure(client string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.clients[client]
	if lim == nil {
		if len(l.clients) >= maxAuthClients {
			l.sweep(now)
		}
		if len(l.clients) >= maxAuthClients {
			client = "(others)"
			lim = l.clients[client]
		}
		if lim == nil {
			lim = rate.NewLimiter(rate.Every(l.opts.AuthRefill), l.opts.AuthBurst)
			l.clients[client] = lim
		}
	}
	lim.AllowN(now, 1)
	l.failed++
	l.byClient[client]++
	l.scheduleSummary()
}

// sweep forgets addresses whose bucket is full again: they are not
// failing now.
func (l *authLimiter) sweep(now time.Time) {
	for c, lim := range l.clients {
		if lim.TokensAt(now) >= float64(l.opts.AuthBurst) {
			delete(l.clients, c)
		}
	}
}

// scheduleSummary arranges for the summary to be logged AuthSummaryEvery
// after the first failure since the last one. l.mu is held.
func (l *authLimiter) scheduleSummary() {
	if l.timer == nil {
		l.timer = time.AfterFunc(l.opts.AuthSummaryEvery, l.summarize)
	}
}

// summarize logs the failures since the last summary in one line.
func (l *authLimiter) summarize() {
	l.mu.Lock()
	failed, refused, clients := l.failed, l.refused, len(l.byClient)
	top, topN := "", 0
	for c, n := range l.byClient {
		if n > topN || n == topN && c < top {
			top, topN = c, n
		}
	}
	l.failed, l.refused, l.byClient, l.timer = 0, 0, map[string]int{}, nil
	l.sweep(time.Now())
	l.mu.Unlock()
	l.log.Warn("api authentication failures", "failed", failed, "refused_rate_limited", refused,
		"clients", clients, "top_client", top, "top_client_requests", topN, "period", l.opts.AuthSummaryEvery)
}

// flush logs a pending summary now (at shutdown, and in tests).
func (l *authLimiter) flush() {
	l.mu.Lock()
	t := l.timer
	l.mu.Unlock()
	if t != nil && t.Stop() {
		l.summarize()
	}
}
