package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/store"
)

const testKey = "test-key-0123456789"

type env struct {
	t     testing.TB
	plane *fake.Plane
	eng   *engine.Engine
	st    *store.Bolt
	h     http.Handler
}

func newEnv(t testing.TB) *env {
	t.Helper()
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	plane := fake.New()
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(context.Background(), log, plane, st)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, plane: plane, eng: eng, st: st, h: api.New(log, eng, testKey)}
}

type resp struct {
	status int
	body   string
	header http.Header
}

func (e *env) doKey(key, method, path, body string) resp {
	e.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	if key != "" {
		req.Header.Set(api.KeyHeader, key)
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, req)
	return resp{w.Code, w.Body.String(), w.Header()}
}

func (e *env) do(method, path, body string) resp {
	e.t.Helper()
	return e.doKey(testKey, method, path, body)
}

// must runs a request that must answer 200.
func (e *env) must(method, path, body string) string {
	e.t.Helper()
	r := e.do(method, path, body)
	if r.status != http.StatusOK {
		e.t.Fatalf("%s %s: status %d: %s", method, path, r.status, r.body)
	}
	return r.body
}

// farmJSON returns one farm from GET /farms/{name} as a map.
func (e *env) farm(name string) map[string]any {
	e.t.Helper()
	var out struct{ Farms []map[string]any }
	if err := json.Unmarshal([]byte(e.must("GET", "/farms/"+name, "")), &out); err != nil || len(out.Farms) != 1 {
		e.t.Fatalf("GET /farms/%s: %v %v", name, err, out)
	}
	return out.Farms[0]
}

// planeDump renders what the fake kernel holds, for before/after comparisons.
func (e *env) planeDump() string {
	farms := e.plane.Farms()
	var b strings.Builder
	for _, name := range sortedKeys(farms) {
		b.Write(farms[name].AppendJSON(nil))
		b.WriteByte('\n')
	}
	return b.String()
}

func (e *env) storeDump() string {
	e.t.Helper()
	farms, err := e.st.Load(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for i := range farms {
		b.Write(farms[i].AppendJSON(nil))
		b.WriteByte('\n')
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

// nftlbWeb is a request as nftlb's users send it: every value a string.
const nftlbWeb = `{"farms":[{"name":"web","family":"ipv4","virtual-addr":"10.0.0.1","virtual-ports":"80",
	"protocol":"tcp","mode":"snat","scheduler":"weight","state":"up",
	"backends":[{"name":"b1","ip-addr":"10.200.0.11","port":"80","weight":"2","priority":"1","state":"up"},
	            {"name":"b2","ip-addr":"10.200.0.12","port":"80","weight":"1"}]}]}`

func TestAuth(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		key    string
		status int
	}{{"", 401}, {"wrong", 401}, {testKey + "x", 401}, {testKey, 200}} {
		r := e.doKey(c.key, "GET", "/farms", "")
		if r.status != c.status {
			t.Errorf("key %q: status %d, want %d (%s)", c.key, r.status, c.status, r.body)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("key %q: Content-Type %q", c.key, ct)
		}
		if c.status == 401 && !strings.Contains(r.body, `{"response": "`) {
			t.Errorf("key %q: body %s has no error", c.key, r.body)
		}
	}
	// Writes are refused too, and change nothing.
	if r := e.doKey("wrong", "POST", "/farms", nftlbWeb); r.status != 401 {
		t.Fatalf("POST with wrong key: %d", r.status)
	}
	if n := e.eng.Snapshot().Len(); n != 0 {
		t.Fatalf("unauthorized POST changed state: %d farms", n)
	}
	// A server without a key serves nobody.
	noKey := api.New(slog.New(slog.DiscardHandler), e.eng, "")
	w := httptest.NewRecorder()
	noKey.ServeHTTP(w, httptest.NewRequest("GET", "/farms", nil))
	if w.Code != 401 {
		t.Fatalf("server without key: %d", w.Code)
	}
}

func TestNftlbRequestAndDefaults(t *testing.T) {
	e := newEnv(t)
	if body := e.must("POST", "/farms", nftlbWeb); body != `{"response": "success"}` {
		t.Fatalf("POST answer %q", body)
	}
	f := e.farm("web")
	want := map[string]any{
		"name": "web", "virtual-addr": "10.0.0.1", "virtual-ports": "80", "scheduler": "weight",
		// defaults filled in
		"persist-ttl": "60", "persistence": "none", "helper": "none", "priority": "1", "tcp-strict": "off",
		"sched-param": "none", "log": "none", "mark": "0x0", "est-connlimit": "0",
	}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("farm field %q = %v, want %v", k, f[k], v)
		}
	}
	bs := f["backends"].([]any)
	if len(bs) != 2 {
		t.Fatalf("backends %v", bs)
	}
	b2 := bs[1].(map[string]any)
	if b2["weight"] != "1" || b2["priority"] != "1" || b2["state"] != "up" || b2["mark"] != "0x0" {
		t.Errorf("backend defaults: %v", b2)
	}
	// Numbers as JSON numbers work too.
	e.must("PUT", "/farms/web/backends", `{"backends":[{"name":"b2","weight":5}]}`)
	if w := e.farm("web")["backends"].([]any)[1].(map[string]any)["weight"]; w != "5" {
		t.Errorf("weight after numeric patch: %v", w)
	}
	// GET /farms, GET /state and GET /farms/web agree.
	all := e.must("GET", "/farms", "")
	if state := e.must("GET", "/state", ""); state != all {
		t.Errorf("GET /state differs from GET /farms")
	}
	if one := e.must("GET", "/farms/web", ""); one != all {
		t.Errorf("GET /farms/web = %s, GET /farms = %s", one, all)
	}
	var backends struct{ Backends []map[string]string }
	if err := json.Unmarshal([]byte(e.must("GET", "/farms/web/backends", "")), &backends); err != nil || len(backends.Backends) != 2 {
		t.Fatalf("GET backends: %v %v", err, backends)
	}
	if backends.Backends[0]["ip-addr"] != "10.200.0.11" {
		t.Errorf("backend b1: %v", backends.Backends[0])
	}
}

