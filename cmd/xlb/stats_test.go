package main

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// countingPlane: every backend has 7 connections, 70 packets and 7000
// bytes each way.
type countingPlane struct{ *fake.Plane }

func (countingPlane) Counters(ctx context.Context, f *model.Farm) (dataplane.FarmCounters, error) {
	var out dataplane.FarmCounters
	for _, b := range f.Backends {
		c := dataplane.Counters{Connections: 7, InPackets: 70, OutPackets: 70, InBytes: 7000, OutBytes: 7000}
		out.Backends = append(out.Backends, dataplane.BackendCounters{Name: b.Name, Counters: c})
		out.Add(c)
	}
	return out, nil
}

func TestListStats(t *testing.T) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(t.Context(), log, countingPlane{fake.New()}, st)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(log, eng, testKey))
	t.Cleanup(srv.Close)
	d := &testDaemon{url: srv.URL, eng: eng}
	d.xlb(t, "farm", "add", "web", "--vip", "10.0.0.1", "--ports", "80")
	d.xlb(t, "backend", "add", "web", "b1", "--ip", "10.200.0.11", "--port", "8080")
	out := d.xlb(t, "list", "-n", "--stats")
	for _, want := range []string{"Conns   InPkts  OutPkts  InBytes OutBytes",
		"TCP  10.0.0.1:80                         7       70       70     7000     7000\n",
		"  -> 10.200.0.11:8080                    7       70       70     7000     7000\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("xlb list -n --stats:\n%s\nlacks %q", out, want)
		}
	}

	// A data plane that keeps no counters says so.
	plain := newDaemon(t)
	plain.xlb(t, "farm", "add", "web", "--vip", "10.0.0.1", "--ports", "80")
	plain.fails(t, []string{"keeps no per-farm counters"}, "list", "--stats")
}
