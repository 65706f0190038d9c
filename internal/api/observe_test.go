package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/observe"
	"github.com/xlb-lb/xlb/internal/store"
)

// connPlane is the fake plane with a fixed connection table: two
// connections of farm web (one established to b1 from 192.0.2.7, one UDP
// to b2 from 192.0.2.8); deletions are recorded.
type connPlane struct {
	*fake.Plane
	deleted *[]dataplane.ConnFilter
}

func (p connPlane) table(farms []*model.Farm) []dataplane.Conn {
	var out []dataplane.Conn
	for _, f := range farms {
		if f.Name != "web" {
			continue
		}
		out = append(out,
			dataplane.Conn{Farm: "web", Protocol: 6, State: "ESTABLISHED", Active: true, Expires: 899 * time.Second,
				Client: netip.MustParseAddrPort("192.0.2.7:40000"), VIP: netip.MustParseAddrPort("10.0.0.1:80"),
				Backend: netip.MustParseAddrPort("10.200.0.11:8080"), BackendName: "b1"},
			dataplane.Conn{Farm: "web", Protocol: 17, State: "UDP", Expires: 299 * time.Second,
				Client: netip.MustParseAddrPort("192.0.2.8:5353"), VIP: netip.MustParseAddrPort("10.0.0.1:80"),
				Backend: netip.MustParseAddrPort("10.200.0.12:8080"), BackendName: "b2"})
	}
	return out
}

func (p connPlane) Connections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) ([]dataplane.Conn, error) {
	var out []dataplane.Conn
	for _, c := range p.table(farms) {
		if (flt.Backend == "" || c.BackendName == flt.Backend) && (!flt.Client.IsValid() || c.Client.Addr() == flt.Client) {
			out = append(out, c)
		}
	}
	return out, nil
}

func (p connPlane) DeleteConnections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) (int, error) {
	*p.deleted = append(*p.deleted, flt)
	cs, _ := p.Connections(ctx, farms, flt)
	return len(cs), nil
}

func (p connPlane) CountConns(ctx context.Context, farms []*model.Farm, _ *plan.ConnOwners) (dataplane.ConnTable, error) {
	t := dataplane.ConnTable{Backends: map[string][]dataplane.ConnCounts{}}
	for _, c := range p.table(farms) {
		cc := t.Backends[c.Farm]
		if cc == nil {
			cc = make([]dataplane.ConnCounts, 2)
			t.Backends[c.Farm] = cc
		}
		i := map[string]int{"b1": 0, "b2": 1}[c.BackendName]
		if c.Active {
			cc[i].Active++
		} else {
			cc[i].Inactive++
		}
	}
	return t, nil
}

func newConnEnv(t *testing.T) (*env, *[]dataplane.ConnFilter) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.DiscardHandler)
	var deleted []dataplane.ConnFilter
	eng, err := engine.New(context.Background(), log, connPlane{fake.New(), &deleted}, st)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, eng: eng, st: st, h: api.New(log, eng, testKey)}
	e.must("POST", "/farms", `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80",
		"backends":[{"name":"b1","ip-addr":"10.200.0.11","port":"8080"},{"name":"b2","ip-addr":"10.200.0.12","port":"8080"}]},
		{"name":"dns","virtual-addr":"10.0.0.2","virtual-ports":"53","protocol":"udp"}]}`)
	return e, &deleted
}

