package model

import (
	"strings"
	"testing"
)

// A text value is accepted only as the kernel and the store will see it:
// valid UTF-8 without control characters, its length counted in bytes.
// 24 bytes of invalid UTF-8 were accepted and saved as 72 bytes (each bad
// byte became U+FFFD), and the next start refused the daemon's own state.
func TestLogPrefixText(t *testing.T) {
	const farm = `{"name":"web","virtual-addr":"10.0.0.1","log":"input","log-prefix":%s}`
	for _, c := range []struct {
		value string // JSON text of the value
		ok    bool
		want  string
	}{
		{`"` + strings.Repeat("\xff", 24) + `"`, false, "valid UTF-8"},
		{"\"abc\xc3\"", false, "valid UTF-8"},
		{`"\ud800"`, true, ""}, // a lone surrogate escape decodes to U+FFFD, valid UTF-8 (3 bytes)
		{`"a\u0000b"`, false, "control characters"},
		{`"a\nb"`, false, "control characters"},
		{"\"a\u0085b\"", false, "control characters"},
		{`"` + strings.Repeat("é", 26) + `"`, true, ""}, // 52 bytes
		{`"` + strings.Repeat("é", 27) + `"`, false, "at most 52 bytes"},
		{`"` + strings.Repeat("x", 53) + `"`, false, "at most 52 bytes"},
		{`"web: "`, true, ""},
		{`24`, false, "must be a JSON string"},
	} {
		fs, err := DecodeFarms([]byte(strings.Replace(farm, "%s", c.value, 1)), noFarm)
		if c.ok {
			if err != nil {
				t.Errorf("log-prefix %s refused: %v", c.value, err)
				continue
			}
			// What is accepted survives the store's encoding unchanged.
			enc := fs[0].AppendJSON(nil)
			g, err := DecodeFarms(enc, noFarm)
			if err != nil || g[0].LogPrefix != fs[0].LogPrefix {
				t.Errorf("log-prefix %s: re-decode of %s: %v", c.value, enc, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), `"log-prefix"`) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("log-prefix %s: error %v, want one naming the field and %q", c.value, err, c.want)
		}
	}
}

// Addresses that name no one host, addresses with white space around
// them, repeated keys and repeated backends are refused with the field
// named; before, they were accepted (or silently merged, the last value
// winning).
func TestBadValuesRefused(t *testing.T) {
	const farm = `{"name":"web",%s}`
	const be = `{"name":"web","virtual-addr":"10.0.0.1","backends":[%s]}`
	for _, c := range []struct {
		tmpl, body string
		want       []string
	}{
		{farm, `"virtual-addr":"0.0.0.0"`, []string{`"virtual-addr"`, `"0.0.0.0"`, "unspecified"}},
		{farm, `"virtual-addr":"255.255.255.255"`, []string{`"virtual-addr"`, "broadcast"}},
		{farm, `"virtual-addr":"224.0.0.5"`, []string{`"virtual-addr"`, "unicast"}},
		{farm, `"family":"ipv6","virtual-addr":"ff02::1"`, []string{`"virtual-addr"`, "unicast"}},
		{farm, `"family":"ipv6","virtual-addr":"::"`, []string{`"virtual-addr"`, "unspecified"}},
		{farm, `"family":"dual","virtual-addr":"10.0.0.1,ff05::2"`, []string{`"virtual-addr"`, "unicast"}},
		{farm, `"virtual-addr":" 10.0.0.1"`, []string{`"virtual-addr"`, `" 10.0.0.1"`}},
		{farm, `"virtual-addr":"10.0.0.1 "`, []string{`"virtual-addr"`}},
		{farm, `"family":"dual","virtual-addr":"10.0.0.1, fd00::1"`, []string{`"virtual-addr"`}},
		{farm, `"virtual-addr":"10.0.0.1","source-addr":"0.0.0.0"`, []string{`"source-addr"`, "unspecified"}},
		{farm, `"virtual-addr":"10.0.0.1","mode":"snat","mode":"dnat"`, []string{`"mode"`, "twice"}},
		{farm, `"virtual-addr":"10.0.0.1","name":"web"`, []string{`"name"`, "twice"}},
		{farm, `"virtual-addr":"10.0.0.1","backends":[],"backends":[]`, []string{`"backends"`, "twice"}},
		{farm, `"virtual-addr":"10.0.0.1","policies":[{"name":"a","name":"b"}]`, []string{`"policies.name"`, "twice"}},
		{be, `{"name":"b1","ip-addr":"0.0.0.0"}`, []string{`backend "b1"`, `"ip-addr"`, "unspecified"}},
		{be, `{"name":"b1","ip-addr":"255.255.255.255"}`, []string{`"ip-addr"`, "broadcast"}},
		{be, `{"name":"b1","ip-addr":"239.1.1.1"}`, []string{`"ip-addr"`, "unicast"}},
		{be, `{"name":"b1","ip-addr":" 10.1.0.1"}`, []string{`"ip-addr"`, `" 10.1.0.1"`}},
		{be, `{"name":"b1","ip-addr":"10.1.0.1","weight":"1","weight":"5"}`, []string{`backend "b1"`, `"weight"`, "twice"}},
		{be, `{"name":"b1","ip-addr":"10.1.0.1"},{"name":"b1","ip-addr":"10.1.0.2"}`, []string{`"backends[1].name"`, `"b1"`, "same request"}},
		{be, `{"name":1,"ip-addr":"10.1.0.1"}`, []string{`"backends[0].name"`}},
		{`{"name":7,"virtual-addr":"10.0.0.1"%s}`, ``, []string{`"name"`}},
		{`{"farms":[{"name":"a","virtual-addr":"10.0.0.1"}],"farms":[]%s}`, ``, []string{`"farms"`, "twice"}},
	} {
		body := strings.Replace(c.tmpl, "%s", c.body, 1)
		_, err := DecodeFarms([]byte(body), noFarm)
		if err == nil {
			t.Errorf("%s accepted", body)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", body, err, w)
			}
		}
	}
	if err := CheckUniqueKeys([]byte(`{"a":{"b":1,"c":2,"b":3}}`)); err == nil || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("CheckUniqueKeys: %v", err)
	}
	if err := CheckUniqueKeys([]byte(`{"a":{"b":1},"b":{"b":1}}`)); err != nil {
		t.Errorf("CheckUniqueKeys refused keys of different objects: %v", err)
	}
}

