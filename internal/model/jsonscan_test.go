package model

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

var scanSamples = []string{
	`{}`, `[]`, ` { } `, `[ ]`,
	`{"name":"web","port":"80","weight":3,"on":true,"x":null}`,
	`{ "a" : "b" , "c" : [1, {"d": "]}"}], "e": {"f": [ "\"}" ]} }`,
	`{"k\u00e9y":"v\\\"","\n":"\t","dup":1,"dup":2}`,
	`{"é":"ü","emoji":"😀","bad":"` + "\xff\xfe" + `","bad` + "\xc3" + `":1}`,
	`{"\u006eame":"x","name":"y","\/":"\b\f\n\r\t\u00FFz"}`,
	`[{"name":"b1"}, {"name":"b2","ip-addr":"10.0.0.1"} ,{}]`,
	`[1, "two", [3], {"4": 4}, null, true, false, -5.5e3, 0, -0, 0.5, 1E+2, 1e-2, 123456789012345678901234567890]`,
	"\t[\n{\"a\":\"b\"}\r\n]\n",
	`"str"`, `12`, `null`, `true`, `false`, `-1`,
	// Not JSON.
	``, ` `, `{`, `{"a"}`, `{"a":}`, `{"a":1 "b":2}`, `{"a":1,}`, `{"a":1}x`, `[1 2]`, `[1,]`, `[`, `["unterminated]`,
	`01`, `-`, `1.`, `.5`, `+1`, `1e`, `1e+`, `-a`, `tru`, `truex`, `nul`, `[nulls]`, `"\x"`, `"\u12"`, `"\u12g4"`,
	"\"a\x01\"", `{1:2}`, `{"a" 1}`, `[1}`, `{"a":1]`, `"\`, `"\u`, "[1]\x00", `{"a":"b",}`, `[,1]`, `{,}`,
	strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth),
	strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1),
	strings.Repeat(`{"a":`, maxDepth) + "1" + strings.Repeat("}", maxDepth),
	strings.Repeat(`{"a":`, maxDepth+1) + "1" + strings.Repeat("}", maxDepth+1),
}

// The scanner accepts exactly what json.Valid accepts, and on valid JSON
// its tape agrees with encoding/json.
func TestScannerAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range scanSamples {
		checkScanner(t, []byte(s))
	}
}

func FuzzScanner(f *testing.F) {
	for _, s := range scanSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkScanner(t, b)
	})
}

func checkScanner(t *testing.T, b []byte) {
	t.Helper()
	d, ok := scanDoc(b)
	defer d.release()
	if want := json.Valid(b); ok != want {
		t.Fatalf("scanDoc(%.80q) ok=%v, json.Valid says %v", b, ok, want)
	}
	if !ok {
		return
	}
	if got, want := d.raw(0), string(bytes.TrimSpace(b)); got != want {
		t.Fatalf("scanDoc(%.80q): the value is %.80q, want %.80q", b, got, want)
	}
	if d.toks[0].next != len(d.toks) {
		t.Fatalf("scanDoc(%.80q): the value ends at tape index %d of %d", b, d.toks[0].next, len(d.toks))
	}
	switch d.toks[0].kind {
	case '{':
		checkMembers(t, &d, b)
	case '[':
		checkElements(t, &d, b)
	case '"':
		// A string without escapes is its bytes as sent; with escapes,
		// what encoding/json makes of it.
		want := d.raw(0)
		want = want[1 : len(want)-1]
		if d.toks[0].esc {
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatalf("%q: %v", b, err)
			}
		}
		if got, ok := d.scalar(0); !ok || got != want {
			t.Fatalf("scalar(%q) = %q, %v; want %q", b, got, ok, want)
		}
	}
}

// checkMembers compares the root object's members with json.Unmarshal's
// map: same keys, each with its last value.
func checkMembers(t *testing.T, d *doc, b []byte) {
	t.Helper()
	var want map[string]json.RawMessage
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	keys := map[string]bool{}
	for k, end := d.children(0); k < end; k = d.toks[k+1].next {
		if d.toks[k].kind != '"' {
			t.Fatalf("%q: key at tape index %d is %q", b, k, d.raw(k))
		}
		keys[d.key(k)] = true
	}
	if len(keys) != len(want) {
		t.Fatalf("%q: %d distinct keys, encoding/json has %d", b, len(keys), len(want))
	}
	for k, v := range want {
		got := d.lastMember(0, k)
		if got < 0 || d.raw(got) != string(bytes.TrimSpace(v)) {
			t.Fatalf("%q: member %q = %q, want %q", b, k, d.raw(got), v)
		}
	}
}

func checkElements(t *testing.T, d *doc, b []byte) {
	t.Helper()
	var want []json.RawMessage
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	if n := d.count(0); n != len(want) {
		t.Fatalf("%q: %d elements, encoding/json has %d", b, n, len(want))
	}
	i := 0
	for e, end := d.children(0); e < end; e = d.toks[e].next {
		if d.raw(e) != string(bytes.TrimSpace(want[i])) {
			t.Fatalf("%q: element %d = %q, want %q", b, i, d.raw(e), want[i])
		}
		i++
	}
}

// Object keys decode as encoding/json decodes map keys.
func TestScannerKeys(t *testing.T) {
	d, ok := scanDoc([]byte(`{"\u006eame":1,"bad` + "\xff" + `":2,"plain":3}`))
	defer d.release()
	if !ok {
		t.Fatal("not scanned")
	}
	var got []string
	for k, end := d.children(0); k < end; k = d.toks[k+1].next {
		got = append(got, d.key(k))
	}
	if want := []string{"name", "bad\ufffd", "plain"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("keys %q, want %q", got, want)
	}
}

// Every object kind fits decodeMembers' per-field slots.
func TestFieldsFitDecodeMembers(t *testing.T) {
	if len(farmFields) > maxFields || len(backendFields) > maxFields {
		t.Errorf("%d farm fields, %d backend fields: raise maxFields (%d)", len(farmFields), len(backendFields), maxFields)
	}
}
