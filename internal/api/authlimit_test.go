package api_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/api"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Failed authentications are limited per client address: past the burst,
// the address is answered 429 whatever key it sends (a right key too: the
// key is not looked at), other addresses are not affected, and a token
// comes back after the refill time. Before, every wrong key was answered
// 401 at full speed.
func TestAuthRateLimit(t *testing.T) {
	e := newEnv(t)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	h := api.New(log, e.eng, testKey, api.Options{AuthBurst: 5, AuthRefill: 300 * time.Millisecond, AuthSummaryEvery: time.Hour})
	do := func(addr, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/farms", nil)
		req.RemoteAddr = addr
		if key != "" {
			req.Header.Set(api.KeyHeader, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	const attacker, other = "192.0.2.7:40000", "192.0.2.8:40000"
	for i := range 5 {
		if w := do(attacker, "wrong"); w.Code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d", i, w.Code)
		}
	}
	w := do("192.0.2.7:40001", testKey) // same address, another port, the right key
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "too many failed authentications") {
		t.Fatalf("after the burst: %d %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if w := do(other, testKey); w.Code != http.StatusOK {
		t.Fatalf("another address: %d", w.Code)
	}
	if w := do(other, ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("another address, no key: %d", w.Code)
	}
	time.Sleep(350 * time.Millisecond) // one token back
	if w := do(attacker, testKey); w.Code != http.StatusOK {
		t.Fatalf("after the refill, the right key: %d %s", w.Code, w.Body)
	}
	if w := do(attacker, "wrong"); w.Code != http.StatusUnauthorized {
		t.Fatalf("after the refill, a wrong key: %d", w.Code)
	}
	if w := do(attacker, "wrong"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("the token was spent: %d", w.Code)
	}
	// IPv6 clients are counted by /64: another address of the same /64
	// is the same client.
	for range 5 {
		do("[2001:db8:1:2::10]:4000", "wrong")
	}
	if w := do("[2001:db8:1:2::99]:4000", testKey); w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "2001:db8:1:2::/64") {
		t.Fatalf("same /64: %d %s", w.Code, w.Body)
	}
	if w := do("[2001:db8:1:3::10]:4000", testKey); w.Code != http.StatusOK {
		t.Fatalf("another /64: %d", w.Code)
	}
	if strings.Contains(logs.String(), "api request") {
		t.Errorf("failed authentications were logged one line each:\n%s", logs.String())
	}
}

// Failed authentications are logged as one counted summary per period,
// not one INFO line each (about 5,400 lines a second under a key scan).
func TestAuthFailuresSummarized(t *testing.T) {
	e := newEnv(t)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	h := api.New(log, e.eng, testKey, api.Options{AuthBurst: 100, AuthSummaryEvery: 200 * time.Millisecond})
	for i := range 1000 {
		req := httptest.NewRequest("GET", "/farms", nil)
		req.RemoteAddr = "198.51.100.9:1234"
		if i%3 == 0 {
			req.RemoteAddr = "198.51.100.10:1234"
		}
		req.Header.Set(api.KeyHeader, "guess")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "api authentication failures") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	out := logs.String()
	if n := strings.Count(out, "\n"); n != 1 {
		t.Fatalf("%d log lines for 1000 failures, want one summary:\n%s", n, out)
	}
	for _, w := range []string{"failed=200", "refused_rate_limited=800", "clients=2", "top_client=198.51.100.9", "top_client_requests=666"} {
		if !strings.Contains(out, w) {
			t.Errorf("summary %q does not say %s", out, w)
		}
	}
}