func TestPatchSemantics(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", nftlbWeb)
	// A farm patch changes only the fields it names.
	e.must("PUT", "/farms", `{"farms":[{"name":"web","scheduler":"rr","persistence":"srcip"}]}`)
	f := e.farm("web")
	if f["scheduler"] != "rr" || f["persistence"] != "srcip" || f["virtual-addr"] != "10.0.0.1" || len(f["backends"].([]any)) != 2 {
		t.Fatalf("after patch: %v", f)
	}
	// Backends are matched by name: b1 is patched, b3 appended, b2 kept.
	e.must("POST", "/farms/web/backends", `{"backends":[{"name":"b1","state":"down"},{"name":"b3","ip-addr":"10.200.0.13"}]}`)
	bs := e.farm("web")["backends"].([]any)
	if len(bs) != 3 {
		t.Fatalf("backends: %v", bs)
	}
	b1 := bs[0].(map[string]any)
	if b1["state"] != "down" || b1["ip-addr"] != "10.200.0.11" || b1["weight"] != "2" {
		t.Errorf("b1 after patch: %v", b1)
	}
	// A bare backend object works too.
	e.must("PUT", "/farms/web/backends", `{"name":"b3","weight":"7"}`)
	if w := e.farm("web")["backends"].([]any)[2].(map[string]any)["weight"]; w != "7" {
		t.Errorf("b3 weight %v", w)
	}
	// PUT /farms/{name}: bare object without a name, and the envelope form.
	e.must("PUT", "/farms/web", `{"mode":"dnat"}`)
	e.must("PUT", "/farms/web", `{"farms":[{"name":"web","helper":"ftp"}]}`)
	e.must("PUT", "/farms/api", `{"virtual-addr":"10.0.0.2","virtual-ports":"443"}`)
	if f := e.farm("web"); f["mode"] != "dnat" || f["helper"] != "ftp" || f["scheduler"] != "rr" {
		t.Errorf("web after PUT /farms/web: %v", f)
	}
	if f := e.farm("api"); f["virtual-ports"] != "443" {
		t.Errorf("api: %v", f)
	}
	// Deletes.
	e.must("DELETE", "/farms/web/backends/b2", "")
	if bs := e.farm("web")["backends"].([]any); len(bs) != 2 || bs[1].(map[string]any)["name"] != "b3" {
		t.Errorf("after backend delete: %v", bs)
	}
	e.must("DELETE", "/farms/web", "")
	if r := e.do("GET", "/farms/web", ""); r.status != 404 {
		t.Errorf("GET deleted farm: %d", r.status)
	}
	if _, ok := e.plane.Farms()["web"]; ok {
		t.Errorf("deleted farm still in the data plane")
	}
}

