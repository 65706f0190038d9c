package model

import (
	"bytes"
	"encoding/json"
	"testing"
)

var scanSamples = []string{
	`{}`, `[]`, ` { } `, `[ ]`,
	`{"name":"web","port":"80","weight":3,"on":true,"x":null}`,
	`{ "a" : "b" , "c" : [1, {"d": "]}"}], "e": {"f": [ "\"}" ]} }`,
	`{"k\u00e9y":"v\\\"","\n":"\t","dup":1,"dup":2}`,
	`{"é":"ü","emoji":"😀"}`,
	`[{"name":"b1"}, {"name":"b2","ip-addr":"10.0.0.1"} ,{}]`,
	`[1, "two", [3], {"4": 4}, null, true, -5.5e3]`,
	"\t[\n{\"a\":\"b\"}\r\n]\n",
	`"str"`, `12`, `null`, `true`,
}

// On valid JSON the scanners agree with encoding/json.
func TestScannersAgreeWithEncodingJSON(t *testing.T) {
	for _, s := range scanSamples {
		checkScanners(t, []byte(s))
	}
}

func FuzzScanners(f *testing.F) {
	for _, s := range scanSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if json.Valid(b) {
			checkScanners(t, b)
		}
	})
}

func checkScanners(t *testing.T, b []byte) {
	t.Helper()
	var wantObj map[string]json.RawMessage
	objErr := json.Unmarshal(b, &wantObj)
	gotObj, ok := objectMembers(b)
	isObj := objErr == nil && bytes.TrimSpace(b)[0] == '{'
	if ok != isObj {
		t.Fatalf("objectMembers(%q) ok=%v, encoding/json says object=%v", b, ok, isObj)
	}
	if ok {
		if len(gotObj) != len(wantObj) {
			t.Fatalf("objectMembers(%q) = %d members, want %d", b, len(gotObj), len(wantObj))
		}
		for k, v := range wantObj {
			if !bytes.Equal(bytes.TrimSpace(gotObj[k]), bytes.TrimSpace(v)) {
				t.Fatalf("objectMembers(%q)[%q] = %q, want %q", b, k, gotObj[k], v)
			}
		}
	}
	var wantArr []json.RawMessage
	arrErr := json.Unmarshal(b, &wantArr)
	gotArr, ok := splitArray(b)
	isArr := arrErr == nil && bytes.TrimSpace(b)[0] == '['
	if ok != isArr {
		t.Fatalf("splitArray(%q) ok=%v, encoding/json says array=%v", b, ok, isArr)
	}
	if ok {
		if len(gotArr) != len(wantArr) {
			t.Fatalf("splitArray(%q) = %d elements, want %d", b, len(gotArr), len(wantArr))
		}
		for i := range wantArr {
			if !bytes.Equal(bytes.TrimSpace(gotArr[i]), bytes.TrimSpace(wantArr[i])) {
				t.Fatalf("splitArray(%q)[%d] = %q, want %q", b, i, gotArr[i], wantArr[i])
			}
		}
	}
}

// Shapes that are not an array or an object of members are refused.
func TestScannersRefuse(t *testing.T) {
	for _, s := range []string{``, `{`, `{"a"}`, `{"a":}`, `{"a":1 "b":2}`, `{"a":1,}`, `{"a":1}x`, `[1 2]`, `[1,]`, `[`, `["unterminated]`} {
		if _, ok := objectMembers([]byte(s)); ok {
			t.Errorf("objectMembers(%q) accepted it", s)
		}
		if _, ok := splitArray([]byte(s)); ok {
			t.Errorf("splitArray(%q) accepted it", s)
		}
	}
}
