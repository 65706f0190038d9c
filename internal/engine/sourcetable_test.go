package engine

import (
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
)

// TestSourceTableSharing checks the rule for farms chosen by source table:
// several farms on one VIP, protocol and ports, each with its own addr
// table and at most one without; every other combination is refused with
// an error naming what to change, and changes nothing.
func TestSourceTableSharing(t *testing.T) {
	e, _, _, _ := newTableEngine(t)
	createTable(t, e, "inside", "addr", "", nil)
	createTable(t, e, "office", "addr", "", nil)
	createTable(t, e, "ports", "number", "", nil)
	with := func(name, ports, table string) model.Farm {
		f := webFarm(t, name, "10.0.0.1", ports)
		f.SourceTable = table
		return f
	}
	if err := put(e, with("dflt", "80", ""), with("in", "80", "inside"), with("off", "80", "office")); err != nil {
		t.Fatalf("three farms on one key, two with source tables: %v", err)
	}
	if got := e.Snapshot().TableUsers("inside"); len(got) != 1 || got[0] != "in" {
		t.Errorf("users of inside: %v", got)
	}
	version := e.Snapshot().Version()
	bad := []struct {
		what string
		fn   func(tx *Txn) error
		want string
	}{
		{"second default", func(tx *Txn) error { return tx.Put(with("dflt2", "80", "")) },
			`farm "dflt2": 10.0.0.1 tcp port 80 is already served by farm "dflt" (farms may share it only when all but one choose their clients by source-table)`},
		{"same table twice", func(tx *Txn) error { return tx.Put(with("in2", "80", "inside")) },
			`with the same source-table "inside"`},
		{"ports differ", func(tx *Txn) error { return tx.Put(with("wide", "80-81", "office2")) }, // checked before the table
			`must have the same protocol and virtual-ports`},
		{"unknown table", func(tx *Txn) error { return tx.Put(with("x", "80", "nope")) },
			`farm "x": field "source-table" value "nope": no such table`},
		{"not addr", func(tx *Txn) error { return tx.Put(with("x", "80", "ports")) },
			`table "ports" is of type number: a source table must be of type addr`},
		{"policies on the default", func(tx *Txn) error {
			f := with("dflt", "80", "")
			f.Policies = []model.PolicyRef{{Name: "inside"}}
			return tx.Put(f)
		}, `cannot have policies`},
		{"destroy a used table", func(tx *Txn) error { return tx.DestroyTable("office") },
			`table "office" is used by farm "off" as its source table`},
		{"mark farm", func(tx *Txn) error {
			f := farm(t, `{"name":"m","mark":"0x10","backends":[{"name":"b1","ip-addr":"10.1.0.1"}]}`)
			f.SourceTable = "inside"
			return tx.Put(f)
		}, `field "source-table" value "inside": only a farm with a virtual-addr`},
	}
	for _, c := range bad {
		err := change(e, c.fn)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.what, err, c.want)
		}
	}
	if v := e.Snapshot().Version(); v != version {
		t.Errorf("refused changes moved the state from version %d to %d", version, v)
	}
	if _, ok := e.Snapshot().Table("office"); !ok {
		t.Error("refused destroy removed the table")
	}
	// Another port is another key: a second default there is fine, and a
	// table used by no farm any more can go.
	if err := put(e, with("dflt443", "443", "")); err != nil {
		t.Fatal(err)
	}
	if err := change(e, func(tx *Txn) error {
		if err := tx.Delete("off"); err != nil {
			return err
		}
		return tx.DestroyTable("office")
	}); err != nil {
		t.Fatal(err)
	}
}

// TestSourceTableJSON checks the field's encoding: left out when unset (a
// farm's nftlb JSON does not change), kept when set.
func TestSourceTableJSON(t *testing.T) {
	f := webFarm(t, "web", "10.0.0.1", "80")
	if s := string(f.AppendJSON(nil)); strings.Contains(s, "source-table") {
		t.Errorf("unset source-table printed: %s", s)
	}
	g := farm(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","source-table":"inside","backends":[{"name":"b1","ip-addr":"10.1.0.1"}]}`)
	if g.SourceTable != "inside" || !strings.Contains(string(g.AppendJSON(nil)), `"source-table":"inside"`) {
		t.Errorf("source-table not kept: %q %s", g.SourceTable, g.AppendJSON(nil))
	}
}

// TestConnOwnersFollowsState: the connection owners are built once per
// state and built again when the state changes: a key that becomes shared
// (a farm chosen by source table added) tells its farms' connections
// apart at once, and an unchanged state gets the same owners back.
func TestConnOwnersFollowsState(t *testing.T) {
	e, _, _, _ := newTableEngine(t)
	createTable(t, e, "inside", "addr", "", nil)
	if err := put(e, webFarm(t, "dflt", "10.0.0.1", "80")); err != nil {
		t.Fatal(err)
	}
	o := e.connOwners(e.Snapshot())
	if o.Shared() {
		t.Fatal("one farm: owners say a key is shared")
	}
	if again := e.connOwners(e.Snapshot()); again != o {
		t.Error("same state: owners built again")
	}
	in := webFarm(t, "in", "10.0.0.1", "80")
	in.SourceTable = "inside"
	if err := put(e, in); err != nil {
		t.Fatal(err)
	}
	if !e.connOwners(e.Snapshot()).Shared() {
		t.Error("a farm chosen by source table added: owners of the old state kept")
	}
}
