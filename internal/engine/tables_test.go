package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// tableStore is a bbolt store whose table writes can be made to fail.
type tableStore struct {
	*store.Bolt
	failTables bool
}

func (s *tableStore) CommitTables(ctx context.Context, d plan.TableDiff) error {
	if s.failTables {
		return errors.New("injected disk failure")
	}
	return s.Bolt.CommitTables(ctx, d)
}

func (s *tableStore) CommitChange(ctx context.Context, d plan.Diff, td plan.TableDiff) error {
	if s.failTables {
		return errors.New("injected disk failure")
	}
	return s.Bolt.CommitChange(ctx, d, td)
}

func newTableEngine(t *testing.T) (*Engine, *fake.Plane, *tableStore, string) {
	t.Helper()
	dir := t.TempDir()
	b, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := &tableStore{Bolt: b}
	t.Cleanup(func() { st.Close() })
	dp := fake.New()
	e, err := New(context.Background(), quiet, dp, st)
	if err != nil {
		t.Fatal(err)
	}
	return e, dp, st, dir
}

func change(e *Engine, fn func(tx *Txn) error) error {
	_, err := e.Change(context.Background(), fn)
	return err
}

func createTable(t *testing.T, e *Engine, name, typ, valtype string, mod func(*model.Table)) {
	t.Helper()
	tt, ff, err := model.ParseTableType(typ)
	if err != nil {
		t.Fatal(err)
	}
	tb := model.NewTable(name, tt)
	tb.Flow = ff
	if tb.Values, err = model.ParseValueFields(valtype); err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(&tb)
	}
	if err := change(e, func(tx *Txn) error { return tx.PutTable(tb) }); err != nil {
		t.Fatal(err)
	}
}

func inputs(lines ...string) []model.EntryInput {
	var out []model.EntryInput
	for _, l := range lines {
		in, ok, err := model.ParseEntryLine(l)
		if err != nil || !ok {
			panic(fmt.Sprint(l, err))
		}
		out = append(out, in)
	}
	return out
}

func addEntries(e *Engine, table string, opts EntryOptions, lines ...string) ([]EntryResult, error) {
	var res []EntryResult
	err := change(e, func(tx *Txn) error {
		var err error
		res, err = tx.AddEntries(table, inputs(lines...), opts)
		return err
	})
	return res, err
}

func TestTableBatchPerEntryResults(t *testing.T) {
	e, dp, _, _ := newTableEngine(t)
	createTable(t, e, "acl", "addr", "mark", func(tb *model.Table) { tb.Limit = 3 })
	res, err := addEntries(e, "acl", EntryOptions{}, "10.0.0.0/8 1", "10.0.0.0/8 2", "10.1.0.1/8", "fd00::/64 3", "192.168.0.0/16", "172.16.0.0/12")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"", "entry exists", "did you mean 10.0.0.0/8", "", "", "the table is full (limit 3 entries)"}
	for i, w := range want {
		switch {
		case w == "" && res[i].Err != nil:
			t.Errorf("entry %q: %v", res[i].Key, res[i].Err)
		case w != "" && (res[i].Err == nil || !strings.Contains(res[i].Err.Error(), w)):
			t.Errorf("entry %q: error %v, want %q", res[i].Key, res[i].Err, w)
		}
	}
	tb, _ := e.Snapshot().Table("acl")
	if tb.Len() != 3 {
		t.Errorf("the table holds %d entries, want 3", tb.Len())
	}
	if got := dp.TableEntries(tb); len(got) != 3 || got["10.0.0.0/8"] != "mark=1" {
		t.Errorf("kernel holds %v", got)
	}
}

func TestTableBatchAtomic(t *testing.T) {
	e, dp, _, _ := newTableEngine(t)
	createTable(t, e, "acl", "addr", "", nil)
	_, err := addEntries(e, "acl", EntryOptions{Atomic: true}, "10.0.0.1", "10.0.0.300", "10.0.0.3")
	if err == nil || !strings.Contains(err.Error(), `table "acl" entry "10.0.0.300"`) {
		t.Fatalf("error %v, want one naming the bad entry", err)
	}
	tb, _ := e.Snapshot().Table("acl")
	if tb.Len() != 0 || len(dp.TableEntries(tb)) != 0 {
		t.Errorf("an atomic batch with a bad entry left %d entries", tb.Len())
	}
}

