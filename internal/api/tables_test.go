package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
)

func (e *env) text(method, path, body string) resp {
	e.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set(api.KeyHeader, testKey)
	req.Header.Set("Content-Type", "text/plain")
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	return resp{status: w.Code, body: w.Body.String(), header: w.Header()}
}

func batch(t *testing.T, body string) (done, failed int, errs map[string]string) {
	t.Helper()
	var out struct {
		Done, Failed int
		Errors       []struct{ Key, Error string }
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	errs = map[string]string{}
	for _, e := range out.Errors {
		errs[e.Key] = e.Error
	}
	return out.Done, out.Failed, errs
}

func TestTablesAPI(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/tables", `{"name":"acl","type":"addr","valtype":"mark,farm","limit":"4"}`)
	if r := e.do("POST", "/tables", `{"name":"acl"}`); r.status != http.StatusConflict || !strings.Contains(r.body, `table \"acl\" exists`) {
		t.Errorf("create of an existing table: %d %s", r.status, r.body)
	}
	// A text batch: per-entry results, the good entries added.
	r := e.text("POST", "/tables/acl/entries", "# ipfw style\n10.0.0.0/8 16,web\n10.1.0.0/16 mark=17\n10.0.0.0/8 1\n10.2.0.0/33\n192.0.2.7 timeout 60\n")
	if r.status != 200 {
		t.Fatalf("batch: %d %s", r.status, r.body)
	}
	done, failed, errs := batch(t, r.body)
	if done != 3 || failed != 2 || !strings.Contains(errs["10.0.0.0/8"], "entry exists") || !strings.Contains(errs["10.2.0.0/33"], "malformed prefix") {
		t.Errorf("batch result %d done, %d failed: %v", done, failed, errs)
	}
	// Past the limit (4): the fifth entry fails.
	r = e.do("POST", "/tables/acl/entries?atomic=1", `{"entries":[{"key":"172.16.0.0/12"},{"key":"fd00::/8"}]}`)
	if r.status != http.StatusConflict || !strings.Contains(r.body, `table \"acl\" entry \"fd00::/8\": the table is full (limit 4 entries)`) {
		t.Errorf("atomic batch past the limit: %d %s", r.status, r.body)
	}
	if got := e.must("GET", "/tables/acl/lookup/10.1.2.3", ""); !strings.Contains(got, `"key":"10.1.0.0/16"`) || !strings.Contains(got, `"mark":"17"`) {
		t.Errorf("lookup: %s", got)
	}
	if got := e.must("GET", "/tables/acl/lookup/10.9.9.9", ""); !strings.Contains(got, `"key":"10.0.0.0/8"`) || !strings.Contains(got, `"farm":"web"`) {
		t.Errorf("lookup: %s", got)
	}
	if r := e.do("GET", "/tables/acl/lookup/11.0.0.1", ""); r.status != 404 {
		t.Errorf("lookup of a missing key: %d %s", r.status, r.body)
	}
	list := e.must("GET", "/tables/acl/entries?format=text", "")
	if !strings.HasPrefix(list, "10.0.0.0/8 mark=16,farm=web\n10.1.0.0/16 mark=17,farm=\n192.0.2.7 mark=0,farm= timeout ") {
		t.Errorf("text listing:\n%s", list)
	}
	info := e.must("GET", "/tables/acl?detail=1", "")
	for _, want := range []string{`"count":"3"`, `"limit":"4"`, `"valtype":"mark,farm"`, `"algorithm":"fake"`, `"memory":"`} {
		if !strings.Contains(info, want) {
			t.Errorf("info lacks %s: %s", want, info)
		}
	}
	// Lock: every change is refused until unlock.
	e.must("PUT", "/tables/acl", `{"locked":"true"}`)
	if r := e.text("POST", "/tables/acl/entries", "172.16.0.0/12\n"); r.status != http.StatusConflict || !strings.Contains(r.body, "is locked") {
		t.Errorf("add to a locked table: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/tables/acl", `{"limit":"10"}`); r.status != http.StatusConflict {
		t.Errorf("modify of a locked table: %d %s", r.status, r.body)
	}
	e.must("PUT", "/tables/acl", `{"locked":"false","limit":"10"}`)
	if r := e.do("PUT", "/tables/acl", `{"type":"number"}`); r.status != 400 || !strings.Contains(r.body, "cannot be changed") {
		t.Errorf("type change: %d %s", r.status, r.body)
	}
	// Swap with a table of the same kind; refused with another.
	e.must("POST", "/tables", `{"name":"next","valtype":"mark,farm","entries":[{"key":"198.51.100.0/24","value":{"mark":"5"}}]}`)
	e.must("POST", "/tables/acl/swap/next", "")
	if got := e.must("GET", "/tables/acl/lookup/198.51.100.1", ""); !strings.Contains(got, `"mark":"5"`) {
		t.Errorf("after swap: %s", got)
	}
	e.must("POST", "/tables", `{"name":"num","type":"number"}`)
	if r := e.do("POST", "/tables/acl/swap/num", ""); r.status != http.StatusConflict || !strings.Contains(r.body, "different types") {
		t.Errorf("swap of different types: %d %s", r.status, r.body)
	}
	// Delete one entry (a prefix in the path), a batch, flush, destroy.
	e.must("DELETE", "/tables/next/entries/10.1.0.0/16", "")
	r = e.text("DELETE", "/tables/next/entries", "10.0.0.0/8\n10.0.0.0/8\n")
	if done, failed, _ := batch(t, r.body); done != 1 || failed != 1 {
		t.Errorf("delete batch: %s", r.body)
	}
	e.must("POST", "/tables/next/flush", "")
	if got := e.must("GET", "/tables/next", ""); !strings.Contains(got, `"count":"0"`) {
		t.Errorf("after flush: %s", got)
	}
	e.must("DELETE", "/tables/next", "")
	if r := e.do("GET", "/tables/next", ""); r.status != 404 {
		t.Errorf("destroyed table: %d", r.status)
	}
}

func TestPoliciesAPI(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/policies", `{"policies":[{"name":"bl","type":"blacklist","elements":[{"data":"192.0.2.0/24"},{"data":"198.51.100.7","time":"300"}]}]}`)
	e.must("POST", "/farms", `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","policies":[{"name":"bl"}]}]}`)
	var out struct {
		Policies []struct {
			Name, Type, Used string
			Elements         []struct{ Data, Time string }
		}
	}
	if err := json.Unmarshal([]byte(e.must("GET", "/policies/bl", "")), &out); err != nil {
		t.Fatal(err)
	}
	p := out.Policies[0]
	if p.Type != "blacklist" || p.Used != "1" || len(p.Elements) != 2 || p.Elements[1].Data != "198.51.100.7" || p.Elements[1].Time == "" {
		t.Errorf("policy: %+v", p)
	}
	// Elements are added, existing ones updated (nftlb's POST).
	e.must("POST", "/policies/bl/elements", `{"elements":[{"data":"192.0.2.0/24"},{"data":"2001:db8::/32"}]}`)
	if got := e.must("GET", "/policies/bl/elements", ""); strings.Count(got, `"data"`) != 3 {
		t.Errorf("elements: %s", got)
	}
	e.must("DELETE", "/policies/bl/elements/2001:db8::/32", "")
	if r := e.do("DELETE", "/policies/bl", ""); r.status != http.StatusConflict || !strings.Contains(r.body, `used by farm \"web\"`) {
		t.Errorf("delete of a used policy: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/farms/web/policies", `{"policies":[{"name":"nope"}]}`); r.status != 400 || !strings.Contains(r.body, "no such policy") {
		t.Errorf("attach of a missing policy: %d %s", r.status, r.body)
	}
	e.must("POST", "/policies", `{"name":"wl","type":"whitelist"}`)
	e.must("POST", "/farms/web/policies", `{"policies":[{"name":"wl"}]}`)
	if got := e.farm("web")["policies"]; len(got.([]any)) != 2 {
		t.Errorf("farm policies after attach: %v", got)
	}
	if ps := e.plane.Policies()["web"]; len(ps) != 2 {
		t.Errorf("plane holds policies %v", ps)
	}
	e.must("DELETE", "/farms/web/policies/bl", "")
	if r := e.do("DELETE", "/farms/web/policies/bl", ""); r.status != 404 {
		t.Errorf("detach twice: %d", r.status)
	}
	e.must("DELETE", "/policies/bl", "")
	// A table without a verdict is not a policy.
	e.must("POST", "/tables", `{"name":"plain"}`)
	if r := e.do("GET", "/policies/plain", ""); r.status != 200 || strings.Contains(r.body, "plain") {
		t.Errorf("a plain table shown as a policy: %d %s (nftlb answers a missing policy with an empty list)", r.status, r.body)
	}
	if got := e.must("GET", "/policies", ""); strings.Count(got, `"name"`) != 1 {
		t.Errorf("policies listing: %s", got)
	}
	// Giving it a type makes it one (one concept, two vocabularies); a
	// number table cannot be one.
	e.must("POST", "/policies", `{"name":"plain","type":"blacklist"}`)
	if got := e.must("GET", "/tables/plain", ""); !strings.Contains(got, `"verdict":"deny"`) {
		t.Errorf("table after POST /policies: %s", got)
	}
	e.must("POST", "/tables", `{"name":"ports","type":"number"}`)
	if r := e.do("POST", "/policies", `{"name":"ports","type":"blacklist"}`); r.status != 400 || !strings.Contains(r.body, "nftlb's policies are addr tables") {
		t.Errorf("policy over a number table: %d %s", r.status, r.body)
	}
}

// BenchmarkTableLookupAPI measures GET /tables/{name}/lookup/{addr} through
// the handler (no network): a table of 1M /24 prefixes and /32 hosts.
func BenchmarkTableLookupAPI(b *testing.B) {
	e := newEnv(b)
	e.must("POST", "/tables", `{"name":"big"}`)
	var sb strings.Builder
	for i := range 1_000_000 {
		if i%2 == 0 {
			fmt.Fprintf(&sb, "%d.%d.%d.0/24\n", 10+i>>16, byte(i>>8), byte(i))
		} else {
			fmt.Fprintf(&sb, "%d.%d.%d.1\n", 10+i>>16, byte(i>>8), byte(i))
		}
	}
	if r := e.text("POST", "/tables/big/entries?atomic=1", sb.String()); r.status != 200 {
		b.Fatalf("load: %d %s", r.status, r.body[:min(len(r.body), 300)])
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r := e.do("GET", fmt.Sprintf("/tables/big/lookup/10.%d.%d.77", byte(i>>8), byte(i&0xfe)), "")
		if r.status != 200 {
			b.Fatalf("lookup: %d %s", r.status, r.body)
		}
	}
}
