package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// undoStore is a store that saves tables with farms and can take back the
// last change.
type undoStore interface {
	store.Store
	store.Undoer
	store.TableStore
}

// savedTables lists what the store holds of tables, as text: one line per
// table (name, id, slot, definition) and per entry (key, value, expiry).
func savedTables(t *testing.T, st undoStore) string {
	t.Helper()
	tables, err := st.LoadTables(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, tb := range tables {
		lines = append(lines, fmt.Sprintf("%s id %d slot %d %s limit %d verdict %s", tb.Name, tb.ID, tb.Slot, tb.KindString(), tb.Limit, tb.Verdict))
		tb.Entries("", func(e model.TableEntry) bool {
			lines = append(lines, fmt.Sprintf("  %s %s %s %d", tb.Name, tb.FormatKey(e.Key), tb.FormatValue(e.Value), e.Expires))
			return true
		})
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestTableChangeUndoLast: the last saved change of tables is taken back
// exactly by UndoLast after a restart (the store reopened, as after a
// crash), as a farm change is: entries added go, entries changed or
// deleted come back, a created table goes, a destroyed one comes back
// with its entries. On the journal a small change is one record, a large
// one (past 4,096 entries) goes to the bbolt file with its undo; both are
// covered. Before, UndoLast took back farms only.
func TestTableChangeUndoLast(t *testing.T) {
	opens := map[string]func(dir string) (undoStore, error){
		"bolt":    func(dir string) (undoStore, error) { return store.OpenBolt(dir) },
		"journal": func(dir string) (undoStore, error) { return store.OpenJournal(dir) },
	}
	for name, open := range opens {
		for _, n := range []int{10, 5000} {
			t.Run(fmt.Sprintf("%s/n=%d", name, n), func(t *testing.T) { testTableUndo(t, open, n) })
		}
	}
}

func testTableUndo(t *testing.T, open func(string) (undoStore, error), n int) {
	dir := t.TempDir()
	st, err := open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(context.Background(), quiet, fake.New(), st)
	if err != nil {
		t.Fatal(err)
	}
	lines := func(first, count int, value string) []string {
		var out []string
		for i := first; i < first+count; i++ {
			out = append(out, fmt.Sprintf("10.%d.%d.0/24 %s", i/250, i%250, value))
		}
		return out
	}
	createTable(t, e, "a", "addr", "mark", nil)
	if _, err := addEntries(e, "a", EntryOptions{Atomic: true}, lines(0, n, "1")...); err != nil {
		t.Fatal(err)
	}
	createTable(t, e, "c", "addr", "", func(tb *model.Table) { tb.Verdict = model.ListDeny })
	if _, err := addEntries(e, "c", EntryOptions{Atomic: true}, "192.0.2.0/24", "198.51.100.7"); err != nil {
		t.Fatal(err)
	}
	before := savedTables(t, st)

	// One change: n entries added to a, one value changed, one entry
	// deleted, b created with entries, c destroyed, a's limit modified.
	err = change(e, func(tx *Txn) error {
		if _, err := tx.AddEntries("a", inputs(lines(n, n, "2")...), EntryOptions{Atomic: true}); err != nil {
			return err
		}
		if _, err := tx.AddEntries("a", inputs("10.0.0.0/24 9"), EntryOptions{Atomic: true, Update: true}); err != nil {
			return err
		}
		if _, err := tx.DeleteEntries("a", []string{"10.0.1.0/24"}, EntryOptions{Atomic: true}); err != nil {
			return err
		}
		a, _ := tx.Table("a")
		na := a.Clone()
		na.Limit = 100000
		if err := tx.PutTable(na); err != nil {
			return err
		}
		b := model.NewTable("b", model.TableNumber)
		if err := tx.PutTable(b); err != nil {
			return err
		}
		if _, err := tx.AddEntries("b", inputs("443", "80"), EntryOptions{Atomic: true}); err != nil {
			return err
		}
		return tx.DestroyTable("c")
	})
	if err != nil {
		t.Fatal(err)
	}
	after := savedTables(t, st)
	if after == before {
		t.Fatal("the change saved nothing")
	}
	st.Close()

	st, err = open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := savedTables(t, st); got != after {
		t.Fatalf("after reopen the saved tables differ from the acknowledged change")
	}
	names, err := st.UndoLast(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if want := "table a,table b,table c"; strings.Join(names, ",") != want {
		t.Errorf("UndoLast took back %v, want %s", names, want)
	}
	if got := savedTables(t, st); got != before {
		t.Errorf("after UndoLast the saved tables are not as before the change:\n%s\nwant\n%s", diffLines(got, before), "")
	}
	if names, err := st.UndoLast(context.Background()); err != nil || len(names) != 0 {
		t.Errorf("second UndoLast: %v %v, want nothing", names, err)
	}
}

// diffLines names the lines only one of two listings has.
func diffLines(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for l := range ma {
		if !mb[l] {
			out = append(out, "+ "+l)
		}
	}
	for l := range mb {
		if !ma[l] {
			out = append(out, "- "+l)
		}
	}
	slices.Sort(out)
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("... %d more", len(out)-20))
	}
	return strings.Join(out, "\n")
}
