package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// countingPlane is the fake plane with counters: each backend i of a farm
// has i+1 connections, 10x packets and 1000x bytes each way.
type countingPlane struct{ *fake.Plane }

func (countingPlane) Counters(ctx context.Context, f *model.Farm) (dataplane.FarmCounters, error) {
	var out dataplane.FarmCounters
	for i, b := range f.Backends {
		n := uint64(i + 1)
		c := dataplane.Counters{Connections: n, InPackets: 10 * n, OutPackets: 10 * n, InBytes: 1000 * n, OutBytes: 1000 * n}
		out.Backends = append(out.Backends, dataplane.BackendCounters{Name: b.Name, Counters: c})
		out.Add(c)
	}
	return out, nil
}

func TestCounters(t *testing.T) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(context.Background(), log, countingPlane{fake.New()}, st)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, eng: eng, st: st, h: api.New(log, eng, testKey)}
	e.must("POST", "/farms", `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80",
		"backends":[{"name":"b1","ip-addr":"10.200.0.11","port":"8080"},{"name":"b2","ip-addr":"10.200.0.12","port":"8080"}]}]}`)

	var got api.FarmCountersJSON
	if err := json.Unmarshal([]byte(e.must("GET", "/farms/web/counters", "")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != "web" || got.Connections != "3" || got.InBytes != "3000" || len(got.Backends) != 2 ||
		got.Backends[1].Name != "b2" || got.Backends[1].Connections != "2" || got.Backends[1].OutPackets != "20" {
		t.Errorf("GET /farms/web/counters: %+v", got)
	}
	if r := e.do("GET", "/farms/nope/counters", ""); r.status != http.StatusNotFound {
		t.Errorf("counters of a missing farm: %d %s", r.status, r.body)
	}

	want := model.StatsListingHeader +
		"TCP  10.0.0.1:80                         3       30       30     3000     3000\n" +
		"  -> 10.200.0.11:8080                    1       10       10     1000     1000\n" +
		"  -> 10.200.0.12:8080                    2       20       20     2000     2000\n"
	if got := e.must("GET", "/farms?format=ipvsadm&stats=1&numeric=1", ""); got != want {
		t.Errorf("stats listing:\n%s\nwant\n%s", got, want)
	}

	// A data plane without counters: 501, saying so.
	plain := newEnv(t)
	plain.must("POST", "/farms", `{"farms":[{"name":"web","virtual-addr":"10.0.0.1"}]}`)
	for _, path := range []string{"/farms/web/counters", "/farms?format=ipvsadm&stats=1"} {
		if r := plain.do("GET", path, ""); r.status != http.StatusNotImplemented || !strings.Contains(r.body, "keeps no per-farm counters") {
			t.Errorf("GET %s with the fake plane: %d %s", path, r.status, r.body)
		}
	}
}
