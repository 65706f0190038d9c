package client_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/client"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/store"
)

func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(t.Context(), log, fake.New(), st)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(log, eng, "k"))
	t.Cleanup(srv.Close)
	return srv
}

func TestClient(t *testing.T) {
	srv := newServer(t)
	ctx := t.Context()
	c := client.New(srv.URL+"/", "k", srv.Client())

	if err := c.PutFarms(ctx, []byte(`{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80"}]}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.PutFarm(ctx, "dns", []byte(`{"virtual-addr":"10.0.0.2","virtual-ports":"53","protocol":"udp"}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.PutBackends(ctx, "web", []byte(`{"backends":[{"name":"b1","ip-addr":"10.200.0.11","weight":"3"},{"name":"b2","ip-addr":"10.200.0.12"}]}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteBackend(ctx, "web", "b2"); err != nil {
		t.Fatal(err)
	}
	farms, err := c.ListFarms(ctx)
	if err != nil || len(farms) != 2 || farms[0].Name != "dns" || farms[1].Name != "web" {
		t.Fatalf("ListFarms: %v %v", farms, err)
	}
	if names, err := c.ListNames(ctx); err != nil || strings.Join(names, ",") != "dns,web" {
		t.Fatalf("ListNames: %v %v", names, err)
	}
	f, err := c.GetFarm(ctx, "web")
	if err != nil || len(f.Backends) != 1 || f.Backends[0].Weight != 3 {
		t.Fatalf("GetFarm: %+v %v", f, err)
	}
	var text bytes.Buffer
	if err := c.ListText(ctx, &text, true); err != nil || !strings.Contains(text.String(), "UDP  10.0.0.2:53 rr\n") {
		t.Fatalf("ListText: %q %v", text.String(), err)
	}

	var dump bytes.Buffer
	if _, err := c.Dump(ctx, &dump); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteFarm(ctx, "dns"); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(ctx, bytes.NewReader(dump.Bytes())); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if _, err := c.Dump(ctx, &again); err != nil || again.String() != dump.String() {
		t.Fatalf("dump after restore differs: %v", err)
	}
	if v, err := c.Version(ctx); err != nil || v["farms"] != "2" {
		t.Fatalf("Version: %v %v", v, err)
	}
}

func TestClientErrors(t *testing.T) {
	srv := newServer(t)
	ctx := t.Context()
	c := client.New(srv.URL, "k", nil)

	_, err := c.GetFarm(ctx, "nope")
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Message != `farm "nope" does not exist` || !client.IsNotFound(err) {
		t.Fatalf("GetFarm(nope): %#v", err)
	}
	err = c.PutFarm(ctx, "web", []byte(`{"virtual-addr":"10.0.0.1","scheduler":"foo"}`))
	if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, `field "scheduler" value "foo": allowed values are rr`) {
		t.Fatalf("bad scheduler: %#v", err)
	}
	bad := client.New(srv.URL, "wrong", nil)
	if _, err := bad.ListFarms(ctx); !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("wrong key: %#v", err)
	}
	down := client.New("http://127.0.0.1:1", "k", nil)
	if _, err := down.ListFarms(ctx); err == nil || !strings.Contains(err.Error(), "cannot reach the xlb daemon") {
		t.Fatalf("daemon down: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.ListFarms(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}
