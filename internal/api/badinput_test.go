package api_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// errorText returns every string of a JSON error answer joined, so the
// tests read the message whatever the envelope ({"error":...} or nftlb's
// {"response":"error","message":...}).
func errorText(t *testing.T, body string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("answer %.200q is not a JSON object: %v", body, err)
	}
	var parts []string
	for _, v := range m {
		if s, ok := v.(string); ok {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, " | ")
}

// Each bad value gets a 400 that names it, and changes nothing: before,
// these were accepted (0.0.0.0, broadcast and multicast addresses,
// addresses with spaces around them), silently merged (a backend named
// twice, a key given twice: the last won) or ignored (?stats=AAA).
func TestBadValuesAnswer400(t *testing.T) {
	e := newEnv(t)
	e.must("POST", "/farms", nftlbWeb)
	huge := strings.Repeat("A", 10<<20)
	for _, c := range []struct {
		method, path, body string
		want               []string
	}{
		{"POST", "/farms", `{"farms":[{"name":"v0","virtual-addr":"0.0.0.0","virtual-ports":"80"}]}`, []string{`"virtual-addr"`, `"0.0.0.0"`}},
		{"POST", "/farms", `{"farms":[{"name":"v1","virtual-addr":"255.255.255.255"}]}`, []string{`"virtual-addr"`, "broadcast"}},
		{"POST", "/farms", `{"farms":[{"name":"v2","virtual-addr":"224.0.0.1"}]}`, []string{`"virtual-addr"`, "unicast"}},
		{"POST", "/farms", `{"farms":[{"name":"v3","family":"ipv6","virtual-addr":"ff02::1"}]}`, []string{`"virtual-addr"`, "unicast"}},
		{"POST", "/farms", `{"farms":[{"name":"v4","virtual-addr":" 10.0.0.4"}]}`, []string{`"virtual-addr"`, `" 10.0.0.4"`}},
		{"PUT", "/farms/web/backends", `{"backends":[{"name":"b9","ip-addr":"0.0.0.0"}]}`, []string{`"ip-addr"`, "unspecified"}},
		{"PUT", "/farms/web/backends", `{"backends":[{"name":"b9","ip-addr":"255.255.255.255"}]}`, []string{`"ip-addr"`, "broadcast"}},
		{"PUT", "/farms/web/backends", `{"backends":[{"name":"b9","ip-addr":"10.200.0.19 "}]}`, []string{`"ip-addr"`}},
		{"PUT", "/farms/web/backends", `{"backends":[{"name":"b1","weight":"3"},{"name":"b1","weight":"4"}]}`, []string{`"b1"`, "same request"}},
		{"POST", "/farms", `{"farms":[{"name":"web","backends":[{"name":"b3","ip-addr":"10.200.0.13"},{"name":"b3","ip-addr":"10.200.0.14"}]}]}`, []string{`"b3"`, "same request"}},
		{"POST", "/farms", `{"farms":[{"name":"web","scheduler":"rr","scheduler":"hash"}]}`, []string{`"scheduler"`, "twice"}},
		{"PUT", "/farms/web", `{"scheduler":"rr","scheduler":"hash"}`, []string{`"scheduler"`, "twice"}},
		{"PUT", "/farms/web/backends", `{"name":"b1","weight":"3","weight":"4"}`, []string{`"weight"`, "twice"}},
		{"PUT", "/farms/web/backends", `{"backends":[{"name":"b1","weight":"3","weight":"4"}]}`, []string{`"weight"`, "twice"}},
		{"PUT", "/state", `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-addr":"10.0.0.2"}]}`, []string{`"virtual-addr"`, "twice"}},
		{"GET", "/farms?stats=AAA", ``, []string{`"stats"`, `"AAA"`}},
		{"GET", "/farms?format=ipvsadm&numeric=maybe", ``, []string{`"numeric"`, `"maybe"`}},
		{"POST", "/farms", `{"farms":[{"name":"web","log-prefix":"` + strings.Repeat("\xff", 24) + `"}]}`, []string{`"log-prefix"`, "UTF-8"}},
		{"POST", "/farms", `{"farms":[{"name":"web","mode":"` + huge + `"}]}`, []string{`"mode"`, "10485760 bytes"}},
		{"GET", "/farms?format=" + huge[:1<<19], ``, []string{`"format"`}},
	} {
		before, plane, saved := e.must("GET", "/farms", ""), e.planeDump(), e.storeDump()
		r := e.do(c.method, c.path, c.body)
		name := c.method + " " + c.path[:min(len(c.path), 40)] + " " + c.body[:min(len(c.body), 120)]
		if r.status != 400 {
			t.Errorf("%s: status %d, want 400: %.300s", name, r.status, r.body)
			continue
		}
		if len(r.body) > 4096 {
			t.Errorf("%s: an error answer of %d bytes", name, len(r.body))
		}
		msg := errorText(t, r.body)
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: error %q does not mention %s", name, msg, w)
			}
		}
		if e.must("GET", "/farms", "") != before || e.planeDump() != plane || e.storeDump() != saved {
			t.Errorf("%s: a refused request changed the state", name)
		}
	}
}