// An error quotes a bad value cut to a sane length: a 10 MB value was
// echoed back whole.
func TestErrorsClipValues(t *testing.T) {
	big := strings.Repeat("é", 5<<20) // 10 MiB
	for _, body := range []string{
		`{"name":"web","virtual-addr":"` + big + `"}`,
		`{"name":"web","virtual-addr":"10.0.0.1","log-prefix":"` + big + `"}`,
		`{"name":"web","virtual-addr":"10.0.0.1","` + big + `":"1"}`,
	} {
		_, err := DecodeFarms([]byte(body), noFarm)
		if err == nil {
			t.Fatal("accepted")
		}
		if len(err.Error()) > 1024 || !strings.Contains(err.Error(), "10485760 bytes") {
			t.Errorf("error of %d bytes: %.200s", len(err.Error()), err)
		}
	}
}

// The JSON types each field takes: numbers where the value is a number,
// booleans for tcp-strict, strings only for text.
func TestFieldJSONTypes(t *testing.T) {
	f := decodeOne(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":80,"persist-ttl":30,"tcp-strict":true,
		"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":8080,"weight":2}]}`)
	if f.PersistTTL != 30 || !f.TCPStrict || f.Backends[0].Port != 8080 {
		t.Errorf("decoded %+v", f)
	}
	for _, body := range []string{
		`{"name":"web","virtual-addr":"10.0.0.1","mode":1}`,
		`{"name":"web","virtual-addr":"10.0.0.1","port":null}`,
		`{"name":"web","virtual-addr":"10.0.0.1","persist-ttl":true}`,
		`{"name":"web","virtual-addr":"10.0.0.1","log-prefix":false}`,
		`{"name":"web","virtual-addr":"10.0.0.1","backends":[{"name":"b","ip-addr":"10.1.0.1","port":null}]}`,
	} {
		if _, err := DecodeFarms([]byte(body), noFarm); err == nil {
			t.Errorf("%s accepted", body)
		}
	}
	if got := FieldTypes("backend")["port"]; strings.Join(got, ",") != "string,integer" {
		t.Errorf("FieldTypes(backend)[port] = %v", got)
	}
}

// Text fields filled with arbitrary bytes: whatever is accepted encodes
// (as the store saves it) and decodes to the same farm, and passes
// validation again, so a saved farm is never refused at the next start.
func FuzzTextFields(f *testing.F) {
	f.Add(strings.Repeat("\xff", 24), "web")
	f.Add("\xc3\x28", "b")
	f.Add("é", "x")
	f.Add("\\ud800\\udc00", "y")
	f.Add("\\u0000", "z")
	f.Fuzz(func(t *testing.T, text, name string) {
		for _, body := range []string{
			`{"name":"web","virtual-addr":"10.0.0.1","log-prefix":"` + text + `"}`,
			`{"name":"web","virtual-addr":"10.0.0.1","mode":"dsr","iface":"` + text + `"}`,
			`{"name":"` + name + `","virtual-addr":"10.0.0.1","backends":[{"name":"` + text + `","ip-addr":"10.1.0.1"}]}`,
			`{"name":"web","virtual-addr":"10.0.0.1","policies":[{"name":"` + text + `"}]}`,
		} {
			fs, err := DecodeFarms([]byte(body), noFarm)
			if err != nil {
				continue
			}
			enc := fs[0].AppendJSON(nil)
			g, err := DecodeFarms(enc, noFarm)
			if err != nil {
				t.Fatalf("accepted %q, but its saved form %q is refused: %v", body, enc, err)
			}
			if string(g[0].AppendJSON(nil)) != string(enc) {
				t.Fatalf("%q: round trip differs", body)
			}
		}
	})
}
