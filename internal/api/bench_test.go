package api_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
)

// discard is a ResponseWriter that only counts, so the benchmark measures
// the handler rather than a recorder's buffer growth.
type discard struct {
	h http.Header
	n int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(p []byte) (int, error) { d.n += len(p); return len(p), nil }

// GET /state and the listings at 16,000 farms: the server's share of
// `xlb dump` and `xlb list` (the farms' wire forms are cached).
func BenchmarkGet16k(b *testing.B) {
	e := newEnv(b)
	if r := e.do("PUT", "/state", bulkBody(16000, 0)); r.status != 200 {
		b.Fatal(r.body)
	}
	for _, path := range []string{"/state", "/farms?format=ipvsadm&numeric=1", "/farms?format=ipvsadm", "/farms?format=names"} {
		b.Run(path, func(b *testing.B) {
			req := httptest.NewRequest("GET", path, nil)
			req.Header.Set(api.KeyHeader, testKey)
			for b.Loop() {
				w := &discard{h: http.Header{}}
				e.h.ServeHTTP(w, req)
				b.SetBytes(int64(w.n))
			}
		})
	}
}
