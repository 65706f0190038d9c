package api_test

import (
	"strings"
	"testing"
)

// nftlb's configuration document ({"farms", "addresses", "policies"} at the
// top level, its config file's form) is taken by POST and PUT of /farms,
// /policies and /addresses, in one transaction: a farm naming an address
// and a policy of the same document gets them; an address no farm uses
// is kept on its own (GET /addresses: used 0), and one that is bad refuses
// the whole document.
func TestConfigDocument(t *testing.T) {
	e := newEnv(t)
	const success = `{"response": "success"}`
	doc := `{"policies":[{"name":"bl","type":"blacklist","elements":[{"data":"192.0.2.0/24"}]}],
		"addresses":[{"name":"myaddr","family":"ipv4","ip-addr":"10.96.0.20","ports":"8080","protocol":"tcp"}],
		"farms":[{"name":"doc","mode":"snat","addresses":[{"name":"myaddr"}],"policies":[{"name":"bl"}],
			"backends":[{"name":"b1","ip-addr":"10.200.0.1","port":"80"}]}]}`
	for _, path := range []string{"/farms", "/policies", "/addresses"} {
		if got := e.must("POST", path, doc); got != success {
			t.Fatalf("POST %s of a document: %q", path, got)
		}
		f := e.farm("doc")
		if f["virtual-addr"] != "10.96.0.20" || f["virtual-ports"] != "8080" || !strings.Contains(e.must("GET", "/farms/doc", ""), `"policies":[{"name":"bl"}]`) {
			t.Errorf("POST %s: farm %v", path, f)
		}
		e.must("DELETE", "/farms/doc", "")
	}
	e.must("POST", "/farms", `{"farms":[{"name":"x","virtual-addr":"10.96.0.30","virtual-ports":"80"}],
		"addresses":[{"name":"lone","family":"ipv4","ip-addr":"10.96.0.31","ports":"80","protocol":"tcp"}]}`)
	if got := e.must("GET", "/addresses/lone", ""); !strings.Contains(got, `"ip-addr":"10.96.0.31"`) || !strings.Contains(got, `"used":"0"`) {
		t.Errorf("a document's unused address: %s", got)
	}
	before := e.must("GET", "/farms", "")
	beforeAddrs := e.must("GET", "/addresses", "")
	r := e.do("POST", "/farms", `{"farms":[{"name":"y","virtual-addr":"10.96.0.40","virtual-ports":"80"}],
		"addresses":[{"name":"lone2","family":"ipv6","ip-addr":"10.96.0.41","ports":"80","protocol":"tcp"}]}`)
	if r.status != 400 || !strings.Contains(r.body, `ip-addr`) || !strings.Contains(r.body, `family ipv6`) {
		t.Errorf("a document with a bad unused address: %d %s", r.status, r.body)
	}
	if after, afterAddrs := e.must("GET", "/farms", ""), e.must("GET", "/addresses", ""); after != before || afterAddrs != beforeAddrs {
		t.Errorf("a refused document changed the state:\n%s\n%s\n%s\n%s", before, after, beforeAddrs, afterAddrs)
	}
	if r := e.do("POST", "/farms", `{"farms":[],"colour":"red"}`); r.status != 400 || !strings.Contains(r.body, `colour`) {
		t.Errorf("an unknown top-level key: %d %s", r.status, r.body)
	}
}

// DELETE /policies with a body deletes the policies it names that exist
// (kube-nftlb names a NetworkPolicy's four lists, some of which may not
// exist); without a body, every policy.
func TestDeleteNamedPolicies(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/policies", `{"policies":[{"name":"a","type":"whitelist","elements":[{"data":"10.0.0.0/8"}]},{"name":"b"},{"name":"c"}]}`)
	if got := e.must("DELETE", "/policies", `{"policies":[{"name":"a","type":"","family":"","elements":null},{"name":"nope"},{"name":"b"}]}`); got != `{"response": "success"}` {
		t.Fatal(got)
	}
	if got := e.must("GET", "/policies", ""); strings.Contains(got, `"name":"a"`) || strings.Contains(got, `"name":"b"`) || !strings.Contains(got, `"name":"c"`) {
		t.Errorf("after deleting a and b: %s", got)
	}
	if r := e.do("DELETE", "/policies", `{"farms":[]}`); r.status != 400 {
		t.Errorf("a body that names no policies: %d %s", r.status, r.body)
	}
	e.must("DELETE", "/policies", "")
	if got := e.must("GET", "/policies", ""); strings.Contains(got, `"name":"c"`) {
		t.Errorf("after deleting every policy: %s", got)
	}
}