func TestTableSwapIsOneFlip(t *testing.T) {
	e, dp, _, _ := newTableEngine(t)
	createTable(t, e, "a", "addr", "", nil)
	createTable(t, e, "b", "addr", "", nil)
	createTable(t, e, "n", "number", "", nil)
	if _, err := addEntries(e, "a", EntryOptions{}, "10.0.0.1", "10.0.0.2"); err != nil {
		t.Fatal(err)
	}
	if _, err := addEntries(e, "b", EntryOptions{}, "192.168.0.0/16"); err != nil {
		t.Fatal(err)
	}
	writes := dp.SlotWrites()
	sa, _ := dp.TableSlot("a")
	sb, _ := dp.TableSlot("b")
	if err := change(e, func(tx *Txn) error { return tx.SwapTables("a", "b") }); err != nil {
		t.Fatal(err)
	}
	ta, _ := e.Snapshot().Table("a")
	tb, _ := e.Snapshot().Table("b")
	if ta.Len() != 1 || tb.Len() != 2 {
		t.Errorf("after swap a has %d entries, b %d; want 1 and 2", ta.Len(), tb.Len())
	}
	if got := dp.TableEntries(ta); len(got) != 1 || got["192.168.0.0/16"] != "" {
		t.Errorf("kernel: a holds %v, want 192.168.0.0/16", got)
	}
	if s, _ := dp.TableSlot("a"); s != sb {
		t.Errorf("a is bound to slot %d, want b's %d", s, sb)
	}
	if s, _ := dp.TableSlot("b"); s != sa {
		t.Errorf("b is bound to slot %d, want a's %d", s, sa)
	}
	if w := dp.SlotWrites() - writes; w != 0 {
		t.Errorf("the swap wrote %d entries in the kernel, want 0", w)
	}
	err := change(e, func(tx *Txn) error { return tx.SwapTables("a", "n") })
	if err == nil || !strings.Contains(err.Error(), "different types") {
		t.Errorf("swap of addr and number: %v", err)
	}
}

