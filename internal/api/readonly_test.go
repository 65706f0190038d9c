package api_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
)

// TestReadOnly: with Options.ReadOnly every read route answers as usual
// and every write route answers 405 with the reason, changing nothing.
func TestReadOnly(t *testing.T) {
	e := newEnv(t)
	e.must(http.MethodPut, "/farms", `{"farms":[{"name":"web","virtual-addr":"10.99.0.1","virtual-ports":"80","backends":[{"name":"b","ip-addr":"10.0.0.1","port":"8080"}]}]}`)
	ro := &env{t: t, plane: e.plane, eng: e.eng, st: e.st,
		h: api.New(slog.New(slog.DiscardHandler), e.eng, testKey, api.Options{ReadOnly: true, ReadOnlyReason: "change the Services"})}
	for _, path := range []string{"/farms", "/farms/web", "/farms/web/backends", "/state", "/version"} {
		if r := ro.do(http.MethodGet, path, ""); r.status != http.StatusOK {
			t.Errorf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	if r := ro.doKey("wrong", http.MethodGet, "/farms", ""); r.status != http.StatusUnauthorized {
		t.Errorf("GET with a wrong key: %d", r.status)
	}
	writes := 0
	for _, rt := range api.Routes() {
		if !rt.Write {
			continue
		}
		writes++
		path := strings.NewReplacer("{name}", "web", "{backend}", "b", "{address}", "a", "{client}", "10.0.0.9").Replace(rt.Path)
		r := ro.do(rt.Method, path, "{}")
		if r.status != http.StatusMethodNotAllowed || !strings.Contains(r.body, "read-only: change the Services") {
			t.Errorf("%s %s: %d %s, want 405 naming the reason", rt.Method, path, r.status, r.body)
		}
	}
	if writes == 0 {
		t.Fatal("no write route tried")
	}
	if f := e.farm("web"); f["virtual-addr"] != "10.99.0.1" {
		t.Errorf("farm changed: %v", f)
	}
}