func bulkBody(n int, start int) string {
	var b strings.Builder
	b.WriteString(`{"farms":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		j := start + i
		fmt.Fprintf(&b, `{"name":"f%05d","virtual-addr":"10.%d.%d.1","virtual-ports":"80","backends":[{"name":"b1","ip-addr":"10.200.%d.%d","port":"8080"}]}`,
			j, j>>8, j&255, j>>8, j&255)
	}
	b.WriteString("]}")
	return b.String()
}

func TestBulkIsOneTransaction(t *testing.T) {
	e := newEnv(t)
	before := e.plane.Applies()
	e.must("POST", "/farms", bulkBody(1000, 0))
	if got := e.plane.Applies() - before; got != 1 {
		t.Fatalf("1000 farms took %d data plane transactions, want 1", got)
	}
	if n := len(e.plane.Farms()); n != 1000 {
		t.Fatalf("plane holds %d farms", n)
	}
	if got := strings.Count(e.storeDump(), "\n"); got != 1000 {
		t.Fatalf("store holds %d farms", got)
	}
}

// Concurrent patches of one farm are decoded inside the transaction, so none is lost.
func TestConcurrentPatchesKeepEveryUpdate(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80"}]}`)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"backends":[{"name":"b%d","ip-addr":"10.200.0.%d"}]}`, i, i+1)
			if r := e.do("PUT", "/farms/web/backends", body); r.status != 200 {
				t.Errorf("PUT backend %d: %d %s", i, r.status, r.body)
			}
		})
	}
	wg.Wait()
	if bs := e.farm("web")["backends"].([]any); len(bs) != 20 {
		t.Fatalf("%d backends after 20 concurrent adds", len(bs))
	}
}

func TestErrors(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", nftlbWeb)
	big := `{"farms":[{"name":"web","log-prefix":"` + strings.Repeat("x", api.MaxBody) + `"}]}`
	cases := []struct {
		name, method, path, body string
		status                   int
		want                     []string // substrings of the error message; the first is nftlb's text
	}{
		{"bad scheduler", "PUT", "/farms", `{"farms":[{"name":"web","scheduler":"foo"}]}`, 400,
			[]string{"error parsing buffer. ", `"scheduler"`, `"foo"`, "rr, weight, hash, symhash, maglev"}},
		{"bad backend weight", "PUT", "/farms/web/backends", `{"backends":[{"name":"b1","weight":"x"}]}`, 400,
			[]string{"error parsing buffer. ", `backend "b1"`, `"weight"`, "0-10000"}},
		{"unknown field", "POST", "/farms", `{"farms":[{"name":"web","colour":"red"}]}`, 400,
			[]string{"error parsing buffer. ", `"colour"`, "unknown field", "virtual-addr"}},
		{"malformed json", "POST", "/farms", `{"farms":[`, 400, []string{"the structure is invalid. ", "JSON"}},
		{"wrong shape", "POST", "/farms", `{"farms":{"name":"x"}}`, 400, []string{"the structure is invalid. ", "array"}},
		{"empty body", "POST", "/farms", ``, 400, []string{"the structure is invalid. ", "empty"}},
		{"no name", "POST", "/farms", `{"farms":[{"virtual-addr":"10.0.0.8"}]}`, 404, []string{"the object to modify is unknown. ", `"name"`}},
		{"bad name", "POST", "/farms", `{"farms":[{"name":"a b"}]}`, 400, []string{"error parsing buffer. ", `"name"`, "A-Z"}},
		{"name mismatch", "PUT", "/farms/web", `{"name":"other"}`, 400, []string{"error parsing buffer. ", `"other"`, "path"}},
		{"bad family", "PUT", "/farms/web", `{"virtual-addr":"2001:db8::1"}`, 400, []string{"error parsing buffer. ", "virtual-addr", "ipv4"}},
		{"second farm in one put", "PUT", "/farms/web", `{"farms":[{"name":"web"},{"name":"web"}]}`, 400, []string{"error parsing buffer. ", "exactly"}},
		{"conflict", "POST", "/farms", `{"farms":[{"name":"web2","virtual-addr":"10.0.0.1","virtual-ports":"80"}]}`, 409,
			[]string{"error parsing buffer. ", `"web"`, "10.0.0.1"}},
		{"bulk with one bad farm", "POST", "/farms", `{"farms":[{"name":"ok1","virtual-addr":"10.0.0.9"},{"name":"bad","virtual-addr":"10.0.0.8","mode":"nat"}]}`, 400,
			[]string{"error parsing buffer. ", `"mode"`, `"nat"`, "snat, dnat, dsr, stlsdnat"}},
		{"get missing farm", "GET", "/farms/nope", "", 404, []string{"invalid request. ", `farm "nope" does not exist`}},
		{"delete missing farm", "DELETE", "/farms/nope", "", 404, []string{"error deleting farm. ", `"nope"`}},
		{"backends of missing farm", "PUT", "/farms/nope/backends", `{"backends":[{"name":"b1","ip-addr":"10.0.0.1"}]}`, 404, []string{"the object to modify is unknown. ", `"nope"`}},
		{"get backends of missing farm", "GET", "/farms/nope/backends", "", 404, []string{"the object to modify is unknown. ", `"nope"`}},
		{"delete missing backend", "DELETE", "/farms/web/backends/nope", "", 404, []string{"error deleting backend. ", `backend "nope"`}},
		{"delete backends of missing farm", "DELETE", "/farms/nope/backends", "", 404, []string{"error deleting backend. ", `"nope"`}},
		{"sessions of missing farm", "GET", "/farms/nope/sessions", "", 404, []string{"invalid request. ", `"nope"`}},
		{"delete sessions of missing backend", "DELETE", "/farms/web/backends/nope/sessions", "", 404, []string{"error deleting session. ", `backend "nope"`}},
		{"delete missing address", "DELETE", "/addresses/nope", "", 404, []string{"error stopping address. ", `address "nope"`}},
		{"delete missing farm address", "DELETE", "/farms/web/addresses/nope", "", 404, []string{"error deleting farm address. ", `address "nope"`}},
		{"address of the wrong family", "POST", "/addresses", `{"addresses":[{"name":"lonely","family":"ipv6","ip-addr":"10.9.0.1","ports":"80"}]}`, 400, []string{"error parsing buffer. ", `address "lonely"`, `"ip-addr"`, "family ipv6"}},
		{"delete body naming nothing", "DELETE", "/farms", `{"farms":[{"name":"web"}]}`, 400, []string{"error parsing buffer. ", "names the backends"}},
		{"unknown path", "GET", "/nope", "", 400, []string{"invalid request. ", "/nope"}},
		{"unknown path post", "POST", "/nope", "{}", 404, []string{"invalid request. ", "/nope"}},
		{"wrong method", "PATCH", "/farms", "{}", 404, []string{"invalid request. ", "PATCH", "GET"}},
		{"wrong method on farm", "POST", "/farms/web", `{}`, 404, []string{"invalid request. ", "POST"}},
		{"too large", "PUT", "/farms/web", big, 413, []string{"the structure is invalid. ", "larger than"}},
		{"bad format", "GET", "/farms?format=xml", "", 400, []string{"invalid request. ", "ipvsadm"}},
		{"restore with a bad farm", "PUT", "/state", `{"farms":[{"name":"x","virtual-addr":"10.0.0.1","protocol":"icmp"}]}`, 400,
			[]string{"error parsing buffer. ", `"protocol"`, "tcp, udp, sctp, all"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, plane, applies, saved := e.must("GET", "/farms", ""), e.planeDump(), e.plane.Applies(), e.storeDump()
			r := e.do(c.method, c.path, c.body)
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var msg struct{ Response string }
			if err := json.Unmarshal([]byte(r.body), &msg); err != nil || msg.Response == "" || !strings.HasPrefix(r.body, `{"response": "`) {
				t.Fatalf("body %q is not nftlb's {\"response\": ...}", r.body)
			}
			if len(c.want) > 0 && !strings.HasPrefix(msg.Response, c.want[0]) {
				t.Errorf("response %q does not start with nftlb's %q", msg.Response, c.want[0])
			}
			for _, w := range c.want {
				if !strings.Contains(msg.Response, w) {
					t.Errorf("response %q does not mention %s", msg.Response, w)
				}
			}
			// A rejected change leaves everything as it was.
			if after := e.must("GET", "/farms", ""); after != before {
				t.Errorf("state changed:\nbefore %s\nafter  %s", before, after)
			}
			if e.planeDump() != plane || e.plane.Applies() != applies {
				t.Errorf("data plane changed")
			}
			if e.storeDump() != saved {
				t.Errorf("store changed")
			}
		})
	}
}

