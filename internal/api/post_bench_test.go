package api_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// nopStore keeps nothing: BenchmarkPostFarm100Backends times the Go side
// of the request, not the fsync.
type nopStore struct{}

func (nopStore) Load(context.Context) ([]model.Farm, error) { return nil, nil }
func (nopStore) Commit(context.Context, plan.Diff) error    { return nil }
func (nopStore) Close() error                               { return nil }

// BenchmarkPostFarm100Backends is POST /farms adding a farm of 100
// backends, through the handler, with a store and a data plane that do
// nothing; the farm is deleted again outside the timer.
func BenchmarkPostFarm100Backends(b *testing.B) {
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(context.Background(), log, fake.New(), nopStore{})
	if err != nil {
		b.Fatal(err)
	}
	h := api.New(log, eng, testKey)
	var sb strings.Builder
	sb.WriteString(`{"farms":[{"name":"web","virtual-addr":"10.1.1.1","virtual-ports":"80","backends":[`)
	for j := range 100 {
		if j > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"name":"b%d","ip-addr":"172.16.%d.1","port":"8080","weight":"1"}`, j, j)
	}
	sb.WriteString("]}]}")
	body := []byte(sb.String())
	do := func(method, path string, body []byte) {
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Header.Set(api.KeyHeader, testKey)
		w := &discard{h: http.Header{}}
		h.ServeHTTP(w, req)
	}
	b.ReportAllocs()
	for b.Loop() {
		do("POST", "/farms", body)
		b.StopTimer()
		do("DELETE", "/farms/web", nil)
		b.StartTimer()
	}
	if _, ok := eng.Snapshot().Farm("web"); ok {
		b.Fatal("the farm was not deleted")
	}
	b.StopTimer()
	do("POST", "/farms", body)
	if _, ok := eng.Snapshot().Farm("web"); !ok {
		b.Fatal("POST /farms did not add the farm")
	}
}
