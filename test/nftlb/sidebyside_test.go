package nftlb

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// step is one request sent to both daemons.
type step struct {
	name, method, path, body string
	// same: both answer the same status and nftlb text (and GETs print
	// the same, see compareJSON). Otherwise refuse: a documented
	// difference where nftlb accepts and xlb refuses with this status and
	// a message holding refuseWith; nftlbOnly steps then undo nftlb's side.
	refuse     int
	refuseText string // nftlb's text xlb's answer starts with ("error parsing buffer" if empty)
	refuseWith string
	why        string // the reason, as docs/nftlb-compat.md gives it
	nftlbOnly  bool   // sent to nftlb only (undoes what xlb refused)
	// xlbOnly: sent to xlb only, which must answer 200: a route nftlb
	// lacks, or what brings xlb to nftlb's state after a documented
	// difference (why says which).
	xlbOnly bool
	// statuses: a documented difference of status codes only, nftlb's
	// then xlb's (the texts still start alike).
	statuses [2]int
	compare  bool // a GET whose bodies are compared with compareJSON
}

func same(name, method, path, body string) step {
	return step{name: name, method: method, path: path, body: body}
}

func get(path string) step {
	return step{name: "GET " + path, method: "GET", path: path, compare: true}
}

func refused(name, body, with, why string) []step {
	return []step{
		{name: name, method: "POST", path: "/farms", body: body, refuse: 400, refuseWith: with, why: why},
		{name: name + " (undone in nftlb)", method: "DELETE", path: "/farms", nftlbOnly: true},
	}
}

const notImplemented = "is not implemented by the nft data plane yet"