func TestKernelFailure(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", nftlbWeb)
	before, plane, saved := e.must("GET", "/farms", ""), e.planeDump(), e.storeDump()
	e.plane.FailApply = func(plan.Diff) error { return fake.ErrInjected }
	for _, req := range [][3]string{
		{"POST", "/farms", bulkBody(10, 1)},
		{"PUT", "/farms/web/backends", `{"backends":[{"name":"b9","ip-addr":"10.200.0.19"}]}`},
		{"DELETE", "/farms/web", ""},
		{"PUT", "/state", `{"farms":[]}`},
	} {
		r := e.do(req[0], req[1], req[2])
		if r.status != 500 || !strings.Contains(r.body, fake.ErrInjected.Error()) {
			t.Errorf("%s %s: %d %s, want 500 with the kernel's error", req[0], req[1], r.status, r.body)
		}
	}
	if after := e.must("GET", "/farms", ""); after != before {
		t.Errorf("state changed after kernel failures")
	}
	if e.planeDump() != plane || e.storeDump() != saved {
		t.Errorf("plane or store changed after kernel failures")
	}
	e.plane.FailApply = nil
	e.must("DELETE", "/farms/web", "")
}

func TestRestoreReplacesEverything(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", bulkBody(5, 0))
	applies := e.plane.Applies()
	// f00003 is replaced, not patched: its backend disappears.
	e.must("PUT", "/state", `{"farms":[{"name":"f00003","virtual-addr":"10.0.3.1","virtual-ports":"81"},
		{"name":"new","virtual-addr":"10.9.9.9","virtual-ports":"80","persistence":"srcip"}]}`)
	if got := e.plane.Applies() - applies; got != 1 {
		t.Errorf("restore took %d transactions", got)
	}
	var st struct{ Farms []map[string]any }
	json.Unmarshal([]byte(e.must("GET", "/state", "")), &st)
	if len(st.Farms) != 2 || st.Farms[0]["name"] != "f00003" || st.Farms[1]["name"] != "new" {
		t.Fatalf("after restore: %v", st.Farms)
	}
	if bs := st.Farms[0]["backends"].([]any); len(bs) != 0 || st.Farms[0]["virtual-ports"] != "81" {
		t.Errorf("f00003 was patched, not replaced: %v", st.Farms[0])
	}
	if n := len(e.plane.Farms()); n != 2 {
		t.Errorf("plane holds %d farms", n)
	}
	if got := strings.Count(e.storeDump(), "\n"); got != 2 {
		t.Errorf("store holds %d farms", got)
	}
	// An empty restore clears everything.
	e.must("PUT", "/state", `{"farms":[]}`)
	if e.eng.Snapshot().Len() != 0 || len(e.plane.Farms()) != 0 {
		t.Errorf("empty restore left farms")
	}
}