func TestConnectionsAPI(t *testing.T) {
	e, deleted := newConnEnv(t)
	var got api.ConnsJSON
	if err := json.Unmarshal([]byte(e.must("GET", "/connections", "")), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Connections) != 2 || got.Connections[0] != (api.ConnJSON{Farm: "web", Protocol: "tcp", State: "ESTABLISHED", Active: "true",
		Expires: "899", Client: "192.0.2.7:40000", Virtual: "10.0.0.1:80", Backend: "b1", BackendAddr: "10.200.0.11:8080"}) {
		t.Errorf("GET /connections: %+v", got)
	}
	if err := json.Unmarshal([]byte(e.must("GET", "/farms/web/connections?client=192.0.2.8", "")), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Connections) != 1 || got.Connections[0].Backend != "b2" || got.Connections[0].Protocol != "udp" {
		t.Errorf("GET /farms/web/connections?client=192.0.2.8: %+v", got)
	}
	text := e.must("GET", "/farms/web/connections?format=ipvsadm&backend=b1", "")
	want := "IPVS connection entries\npro expire state       source                  virtual                 destination\n" +
		"TCP 14:59  ESTABLISHED 192.0.2.7:40000         10.0.0.1:80             10.200.0.11:8080\n"
	if text != want {
		t.Errorf("ipvsadm listing:\n%q\nwant\n%q", text, want)
	}
	for path, status := range map[string]int{
		"/farms/nope/connections":             http.StatusNotFound,
		"/farms/web/connections?backend=b9":   http.StatusNotFound,
		"/farms/web/connections?client=1.2.3": http.StatusBadRequest,
		"/farms/web/connections?format=xml":   http.StatusBadRequest,
	} {
		if r := e.do("GET", path, ""); r.status != status {
			t.Errorf("GET %s: %d %s, want %d", path, r.status, r.body, status)
		}
	}
	r := e.do("DELETE", "/farms/web/connections?client=192.0.2.7", "")
	if r.status != http.StatusOK || r.header.Get(api.ConnsDeletedHeader) != "1" {
		t.Errorf("DELETE a client's connections: %d %s, deleted %q", r.status, r.body, r.header.Get(api.ConnsDeletedHeader))
	}
	if len(*deleted) != 1 || (*deleted)[0].Client != netip.MustParseAddr("192.0.2.7") {
		t.Errorf("deletions asked of the plane: %+v", *deleted)
	}
	// ActiveConn / InActConn in the listing.
	list := e.must("GET", "/farms?format=ipvsadm&conns=1&numeric=1", "")
	if !strings.Contains(list, "-> 10.200.0.11:8080             Masq    1      up active 1 inactive 0\n") ||
		!strings.Contains(list, "-> 10.200.0.12:8080             Masq    1      up active 0 inactive 1\n") {
		t.Errorf("listing with connections:\n%s", list)
	}
	if r := e.do("GET", "/farms?format=ipvsadm&conns=1&rate=1", ""); r.status != http.StatusBadRequest {
		t.Errorf("conns and rate together: %d", r.status)
	}
}

// Without a rate source or metrics the routes say so (501); with them they
// answer.
func TestRatesAndMetricsAPI(t *testing.T) {
	e, _ := newConnEnv(t)
	for _, path := range []string{"/farms/web/rates", "/metrics", "/farms?format=ipvsadm&rate=1"} {
		if r := e.do("GET", path, ""); r.status != http.StatusNotImplemented {
			t.Errorf("GET %s without a source: %d %s", path, r.status, r.body)
		}
	}
	srv := api.New(slog.New(slog.DiscardHandler), e.eng, testKey)
	m := observe.New(observe.Options{Engine: e.eng, NoRuntime: true})
	rates := observe.NewRates(e.eng, slog.New(slog.DiscardHandler))
	srv.SetMetrics(m)
	srv.SetRates(rates)
	srv.SetRequestObserver(m)
	e.h = srv
	// The fake plane keeps no counters: rates are 501 with the reason.
	rates.Sample(context.Background())
	if r := e.do("GET", "/farms/web/rates", ""); r.status != http.StatusNotImplemented || !strings.Contains(r.body, "no rates") {
		t.Errorf("rates on a plane without counters: %d %s", r.status, r.body)
	}
	e.do("GET", "/farms/nope", "")
	body := e.must("GET", "/metrics", "")
	for _, want := range []string{`xlb_farms 2`, `xlb_api_requests_total{code="404",method="GET",route="/farms/{name}"} 1`,
		`xlb_backend_connections_active{farm="web",backend="b1"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
