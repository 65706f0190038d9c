package store

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

func testFarm(t testing.TB, i int) *model.Farm {
	body := fmt.Sprintf(`{"name":"f%d","virtual-addr":"10.0.%d.%d","virtual-ports":"80","backends":[{"name":"b","ip-addr":"10.1.0.1"}]}`, i, i/250, i%250+1)
	fs, err := model.DecodeFarms([]byte(body), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	return &fs[0]
}

// undoStore is what both Bolt and Journal are.
type undoStore interface {
	Store
	Undoer
}

// stores are the implementations the behaviour tests run on.
var stores = []struct {
	name string
	open func(dir string) (undoStore, error)
}{
	{"bolt", func(dir string) (undoStore, error) { return OpenBolt(dir) }},
	{"journal", func(dir string) (undoStore, error) { return OpenJournal(dir) }},
}

// eachStore runs fn as a subtest on every implementation.
func eachStore(t *testing.T, fn func(t *testing.T, open func(string) (undoStore, error))) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) { fn(t, st.open) })
	}
}

func TestCommitLoadDelete(t *testing.T) { eachStore(t, testCommitLoadDelete) }

func testCommitLoadDelete(t *testing.T, open func(string) (undoStore, error)) {
	dir := t.TempDir()
	s, err := open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, b := testFarm(t, 1), testFarm(t, 2)
	if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: a}, {New: b}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: a}}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	farms, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(farms) != 1 || farms[0].Name != "f2" || string(farms[0].AppendJSON(nil)) != string(b.AppendJSON(nil)) {
		t.Errorf("loaded %+v", farms)
	}
}

// A second daemon on the same state dir gets a clear error, not a hang or a
// corrupted file.
func TestLockedByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = OpenBolt(dir)
	if err == nil || !strings.Contains(err.Error(), "another xlb daemon") {
		t.Errorf("second open: %v", err)
	}
}

func TestCorruptFileIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/"+FileName, []byte("this is not a bbolt file, it is garbage garbage garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenBolt(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("open of a corrupt file: %v (want an error naming the path)", err)
	}
}

// crashChildEnv makes the test binary act as a writer that is killed -9;
// crashStoreEnv names the store it writes to.
const (
	crashChildEnv = "XLB_STORE_CRASH_CHILD"
	crashStoreEnv = "XLB_STORE_CRASH_STORE"
	// crashTablesEnv makes the child add table entries (CommitChange), one
	// a change, instead of farms.
	crashTablesEnv = "XLB_STORE_CRASH_TABLES"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	os.Exit(m.Run())
}

// crashChild applies farms one at a time forever, printing "ack N" after each
// Commit returns: an acknowledged change.
func crashChild(dir string) {
	var s Store
	var err error
	if os.Getenv(crashStoreEnv) == "journal" {
		s, err = OpenJournal(dir)
	} else {
		s, err = OpenBolt(dir)
	}
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if os.Getenv(crashTablesEnv) != "" {
		crashChildTables(s.(ChangeStore))
		return
	}
	for i := 0; ; i++ {
		if err := s.Commit(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: testFarm(nil, i)}}}); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("ack", i)
	}
}

// crashEntry is the i-th entry the tables' crash child adds.
func crashEntry(tb *model.Table, i int) model.TableEntry {
	e, err := tb.ParseEntry(model.EntryInput{Key: fmt.Sprintf("10.%d.%d.0/24", i/250, i%250)}, 0)
	if err != nil {
		panic(err)
	}
	return e
}

// crashChildTables creates table "t" and adds one entry a change forever,
// printing "ack N" after each.
func crashChildTables(s ChangeStore) {
	tb := model.NewTable("t", model.TableAddr)
	tb.ID, tb.Slot = 1, 1
	cur := &tb
	d := plan.TableDiff{Tables: []plan.TableChange{{New: cur}}, Slots: []plan.SlotChange{{Slot: 1, New: cur}}}
	if err := s.CommitChange(context.Background(), plan.Diff{}, d); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for i := 0; ; i++ {
		next := cur.Clone()
		e := crashEntry(&next, i)
		next.PutEntry(e)
		d := plan.TableDiff{Slots: []plan.SlotChange{{Slot: 1, Old: cur, New: &next, Put: []model.TableEntry{e}}}}
		if err := s.CommitChange(context.Background(), plan.Diff{}, d); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		cur = &next
		fmt.Println("ack", i)
	}
}

// kill -9 during writes loses no acknowledged change and leaves a readable
// file; so does kill -9 during table changes (one entry added a change).
func TestCrashLosesNoAcknowledgedChange(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) { testCrash(t, st.name, st.open, false) })
		t.Run(st.name+"/tables", func(t *testing.T) { testCrash(t, st.name, st.open, true) })
	}
}