// TestSideBySide sends nftlb's documented API (its README's API section
// and object reference) to nftlb and to xlb and compares the answers.
func TestSideBySide(t *testing.T) {
	nftlb, xlb := startPeers(t)
	web := `{"farms":[{"name":"web","family":"ipv4","virtual-addr":"10.0.0.1","virtual-ports":"80","mode":"snat",
		"protocol":"tcp","scheduler":"weight","sched-param":"none","persistence":"srcip","persist-ttl":"120","helper":"none",
		"log":"none","mark":"0x0","priority":"1","state":"up","limits-ttl":"120","new-rtlimit":"10/second","new-rtlimit-burst":"5",
		"rst-rtlimit":"3/second","rst-rtlimit-burst":"2","est-connlimit":"100","tcp-strict":"off","queue":"-1","verdict":"log drop accept",
		"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":"8080","weight":"2","priority":"1","state":"up"},
		{"name":"b2","ip-addr":"10.1.0.2","port":"8080","weight":"1","priority":"2","state":"up"}]}]}`
	steps := []step{
		same("create a farm with backends", "POST", "/farms", web),
		get("/farms"), get("/farms/web"), get("/addresses"), get("/addresses/web-addr"), get("/addresses/nope"),
		same("add a backend (README example)", "POST", "/farms", `{"farms":[{"name":"web","backends":[{"name":"b3","ip-addr":"10.1.0.3","state":"up"}]}]}`),
		same("a backend goes down", "POST", "/farms", `{"farms":[{"name":"web","backends":[{"name":"b1","state":"down"}]}]}`),
		get("/farms/web"),
		same("patch farm fields", "PUT", "/farms", `{"farms":[{"name":"web","scheduler":"hash","sched-param":"srcip srcport","persistence":"srcip srcport","new-rtlimit":"0/second"}]}`),
		get("/farms/web"),
		same("a long log prefix", "POST", "/farms", `{"farms":[{"name":"web","log-prefix":"a-forty-character-log-prefix-0123456789ab"}]}`),
		get("/farms/web"),
		same("empty numbers are unset", "POST", "/farms", `{"farms":[{"name":"web","est-connlimit":"","new-rtlimit-burst":""}]}`),
		get("/farms/web"),
		same("delete a backend", "DELETE", "/farms/web/backends/b3", ""),
		same("delete a missing backend", "DELETE", "/farms/web/backends/nope", ""),
		same("delete a missing farm", "DELETE", "/farms/nope", ""),
		{name: "get a missing farm", method: "GET", path: "/farms/nope", statuses: [2]int{500, 404},
			why: "404 tells a missing farm from a broken server; nftlb's DELETE of a missing farm answers 404 too"},
		{name: "unknown key", method: "POST", path: "/farms", body: `{"farms":[{"name":"web","bogus":"1"}]}`, statuses: [2]int{500, 400},
			why: "bad input is the client's error (4xx): a 5xx makes clients and proxies retry and alerts count a server fault"},
		same("not JSON", "POST", "/farms", `not json`),
		same("farms not an array", "POST", "/farms", `{"farms":{"name":"x"}}`),
		// nftlb applies a farm object without a name to the farm it
		// touched last; xlb refuses it.
		{name: "a farm without a name", method: "POST", path: "/farms", body: `{"farms":[{"virtual-addr":"10.0.0.8"}]}`,
			refuse: 404, refuseText: "the object to modify is unknown", refuseWith: `"name" is required`, why: "nftlb patches the farm it touched last"},
		{name: "undo in nftlb", method: "POST", path: "/farms", body: `{"farms":[{"name":"web","virtual-addr":"10.0.0.1"}]}`, nftlbOnly: true},
		same("a backend weight below 1", "POST", "/farms", `{"farms":[{"name":"web","backends":[{"name":"b1","weight":"abc"}]}]}`),
		same("negative persist-ttl", "POST", "/farms", `{"farms":[{"name":"web","persist-ttl":"-5"}]}`),
		same("unknown path POST", "POST", "/nothing", `{}`),
		same("unknown path GET", "GET", "/nothing", ""),
		same("PATCH of farms", "PATCH", "/farms", `{"farms":[{"name":"web"}]}`),
		get("/farms/web/sessions"),
		same("sessions of a missing farm", "GET", "/farms/nope/sessions", ""),
		same("delete a client's session", "DELETE", "/farms/web/sessions/10.9.9.9", ""),
		same("flush a farm's sessions", "DELETE", "/farms/web/sessions", ""),
		same("delete a backend's sessions", "DELETE", "/farms/web/backends/b1/sessions", ""),
		same("a farm without persistence", "POST", "/farms", `{"farms":[{"name":"plain","virtual-addr":"10.0.0.2","virtual-ports":"53","protocol":"udp","mode":"dnat",
			"backends":[{"name":"d1","ip-addr":"10.1.0.11","port":"5353"},{"name":"d2","ip-addr":"10.1.0.12","port":"5353"}]}]}`),
		get("/farms/plain/sessions"),
		same("rename a farm", "POST", "/farms", `{"farms":[{"name":"plain","newname":"plain2"}]}`),
		get("/farms"),
		same("delete every backend", "DELETE", "/farms/plain2/backends", ""),
		get("/farms/plain2"),
		// Debian's nftlb 1.0.7 answers success to a DELETE with a body and
		// deletes nothing; xlb deletes what the body lists (as nftlb's
		// later sources do). nftlb is then brought to the same state.
		same("delete the listed backends", "DELETE", "/farms", `{"farms":[{"name":"web","backends":[{"name":"b2"}]}]}`),
		{name: "the same in nftlb 1.0.7", method: "DELETE", path: "/farms/web/backends/b2", nftlbOnly: true},
		get("/farms/web"),
		// Addresses (README: assign an address, delete an assigned one).
		same("a farm with an address object", "POST", "/farms", `{"farms":[{"name":"addr","mode":"snat",
			"addresses":[{"name":"addr-svc","family":"ipv4","ip-addr":"10.0.0.3","ports":"8080","protocol":"tcp"}],
			"backends":[{"name":"a1","ip-addr":"10.1.0.21","port":"80"}]}]}`),
		get("/farms/addr"), get("/addresses"),
		same("change the address", "POST", "/addresses", `{"addresses":[{"name":"addr-svc","family":"ipv4","ip-addr":"10.0.0.4","ports":"8080","protocol":"tcp"}]}`),
		get("/farms/addr"), get("/addresses/addr-svc"),
		same("delete a missing farm address", "DELETE", "/farms/addr/addresses/nope", ""),
		same("delete the farm's address", "DELETE", "/farms/addr/addresses/addr-svc", ""),
		get("/farms/addr"), get("/addresses"),
		same("the address again", "POST", "/farms", `{"farms":[{"name":"addr","addresses":[{"name":"addr-svc","family":"ipv4","ip-addr":"10.0.0.3","ports":"8080","protocol":"tcp"}]}]}`),
		same("delete an address object", "DELETE", "/addresses/addr-svc", ""),
		get("/farms/addr"), get("/addresses"),
		same("delete the farm", "DELETE", "/farms/addr", ""),
		get("/farms"),
		// nftlb's configuration document (its config file's form) on
		// POST /farms: an address and a farm that names it.
		same("a configuration document", "POST", "/farms", `{"addresses":[{"name":"docaddr","family":"ipv4","ip-addr":"10.0.8.1","ports":"8080","protocol":"tcp"}],
			"farms":[{"name":"docf","mode":"snat","addresses":[{"name":"docaddr"}],"backends":[{"name":"d1","ip-addr":"10.1.0.51","port":"80"}]}]}`),
		get("/farms/docf"), get("/addresses/docaddr"),
		same("delete the document's farm", "DELETE", "/farms/docf", ""),
		// A stlsdnat farm: nftlb prints its responsettl, which its GET
		// output carries back.
		same("a stlsdnat farm", "POST", "/farms", `{"farms":[{"name":"st","virtual-addr":"10.0.7.1","virtual-ports":"53","protocol":"udp","mode":"stlsdnat",
			"scheduler":"hash","sched-param":"srcip","responsettl":"30","backends":[{"name":"s1","ip-addr":"10.1.0.41","port":"5353"}]}]}`),
		get("/farms/st"),
		// A second address in a farm (README: assign an address).
		same("a farm of two addresses", "POST", "/farms", `{"farms":[{"name":"two","virtual-addr":"10.0.6.1","virtual-ports":"80",
			"addresses":[{"name":"two-addr","family":"ipv4","ip-addr":"10.0.6.1","ports":"80","protocol":"tcp"},{"name":"two-b","family":"ipv4","ip-addr":"10.0.6.2","ports":"443,8443","protocol":"tcp"}]}]}`),
		get("/farms/two"), get("/addresses"),
		same("a third, of another protocol", "POST", "/farms", `{"farms":[{"name":"two","addresses":[{"name":"two-c","family":"ipv4","ip-addr":"10.0.6.3","ports":"53","protocol":"udp"}]}]}`),
		get("/farms/two"), get("/addresses"),
		same("delete the second", "DELETE", "/farms/two/addresses/two-b", ""),
		get("/farms/two"), get("/addresses"),
		same("delete the farm of addresses", "DELETE", "/farms/two", ""),
		get("/addresses"),
	}
	// Deliberate differences: values nftlb accepts (replacing bad ones
	// with defaults, or taking fields xlb's data planes do not implement
	// yet) and xlb refuses, saying what is wrong.
	steps = append(steps, refused("backends with and without a port, several virtual ports",
		`{"farms":[{"name":"mix","virtual-addr":"10.0.5.9","virtual-ports":"80,443","backends":[{"name":"p","ip-addr":"10.1.0.9","port":"8080"},{"name":"q","ip-addr":"10.1.0.10"}]}]}`,
		`"backends.port"`, "kernel work: the nft data plane cannot mix them in a farm of several ports")...)
	steps = append(steps, refused("unknown scheduler", `{"farms":[{"name":"r1","virtual-addr":"10.0.5.1","scheduler":"fastest"}]}`,
		`"scheduler" value "fastest": allowed values are`, "nftlb replaces an unknown value by its default")...)
	steps = append(steps, refused("malformed address", `{"farms":[{"name":"r2","virtual-addr":"10.0.0.300","virtual-ports":"80"}]}`,
		`"virtual-addr" value "10.0.0.300"`, "nftlb keeps a malformed address and programs nothing for it")...)
	steps = append(steps, refused("malformed ports", `{"farms":[{"name":"r3","virtual-addr":"10.0.5.3","virtual-ports":"abc"}]}`,
		`"virtual-ports" value "abc"`, "nftlb keeps malformed ports")...)
	steps = append(steps, refused("unknown state", `{"farms":[{"name":"r4","virtual-addr":"10.0.5.4","state":"bogus"}]}`,
		`"state" value "bogus"`, "nftlb replaces an unknown value by its default")...)
	steps = append(steps, refused("backend source-addr in a dnat farm", `{"farms":[{"name":"r5","virtual-addr":"10.0.5.5","virtual-ports":"80","mode":"dnat",
		"backends":[{"name":"s1","ip-addr":"10.1.0.31","source-addr":"10.0.0.254"}]}]}`,
		`"source-addr" value "10.0.0.254": a backend's source-addr applies to snat VIP farms only`, "nftlb ignores it outside snat farms")...)
	for _, field := range []string{"sched-param", "persistence"} {
		steps = append(steps, refused(field+" dstmac", `{"farms":[{"name":"r6","virtual-addr":"10.0.5.6","virtual-ports":"80","scheduler":"hash","`+field+`":"dstmac"}]}`,
			`"`+field+`" value "dstmac"`, "at prerouting every client's destination MAC is the LB's own: one key for all")...)
	}
	for _, c := range []struct{ field, body string }{
		{"flow-offload", `"flow-offload":"on"`},
	} {
		steps = append(steps, refused("not implemented: "+c.field, `{"farms":[{"name":"ni","virtual-addr":"10.0.6.1","virtual-ports":"80",`+c.body+`}]}`,
			`"`+c.field+`"`, "kernel work: "+notImplemented)...)
	}
	run(t, nftlb, xlb, steps)
	// A wrong key: 401 from both; nftlb's body is empty, xlb's says why.
	for _, p := range []*peer{nftlb, xlb} {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:5555/farms", nil)
		req.Header.Set("Key", "wrong")
		resp, err := p.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if text, _ := responseText(string(b)); resp.StatusCode != 401 || p == nftlb && len(b) != 0 || p == xlb && !strings.Contains(text, "wrong API key") {
			t.Errorf("%s with a wrong key: %d %q", p.name, resp.StatusCode, b)
		}
	}
	// nftlb's exported state posts back into xlb unchanged and reads back
	// the same.
	exported := nftlb.do(t, "GET", "/farms", "")
	xlb.do(t, "DELETE", "/farms", "")
	if r := xlb.do(t, "POST", "/farms", exported.body); r.status != 200 {
		t.Fatalf("nftlb's GET /farms posted into xlb: %d %s\n%s", r.status, r.body, exported.body)
	}
	run(t, nftlb, xlb, []step{get("/farms"), get("/addresses")})
	addrs := nftlb.do(t, "GET", "/addresses", "")
	if r := xlb.do(t, "POST", "/addresses", addrs.body); r.status != 200 {
		t.Fatalf("nftlb's GET /addresses posted into xlb: %d %s\n%s", r.status, r.body, addrs.body)
	}
	run(t, nftlb, xlb, []step{get("/addresses"), same("delete everything", "DELETE", "/farms", ""), get("/farms"), get("/addresses")})
}

