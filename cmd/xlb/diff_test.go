package main

import (
	"strings"
	"testing"
)

func TestDiffStates(t *testing.T) {
	a := `{"farms":[{"name":"web","mode":"snat","backends":[{"name":"b1","weight":"1"},{"name":"b2","weight":"1"}]},{"name":"only-a"}]}`
	b := `{"farms":[{"name":"web","mode":"dnat","backends":[{"name":"b1","weight":"2"},{"name":"b3","weight":"1"}]},{"name":"only-b"}]}`
	got, err := diffStates([]byte(a), []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`< farm "only-a" only here`,
		`> farm "only-b" only there`,
		`! farm "web" backend "b1": weight: "1" here, "2" there`,
		`< farm "web": backend "b2" only here`,
		`> farm "web": backend "b3" only there`,
		`! farm "web": mode: "snat" here, "dnat" there`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, _ := diffStates([]byte(a), []byte(a)); len(got) != 0 {
		t.Fatalf("equal states differ: %v", got)
	}
	if _, err := diffStates([]byte(a), []byte("{")); err == nil || !strings.Contains(err.Error(), "other node's state") {
		t.Fatalf("bad document: %v", err)
	}
}

// TestDiffTablesAndChecks: tables (definition and entries, by key) and
// checks (field by field, a farm's and a backend's) are compared too.
func TestDiffTablesAndChecks(t *testing.T) {
	a := `{"farms":[{"name":"web","check":{"type":"tcp","inter":"1s"},"backends":[{"name":"b1","check":{"type":"none"}}]}],
		"tables":[{"name":"deny","type":"addr","verdict":"deny","entries":[{"key":"10.0.0.0/8"},{"key":"192.0.2.1","value":{"mark":"1"}},{"key":"192.0.2.9","expires":"2026-11-27T13:00:00Z"}]},
		{"name":"only-a","type":"number"}]}`
	b := `{"farms":[{"name":"web","check":{"type":"tcp","inter":"2s"},"backends":[{"name":"b1"}]}],
		"tables":[{"name":"deny","type":"addr","verdict":"allow","entries":[{"key":"192.0.2.1","value":{"mark":"2"}},{"key":"198.51.100.0/24"},{"key":"192.0.2.9","expires":"2026-11-27T13:00:05Z"}]}]}`
	got, err := diffStates([]byte(a), []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`! farm "web" backend "b1": check: {"type":"none"} here, (absent) there`,
		`! farm "web" check: inter: "1s" here, "2s" there`,
		`< table "deny": entry "10.0.0.0/8" only here`,
		`! table "deny" entry "192.0.2.1": value: {"mark":"1"} here, {"mark":"2"} there`,
		`> table "deny": entry "198.51.100.0/24" only there`,
		`! table "deny": verdict: "deny" here, "allow" there`,
		`< table "only-a" only here`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