func testCrash(t *testing.T, store string, open func(string) (undoStore, error), tables bool) {
	for round := range 3 {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, crashStoreEnv+"="+store)
		if tables {
			cmd.Env = append(cmd.Env, crashTablesEnv+"=1")
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		lastAck := -1
		deadline := time.Now().Add(10 * time.Second)
		target := 20 + round*37
		for sc.Scan() && time.Now().Before(deadline) {
			f := strings.Fields(sc.Text())
			if len(f) == 2 && f[0] == "ack" {
				lastAck, _ = strconv.Atoi(f[1])
			}
			if lastAck >= target {
				break
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if lastAck < 0 {
			t.Fatal("child acknowledged nothing")
		}
		s, err := open(dir)
		if err != nil {
			t.Fatalf("reopen after kill -9: %v", err)
		}
		if tables {
			checkCrashTables(t, s.(TableStore), round, lastAck)
			s.Close()
			continue
		}
		farms, err := s.Load(context.Background())
		s.Close()
		if err != nil {
			t.Fatalf("load after kill -9: %v", err)
		}
		have := map[string]bool{}
		for _, f := range farms {
			have[f.Name] = true
		}
		for i := 0; i <= lastAck; i++ {
			if !have[fmt.Sprintf("f%d", i)] {
				t.Fatalf("round %d: acknowledged farm f%d lost after kill -9 (last ack %d, %d saved)", round, i, lastAck, len(farms))
			}
		}
	}
}

// checkCrashTables requires every acknowledged entry of the tables' crash
// child to be saved.
func checkCrashTables(t *testing.T, s TableStore, round, lastAck int) {
	t.Helper()
	tables, err := s.LoadTables(context.Background())
	if err != nil {
		t.Fatalf("load tables after kill -9: %v", err)
	}
	if len(tables) != 1 {
		t.Fatalf("round %d: %d tables saved after kill -9, want 1", round, len(tables))
	}
	tb := tables[0]
	for i := 0; i <= lastAck; i++ {
		if _, ok := tb.Entry(crashEntry(tb, i).Key); !ok {
			t.Fatalf("round %d: acknowledged entry %d lost after kill -9 (last ack %d, %d saved)", round, i, lastAck, tb.Len())
		}
	}
}

// UndoLast takes back exactly the last Commit: farms it added go, farms it
// changed or deleted come back as they were; a second UndoLast does nothing.
func TestUndoLast(t *testing.T) { eachStore(t, testUndoLast) }

func testUndoLast(t *testing.T, open func(string) (undoStore, error)) {
	s, err := open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	a, b, c := testFarm(t, 1), testFarm(t, 2), testFarm(t, 3)
	if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: a}, {New: b}}}); err != nil {
		t.Fatal(err)
	}
	a2 := a.Clone()
	a2.Backends[0].Weight = 7
	if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{Old: a, New: &a2}, {Old: b}, {New: c}}}); err != nil {
		t.Fatal(err)
	}
	names, err := s.UndoLast(ctx)
	if err != nil || strings.Join(names, ",") != "f1,f2,f3" {
		t.Fatalf("UndoLast: %v %v, want f1,f2,f3", names, err)
	}
	farms, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range farms {
		got[f.Name] = string(f.AppendJSON(nil))
	}
	if len(got) != 2 || got["f1"] != string(a.AppendJSON(nil)) || got["f2"] != string(b.AppendJSON(nil)) {
		t.Errorf("after UndoLast: %v", got)
	}
	if names, err := s.UndoLast(ctx); err != nil || len(names) != 0 {
		t.Errorf("second UndoLast: %v %v, want nothing", names, err)
	}
}

// Revert takes back a change the kernel refused and leaves no undo behind.
func TestRevert(t *testing.T) { eachStore(t, testRevert) }

func testRevert(t *testing.T, open func(string) (undoStore, error)) {
	s, err := open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	a, b := testFarm(t, 1), testFarm(t, 2)
	if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: a}}}); err != nil {
		t.Fatal(err)
	}
	d := plan.Diff{Changes: []plan.FarmChange{{New: b}}}
	if err := s.Commit(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := s.Revert(ctx, d); err != nil {
		t.Fatal(err)
	}
	farms, _ := s.Load(ctx)
	if len(farms) != 1 || farms[0].Name != "f1" {
		t.Errorf("after Revert: %d farms", len(farms))
	}
	if names, err := s.UndoLast(ctx); err != nil || len(names) != 0 {
		t.Errorf("UndoLast after Revert: %v %v, want nothing", names, err)
	}
}

