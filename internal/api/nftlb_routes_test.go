package api_test

import (
	"strings"
	"testing"
)

// nftlb's routes beyond farms and backends, and nftlb's reply bodies.
func TestNftlbRoutes(t *testing.T) {
	e := newEnv(t)
	const success = `{"response": "success"}`
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/farms", nftlbWeb},
		{"POST", "/farms", `{"farms":[{"name":"k","addresses":[{"name":"k-svc","family":"ipv4","ip-addr":"10.96.0.10","ports":"53","protocol":"udp"}],
			"backends":[{"name":"p1","ip-addr":"10.200.0.1","port":"5353"},{"name":"p2","ip-addr":"10.200.0.2","port":"5353"}]}]}`},
		{"DELETE", "/farms/k/backends", ""},
		{"POST", "/addresses", `{"addresses":[{"name":"k-svc","ip-addr":"10.96.0.11","ports":"53","protocol":"udp"}]}`},
		{"POST", "/farms", `{"farms":[{"name":"k","newname":"k2"}]}`},
	} {
		if got := e.must(c.method, c.path, c.body); got != success {
			t.Fatalf("%s %s: %q", c.method, c.path, got)
		}
	}
	k := e.farm("k2")
	if k["virtual-addr"] != "10.96.0.11" || len(k["backends"].([]any)) != 0 || e.do("GET", "/farms/k", "").status != 404 {
		t.Fatalf("k2 = %v", k)
	}
	addrs := e.must("GET", "/addresses", "")
	for _, want := range []string{`"name":"k-svc"`, `"ip-addr":"10.96.0.11"`, `"name":"web-addr"`, `"used":"1"`} {
		if !strings.Contains(addrs, want) {
			t.Errorf("GET /addresses lacks %s: %s", want, addrs)
		}
	}
	if got := e.must("GET", "/addresses/nope", ""); got != `{"addresses":[]}`+"\n" {
		t.Errorf("GET /addresses/nope = %q", got)
	}
	// Deleting the farm's only address leaves it listening nowhere, in
	// the state but not in the kernel.
	if got := e.must("DELETE", "/addresses/k-svc", ""); got != success {
		t.Fatal(got)
	}
	if k := e.farm("k2"); k["virtual-addr"] != "" || strings.Contains(e.planeDump(), "k2") {
		t.Errorf("after DELETE /addresses: %v, plane %s", k, e.planeDump())
	}
	// A farm without persistence has no sessions (nftlb: 200, empty list).
	if got := e.must("GET", "/farms/web/sessions", ""); got != `{"sessions":[]}`+"\n" {
		t.Errorf("sessions = %q", got)
	}
	r := e.do("DELETE", "/farms/web/sessions", "")
	if r.body != success || r.header.Get("X-Xlb-Sessions-Deleted") != "0" {
		t.Errorf("flush: %d %s %v", r.status, r.body, r.header)
	}
	// DELETE with a body removes what it lists.
	e.must("POST", "/farms", `{"farms":[{"name":"web","backends":[{"name":"b2","ip-addr":"10.200.0.12"}]}]}`)
	if got := e.must("DELETE", "/farms", `{"farms":[{"name":"web","backends":[{"name":"b2"}]}]}`); got != success {
		t.Fatal(got)
	}
	if bs := e.farm("web")["backends"].([]any); len(bs) != 1 {
		t.Errorf("backends after DELETE with a body: %v", bs)
	}
	// DELETE /farms takes everything.
	if got := e.must("DELETE", "/farms", ""); got != success {
		t.Fatal(got)
	}
	if got := e.must("GET", "/farms", ""); got != `{"farms":[]}`+"\n" || e.planeDump() != "" {
		t.Errorf("after DELETE /farms: %s, plane %q", got, e.planeDump())
	}
}