func TestDumpRestoreRoundTrip(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", nftlbWeb)
	e.must("POST", "/farms", bulkBody(50, 1))
	e.must("POST", "/policies", `{"policies":[{"name":"deny","type":"blacklist","elements":[{"data":"192.0.2.0/24"},{"data":"2001:db8:1::/48"}]}]}`)
	e.must("POST", "/tables", `{"name":"fl","type":"flow:src-ip,dst-port","valtype":"mark,limit","entries":[{"key":"10.0.0.1,80","value":"7,100"}]}`)
	e.must("PUT", "/farms/v6", `{"family":"ipv6","virtual-addr":"2001:db8::1","virtual-ports":"443,8000-8100","protocol":"udp",
		"mode":"dnat","scheduler":"hash","sched-param":"srcip dstport","persistence":"srcip-srcport","persist-ttl":"300",
		"log":"input","log-prefix":"v6 ","new-rtlimit":"10","new-rtlimit-burst":"5","tcp-strict":"on","policies":[{"name":"deny"}],
		"backends":[{"name":"a","ip-addr":"2001:db8::10","mark":"0x20","est-connlimit":"9","priority":"2","state":"off"}]}`)
	e.must("PUT", "/farms/fwm", `{"mark":"0x10","protocol":"all"}`)
	// An address object no farm uses is in the dump (those a farm uses
	// are in the farm).
	e.must("POST", "/addresses", `{"addresses":[{"name":"lone","family":"ipv6","ip-addr":"2001:db8::99","ports":"53","protocol":"udp"}]}`)
	dump := e.must("GET", "/state", "")
	if !strings.Contains(dump, `"addresses":[{"name":"lone","family":"ipv6","ip-addr":"2001:db8::99"`) {
		t.Errorf("the dump lacks the unused address: %.300s", dump[max(0, len(dump)-300):])
	}
	for _, path := range []string{"/state", "/farms"} {
		r := e.do("GET", path, "")
		if cl := r.header.Get("Content-Length"); cl != strconv.Itoa(len(r.body)) {
			t.Errorf("GET %s: Content-Length %q, body %d bytes", path, cl, len(r.body))
		}
	}
	if r := newEnv(t).do("GET", "/state", ""); r.body != "{\"farms\":[]}\n" || r.header.Get("Content-Length") != "13" {
		t.Errorf("empty dump %q, Content-Length %q", r.body, r.header.Get("Content-Length"))
	}

	other := newEnv(t)
	other.must("POST", "/farms", bulkBody(3, 900)) // replaced by the restore
	other.must("POST", "/addresses", `{"addresses":[{"name":"gone","ip-addr":"10.9.9.1","ports":"80"}]}`)
	other.must("PUT", "/state", dump)
	if again := other.must("GET", "/state", ""); again != dump {
		t.Fatalf("dump -> restore -> dump differs:\n%s\n%s", dump, again)
	}
	// Restoring the same state again changes nothing.
	applies := other.plane.Applies()
	other.must("PUT", "/state", dump)
	if other.plane.Applies() != applies {
		t.Errorf("restoring an identical state touched the data plane")
	}
}

func TestListText(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", nftlbWeb)
	r := e.do("GET", "/farms?format=ipvsadm&numeric=1", "")
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("status %d, type %q", r.status, r.header.Get("Content-Type"))
	}
	want := "Prot LocalAddress:Port Scheduler Flags\n" +
		"  -> RemoteAddress:Port           Forward Weight State\n" +
		"TCP  10.0.0.1:80 weight\n" +
		"  -> 10.200.0.11:80               Masq    2      up\n" +
		"  -> 10.200.0.12:80               Masq    1      up\n"
	if r.body != want {
		t.Fatalf("got\n%s\nwant\n%s", r.body, want)
	}
	if r := e.must("GET", "/farms?format=names", ""); r != "web\n" {
		t.Errorf("format=names: %q", r)
	}
	if r := e.do("GET", "/farms?format=ipvsadm&numeric=maybe", ""); r.status != 400 {
		t.Errorf("numeric=maybe: %d", r.status)
	}
}

func TestVersion(t *testing.T) {
	e := newEnv(t)
	var v map[string]string
	if err := json.Unmarshal([]byte(e.must("GET", "/version", "")), &v); err != nil || v["version"] == "" || v["farms"] != "0" {
		t.Fatalf("version: %v %v", v, err)
	}
}
