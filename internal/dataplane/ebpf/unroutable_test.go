package ebpf

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/store"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// A snat backend the LB has no route to is the request's fault: the API
// answers 400 naming the backend's ip-addr (it answered 500), and nothing
// changes.
func TestUnroutableBackendIs400(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t) // routes to 10.100.0.0/24 and 10.200.0.0/24 only
	p := newPlane(t, ns, mountBPFFS(t), []string{"front", "back"}, 1024)
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eng, err := engine.New(context.Background(), testLogger(t), p, st)
	if err != nil {
		t.Fatal(err)
	}
	h := api.New(testLogger(t), eng, "unroutable-test-key")
	do := func(body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/farms", strings.NewReader(body))
		req.Header.Set(api.KeyHeader, "unroutable-test-key")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := do(`{"farms":[{"name":"ok","virtual-addr":"10.100.0.10","virtual-ports":"80","mode":"snat","backends":[{"name":"b1","ip-addr":"10.200.0.11"}]}]}`); w.Code != http.StatusOK {
		t.Fatalf("routable backend: %d %s", w.Code, w.Body)
	}
	w := do(`{"farms":[{"name":"far","virtual-addr":"10.100.0.11","virtual-ports":"80","mode":"snat","backends":[{"name":"b9","ip-addr":"192.0.2.50"}]}]}`)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `backend \"b9\"`) ||
		!strings.Contains(w.Body.String(), `\"ip-addr\"`) || !strings.Contains(w.Body.String(), "192.0.2.50") || !strings.Contains(w.Body.String(), "route") {
		t.Fatalf("unroutable backend: %d %s", w.Code, w.Body)
	}
	if _, ok := eng.Snapshot().Farm("far"); ok || eng.Snapshot().Len() != 1 {
		t.Fatalf("the refused farm is in the state")
	}
}