func TestTableLocked(t *testing.T) {
	e, _, _, _ := newTableEngine(t)
	createTable(t, e, "acl", "addr", "", func(tb *model.Table) { tb.Locked = true })
	for what, fn := range map[string]func(tx *Txn) error{
		"add": func(tx *Txn) error { _, err := tx.AddEntries("acl", inputs("10.0.0.1"), EntryOptions{}); return err },
		"delete": func(tx *Txn) error {
			_, err := tx.DeleteEntries("acl", []string{"10.0.0.1"}, EntryOptions{})
			return err
		},
		"flush":   func(tx *Txn) error { return tx.FlushTable("acl") },
		"destroy": func(tx *Txn) error { return tx.DestroyTable("acl") },
		"limit": func(tx *Txn) error {
			tb, _ := tx.Table("acl")
			c := tb.Clone()
			c.Limit = 5
			return tx.PutTable(c)
		},
	} {
		if err := change(e, fn); err == nil || !strings.Contains(err.Error(), `table "acl" is locked`) {
			t.Errorf("%s on a locked table: %v", what, err)
		}
	}
	// Unlocking is the one change a locked table takes.
	if err := change(e, func(tx *Txn) error {
		tb, _ := tx.Table("acl")
		c := tb.Clone()
		c.Locked = false
		return tx.PutTable(c)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := addEntries(e, "acl", EntryOptions{Atomic: true}, "10.0.0.1"); err != nil {
		t.Errorf("add after unlock: %v", err)
	}
}

func TestTablePoliciesReferences(t *testing.T) {
	e, dp, _, _ := newTableEngine(t)
	f := webFarm(t, "web", "10.0.0.1", "80")
	f.Policies = []model.PolicyRef{{Name: "bl"}}
	err := put(e, f)
	if err == nil || !strings.Contains(err.Error(), `farm "web": field "policies" value "bl": no such policy`) {
		t.Fatalf("farm with a missing policy: %v", err)
	}
	createTable(t, e, "plain", "addr", "", nil)
	f.Policies = []model.PolicyRef{{Name: "plain"}}
	if err := put(e, f); err == nil || !strings.Contains(err.Error(), "has no verdict") {
		t.Errorf("farm with a table without verdict: %v", err)
	}
	createTable(t, e, "bl", "addr", "", func(tb *model.Table) { tb.Verdict = model.ListDeny })
	f.Policies = []model.PolicyRef{{Name: "bl"}}
	if err := put(e, f); err != nil {
		t.Fatal(err)
	}
	if got := dp.Policies()["web"]; len(got) != 1 || got[0] != "bl" {
		t.Errorf("plane's policies of web: %v", got)
	}
	if got := e.Snapshot().TableUsers("bl"); len(got) != 1 || got[0] != "web" {
		t.Errorf("users of bl: %v", got)
	}
	err = change(e, func(tx *Txn) error { return tx.DestroyTable("bl") })
	if err == nil || !strings.Contains(err.Error(), `table "bl" is used by farm "web"`) {
		t.Errorf("destroy of a used table: %v", err)
	}
	err = change(e, func(tx *Txn) error {
		tb, _ := tx.Table("bl")
		c := tb.Clone()
		c.Verdict = model.ListNone
		return tx.PutTable(c)
	})
	if err == nil || !strings.Contains(err.Error(), "must keep a verdict") {
		t.Errorf("verdict removed from a used table: %v", err)
	}
	// Farm and table deleted in one change: allowed.
	if err := change(e, func(tx *Txn) error {
		if err := tx.Delete("web"); err != nil {
			return err
		}
		return tx.DestroyTable("bl")
	}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Snapshot().Table("bl"); ok || len(dp.Policies()) != 0 {
		t.Errorf("after deleting farm and table: table present %v, policies %v", ok, dp.Policies())
	}
}

func TestTableKernelFailureChangesNothing(t *testing.T) {
	e, dp, st, _ := newTableEngine(t)
	createTable(t, e, "acl", "addr", "", nil)
	dp.FailTables = func(plan.TableDiff) error { return fake.ErrInjected }
	if _, err := addEntries(e, "acl", EntryOptions{}, "10.0.0.1"); !errors.Is(err, fake.ErrInjected) {
		t.Fatalf("error %v, want the injected one", err)
	}
	dp.FailTables = nil
	tables, err := st.LoadTables(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 1 || tables[0].Len() != 0 {
		t.Errorf("the disk kept a change the kernel refused: %d entries", tables[0].Len())
	}
	st.failTables = true
	if _, err := addEntries(e, "acl", EntryOptions{}, "10.0.0.2"); err == nil {
		t.Fatal("a disk failure was not reported")
	}
	st.failTables = false
	tb, _ := e.Snapshot().Table("acl")
	if tb.Len() != 0 || len(dp.TableEntries(tb)) != 0 {
		t.Errorf("a change the disk refused stayed: state %d, kernel %v", tb.Len(), dp.TableEntries(tb))
	}
}

func TestTablesSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	open := func() (*Engine, *fake.Plane, *store.Bolt) {
		b, err := store.OpenBolt(dir)
		if err != nil {
			t.Fatal(err)
		}
		dp := fake.New()
		e, err := New(context.Background(), quiet, dp, b)
		if err != nil {
			t.Fatal(err)
		}
		return e, dp, b
	}
	e, _, b := open()
	createTable(t, e, "fl", "flow:src-ip,proto,dst-port", "mark,farm,limit", func(tb *model.Table) { tb.Limit = 10 })
	createTable(t, e, "bl", "addr", "", func(tb *model.Table) { tb.Verdict = model.ListDeny })
	if _, err := addEntries(e, "fl", EntryOptions{Atomic: true}, "10.0.0.1,tcp,80 7,web,100", "fd00::1,udp,53 mark=1 timeout 3600"); err != nil {
		t.Fatal(err)
	}
	// bl gets its entries by a swap with bl2: the swap must be saved.
	createTable(t, e, "bl2", "addr", "", nil)
	if _, err := addEntries(e, "bl2", EntryOptions{Atomic: true}, "10.9.0.0/16"); err != nil {
		t.Fatal(err)
	}
	if err := change(e, func(tx *Txn) error { return tx.SwapTables("bl", "bl2") }); err != nil {
		t.Fatal(err)
	}
	f := webFarm(t, "web", "10.0.0.1", "80")
	f.Policies = []model.PolicyRef{{Name: "bl"}}
	if err := put(e, f); err != nil {
		t.Fatal(err)
	}
	before := e.Snapshot()
	b.Close()

	e2, dp2, b2 := open()
	defer b2.Close()
	s := e2.Snapshot()
	for _, name := range []string{"fl", "bl", "bl2"} {
		old, _ := before.Table(name)
		got, ok := s.Table(name)
		if !ok {
			t.Fatalf("table %q lost", name)
		}
		if !old.SameSpec(got) || old.ID != got.ID || old.Slot != got.Slot || old.Len() != got.Len() {
			t.Errorf("table %q after restart: %+v, want %+v", name, got, old)
		}
		if fmt.Sprint(dp2.TableEntries(got)) != fmt.Sprint(dp2.TableEntries(old)) || len(dp2.TableEntries(got)) != old.Len() {
			t.Errorf("table %q: kernel reconciled with %v", name, dp2.TableEntries(got))
		}
	}
	fl, _ := s.Table("fl")
	e1, ok, err := fl.Lookup("fd00::1,udp,53")
	if err != nil || !ok || e1.Expires == 0 || e1.Value.Mark != 1 {
		t.Errorf("flow entry after restart: %+v %v %v", e1, ok, err)
	}
	if got := s.TableUsers("bl"); len(got) != 1 {
		t.Errorf("users of bl after restart: %v", got)
	}
	// A new table after restart gets a fresh ID and slot.
	createTable(t, e2, "new", "number", "", nil)
	nt, _ := e2.Snapshot().Table("new")
	for _, name := range []string{"fl", "bl"} {
		o, _ := s.Table(name)
		if nt.ID == o.ID || nt.Slot == o.Slot {
			t.Errorf("new table reuses id %d / slot %d of %q", nt.ID, nt.Slot, name)
		}
	}
}

func TestTableExpiry(t *testing.T) {
	e, dp, _, _ := newTableEngine(t)
	now := time.Unix(1_000_000, 0)
	e.now = func() time.Time { return now }
	createTable(t, e, "tmp", "addr", "", func(tb *model.Table) { tb.Timeout = 10 })
	if _, err := addEntries(e, "tmp", EntryOptions{}, "10.0.0.1", "10.0.0.2 timeout 0", "10.0.0.3 timeout 30"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(11 * time.Second)
	n, err := e.ExpireEntries(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("expired %d (%v), want 1", n, err)
	}
	tb, _ := e.Snapshot().Table("tmp")
	if got := dp.TableEntries(tb); len(got) != 2 {
		t.Errorf("after expiry the kernel holds %v", got)
	}
	now = now.Add(30 * time.Second)
	if n, _ := e.ExpireEntries(context.Background()); n != 1 {
		t.Errorf("second expiry removed %d, want 1", n)
	}
}

func TestTableRestoreKeepsSlots(t *testing.T) {
	e, dp, _, _ := newTableEngine(t)
	createTable(t, e, "a", "addr", "", nil)
	if _, err := addEntries(e, "a", EntryOptions{}, "10.0.0.1", "10.0.0.2"); err != nil {
		t.Fatal(err)
	}
	before, _ := e.Snapshot().Table("a")
	writes := dp.SlotWrites()
	// A restore with the same table and one entry more writes one entry.
	err := change(e, func(tx *Txn) error {
		tx.ReplaceAll()
		tb := model.NewTable("a", model.TableAddr)
		if err := tx.PutTable(tb); err != nil {
			return err
		}
		return tx.ReplaceEntries("a", inputs("10.0.0.1", "10.0.0.2", "10.0.0.3"))
	})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := e.Snapshot().Table("a")
	if after.Slot != before.Slot || after.ID != before.ID || after.Len() != 3 {
		t.Errorf("restore: slot %d->%d id %d->%d len %d", before.Slot, after.Slot, before.ID, after.ID, after.Len())
	}
	if w := dp.SlotWrites() - writes; w != 1 {
		t.Errorf("restore wrote %d entries in the kernel, want 1", w)
	}
	// A restore without the table destroys it.
	if err := change(e, func(tx *Txn) error { tx.ReplaceAll(); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Snapshot().Table("a"); ok {
		t.Error("a restore without the table kept it")
	}
}