func TestDecodeUndoRejectsGarbage(t *testing.T) {
	for _, raw := range [][]byte{{5, 'a'}, {1, 'a', 9, '{'}, {0xff}} {
		if err := decodeUndo(raw, func(string, []byte) error { return nil }); err == nil {
			t.Errorf("decodeUndo(%q) accepted garbage", raw)
		}
	}
}

// Every farm field survives a save and load, including the dsr ones
// (iface, oface, ether-addr of the farm and its backends).
func TestDSRFieldsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := model.DecodeFarms([]byte(`{"name":"d","virtual-addr":"10.0.0.1","virtual-ports":"80","mode":"dsr","scheduler":"hash",
		"iface":"eth0","oface":"eth1","ether-addr":"02:00:00:00:00:01","backends":[{"name":"b","ip-addr":"10.1.0.1","ether-addr":"02:00:00:00:00:02"}]}`),
		func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: &fs[0]}}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Iface != "eth0" || got[0].Oface != "eth1" || got[0].EtherAddr != fs[0].EtherAddr ||
		got[0].Backends[0].EtherAddr != fs[0].Backends[0].EtherAddr {
		t.Errorf("loaded %+v, want %+v", got, fs[0])
	}
}

// A read-only state (the disk was full at start) loads the tables of the
// journal's records too: the bbolt file's tables with the records replayed
// in memory.
func TestReadOnlyLoadsJournalTables(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	tb := model.NewTable("t", model.TableAddr)
	tb.ID, tb.Slot = 1, 1
	next := tb.Clone()
	e := crashEntry(&next, 3)
	next.PutEntry(e)
	ctx := context.Background()
	if err := j.CommitChange(ctx, plan.Diff{}, plan.TableDiff{Tables: []plan.TableChange{{New: &tb}}, Slots: []plan.SlotChange{{Slot: 1, New: &tb}}}); err != nil {
		t.Fatal(err)
	}
	if err := j.CommitChange(ctx, plan.Diff{}, plan.TableDiff{Slots: []plan.SlotChange{{Slot: 1, Old: &tb, New: &next, Put: []model.TableEntry{e}}}}); err != nil {
		t.Fatal(err)
	}
	if j.size == 0 {
		t.Fatal("the table changes did not go to the journal")
	}
	j.Close() // not folded
	ro, err := openReadOnly(dir, fmt.Errorf("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	tables, err := ro.LoadTables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 1 || tables[0].Len() != 1 {
		t.Fatalf("read-only load: %d tables (%v), want t with 1 entry", len(tables), tables)
	}
	if _, ok := tables[0].Entry(e.Key); !ok {
		t.Errorf("read-only load lacks the journal's entry")
	}
}

// A read-only state loads the unused addresses of the journal's records
// too, each record applied in order: one address put then changed, one put
// then removed, one without an IP address kept.
func TestReadOnlyLoadsJournalAddresses(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	a1 := model.Address{Name: "a1", Family: model.FamilyIPv4, Addr: netip.MustParseAddr("10.0.9.1"), Protocol: model.ProtoTCP}
	a2 := model.Address{Name: "a2", Family: model.FamilyIPv4, Addr: netip.MustParseAddr("10.0.9.2"), Protocol: model.ProtoUDP}
	a3 := model.Address{Name: "a3", Family: model.FamilyIPv6, Protocol: model.ProtoUDP} // no ip-addr
	a1b := a1
	a1b.Addr = netip.MustParseAddr("10.0.9.11")
	ctx := context.Background()
	for _, td := range []plan.TableDiff{
		{Addresses: []plan.AddressChange{{New: &a1}, {New: &a2}, {New: &a3}}},
		{Addresses: []plan.AddressChange{{Old: &a1, New: &a1b}, {Old: &a2}}},
	} {
		if err := j.CommitChange(ctx, plan.Diff{}, td); err != nil {
			t.Fatal(err)
		}
	}
	if j.size == 0 {
		t.Fatal("the address changes did not go to the journal")
	}
	j.Close() // not folded
	ro, err := openReadOnly(dir, fmt.Errorf("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	addrs, err := ro.LoadAddresses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(addrs, func(a, b model.Address) int { return strings.Compare(a.Name, b.Name) })
	if len(addrs) != 2 || addrs[0].Name != "a1" || addrs[0].Addr != a1b.Addr || addrs[1].Name != "a3" || addrs[1].Addr.IsValid() || addrs[1].Family != model.FamilyIPv6 {
		t.Errorf("read-only load: %+v, want a1 at %s and a3 without an address", addrs, a1b.Addr)
	}
}