// run sends each step to both daemons and checks the answers.
func run(t *testing.T, nftlb, xlb *peer, steps []step) {
	t.Helper()
	quirksSeen := map[string]bool{}
	for _, s := range steps {
		if s.xlbOnly {
			if x := xlb.do(t, s.method, s.path, s.body); x.status != 200 {
				t.Errorf("%s: %s %s: xlb answered %d %s (%s)", s.name, s.method, s.path, x.status, x.body, s.why)
			}
			continue
		}
		n := nftlb.do(t, s.method, s.path, s.body)
		if s.nftlbOnly {
			continue
		}
		x := xlb.do(t, s.method, s.path, s.body)
		label := s.name + ": " + s.method + " " + s.path
		if s.refuse != 0 {
			if n.status != 200 {
				t.Errorf("%s: nftlb answered %d %s; the documented difference is that nftlb accepts it", label, n.status, n.body)
			}
			text := s.refuseText
			if text == "" {
				text = "error parsing buffer"
			}
			xt, ok := responseText(x.body)
			if x.status != s.refuse || !ok || !strings.HasPrefix(xt, text+". ") || !strings.Contains(xt, s.refuseWith) {
				t.Errorf("%s: xlb answered %d %s, want %d \"%s. ...%s...\" (%s)", label, x.status, x.body, s.refuse, text, s.refuseWith, s.why)
			}
			continue
		}
		if s.statuses != [2]int{} {
			if n.status != s.statuses[0] || x.status != s.statuses[1] {
				t.Errorf("%s: status nftlb %d, xlb %d; documented: %d, %d (%s)", label, n.status, x.status, s.statuses[0], s.statuses[1], s.why)
			}
		} else if n.status != x.status {
			t.Errorf("%s: status nftlb %d %s, xlb %d %s", label, n.status, n.body, x.status, x.body)
			continue
		}
		if nt, ok := responseText(n.body); ok {
			xt, ok := responseText(x.body)
			switch {
			case !ok:
				t.Errorf("%s: nftlb %s, xlb %s (not a {\"response\": ...})", label, n.body, x.body)
			case nftlbText(nt) != nftlbText(xt):
				t.Errorf("%s: nftlb %q, xlb %q", label, nt, xt)
			case nt == "success" && x.body != n.body:
				t.Errorf("%s: nftlb %q, xlb %q", label, n.body, x.body)
			}
			continue
		}
		if s.compare {
			diffs, seen := compareJSON(n.body, x.body)
			for _, d := range diffs {
				t.Errorf("%s: %s", label, d)
			}
			for q := range seen {
				quirksSeen[q] = true
			}
			if len(diffs) > 0 {
				t.Logf("%s:\nnftlb: %s\nxlb:   %s", label, n.body, x.body)
			}
		}
	}
	for q := range quirksSeen {
		t.Logf("documented difference seen: %s", q)
	}
}
