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
