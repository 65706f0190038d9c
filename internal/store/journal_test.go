package store

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
)

func put(t *testing.T, s Store, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := s.Commit(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: testFarm(t, i)}}}); err != nil {
			t.Fatal(err)
		}
	}
}

func names(t *testing.T, s Store) []string {
	t.Helper()
	farms, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range farms {
		out = append(out, f.Name)
	}
	slices.Sort(out)
	return out
}

// journalEnd returns where the journal's valid records end (0: it holds
// none), reading the file as a replay would.
func journalEnd(t *testing.T, dir string) int64 {
	t.Helper()
	buf, err := os.ReadFile(filepath.Join(dir, JournalName))
	if err != nil {
		t.Fatal(err)
	}
	end := 0
	for len(buf)-end >= recordHeader {
		n := int(binary.LittleEndian.Uint32(buf[end:]))
		if n == 0 || n > len(buf)-end-recordHeader ||
			crc32.Checksum(buf[end+recordHeader:end+recordHeader+n], castagnoli) != binary.LittleEndian.Uint32(buf[end+4:]) {
			break
		}
		end += recordHeader + n
	}
	return int64(end)
}

// The journal file is preallocated (foldAt bytes) and a fold leaves it all
// zeros: no record of an earlier round can be replayed after a new one.
func TestJournalPreallocatedAndZeroed(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	put(t, j, 0, 5)
	st, err := os.Stat(filepath.Join(dir, JournalName))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != defaultFoldAt || journalEnd(t, dir) == 0 {
		t.Errorf("journal: %d bytes, records end at %d; want %d bytes and records", st.Size(), journalEnd(t, dir), defaultFoldAt)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j, err = OpenJournal(dir) // folds
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	buf, err := os.ReadFile(filepath.Join(dir, JournalName))
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) != defaultFoldAt || slices.ContainsFunc(buf, func(b byte) bool { return b != 0 }) {
		t.Errorf("after a fold the journal is %d bytes and not all zeros", len(buf))
	}
	if got := names(t, j); len(got) != 5 {
		t.Errorf("after the fold: %v, want 5 farms", got)
	}
}

// A torn last record (a crash in the middle of a write, never
// acknowledged) is dropped; everything before it is kept, and the journal
// takes new records after the reopen.
func TestJournalDropsATornRecord(t *testing.T) {
	for _, torn := range []struct {
		name string
		cut  func(rec []byte) []byte
	}{
		{"short", func(rec []byte) []byte { return rec[:len(rec)-5] }},
		{"bad checksum", func(rec []byte) []byte { rec[len(rec)-1] ^= 0xff; return rec }},
		{"zeros", func(rec []byte) []byte { return make([]byte, len(rec)) }},
	} {
		t.Run(torn.name, func(t *testing.T) {
			dir := t.TempDir()
			j, err := OpenJournal(dir)
			if err != nil {
				t.Fatal(err)
			}
			put(t, j, 0, 3)
			j.Close()
			end := journalEnd(t, dir)
			if end == 0 {
				t.Fatal("the changes did not go to the journal")
			}
			rec := torn.cut(encodeRecord(plan.Diff{Changes: []plan.FarmChange{{New: testFarm(t, 9)}}}))
			f, err := os.OpenFile(filepath.Join(dir, JournalName), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(rec, end); err != nil {
				t.Fatal(err)
			}
			f.Close()
			j, err = OpenJournal(dir)
			if err != nil {
				t.Fatalf("reopen with a torn record: %v", err)
			}
			defer j.Close()
			if got := names(t, j); !slices.Equal(got, []string{"f0", "f1", "f2"}) {
				t.Errorf("after a torn record: %v, want f0 f1 f2", got)
			}
			if n := journalEnd(t, dir); n != 0 {
				t.Errorf("journal holds %d bytes of records after the open folded it, want none", n)
			}
			put(t, j, 3, 4)
			if got := names(t, j); !slices.Equal(got, []string{"f0", "f1", "f2", "f3"}) {
				t.Errorf("after a write following the repair: %v", got)
			}
		})
	}
}

// The journal folds into the bbolt file when it passes foldAt, and a
// bulk change goes to the bbolt file directly: the journal stays short.
func TestJournalStaysShort(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.foldAt = 2000
	put(t, j, 0, 40)
	if j.size > j.foldAt {
		t.Errorf("journal holds %d bytes, past its fold size %d", j.size, j.foldAt)
	}
	var bulk plan.Diff
	for i := 100; i < 140; i++ {
		bulk.Changes = append(bulk.Changes, plan.FarmChange{New: testFarm(t, i)})
	}
	j.bigRecord = 1000
	before := j.size
	if err := j.Commit(context.Background(), bulk); err != nil {
		t.Fatal(err)
	}
	if j.size != 0 || before == 0 && journalEnd(t, dir) != 0 {
		t.Errorf("a bulk change left %d bytes in the journal, want it folded and the change in the state file", j.size)
	}
	// A diff of more than bulkChanges farms goes to the state file too,
	// whatever its size.
	put(t, j, 200, 201)
	j.bigRecord = defaultBigRecord
	bulk = plan.Diff{}
	for i := 300; i < 300+bulkChanges+1; i++ {
		bulk.Changes = append(bulk.Changes, plan.FarmChange{New: testFarm(t, i)})
	}
	if err := j.Commit(context.Background(), bulk); err != nil {
		t.Fatal(err)
	}
	if j.size != 0 {
		t.Errorf("a diff of %d farms left %d bytes in the journal", len(bulk.Changes), j.size)
	}
	j.Close()
	// Everything is in the bbolt file alone now.
	b, err := OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got, want := len(names(t, b)), 80+1+bulkChanges+1; got != want {
		t.Errorf("state file holds %d farms, want %d", got, want)
	}
}

// A crash after a fold but before the journal was emptied replays records
// the state file already has: the farms and the undo come out the same.
func TestJournalReplayTwiceIsHarmless(t *testing.T) {
	dir := t.TempDir()
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	put(t, j, 0, 2)
	a := testFarm(t, 0)
	a2 := a.Clone()
	a2.Backends[0].Weight = 9
	if err := j.Commit(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: a, New: &a2}, {Old: testFarm(t, 1)}}}); err != nil {
		t.Fatal(err)
	}
	j.Close()
	saved, err := os.ReadFile(filepath.Join(dir, JournalName))
	if err != nil {
		t.Fatal(err)
	}
	j, err = OpenJournal(dir) // folds
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	if err := os.WriteFile(filepath.Join(dir, JournalName), saved, 0o600); err != nil {
		t.Fatal(err)
	}
	j, err = OpenJournal(dir) // folds the same records again
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	farms, _ := j.Load(context.Background())
	if len(farms) != 1 || farms[0].Backends[0].Weight != 9 {
		t.Fatalf("after a double replay: %+v, want f0 with weight 9 only", farms)
	}
	undone, err := j.UndoLast(context.Background())
	if err != nil || !slices.Equal(undone, []string{"f0", "f1"}) {
		t.Fatalf("UndoLast after a double replay: %v %v, want f0 f1", undone, err)
	}
	if got := names(t, j); !slices.Equal(got, []string{"f0", "f1"}) {
		t.Errorf("after UndoLast: %v, want f0 f1", got)
	}
	farms, _ = j.Load(context.Background())
	for _, f := range farms {
		if f.Name == "f0" && f.Backends[0].Weight == 9 {
			t.Error("UndoLast left f0's new weight")
		}
	}
}

// BenchmarkJournalBulk times one Commit of 16,000 new farms (a restore), the
// path where the journal hands the change to the bbolt file.
func BenchmarkJournalBulk(b *testing.B) {
	var d plan.Diff
	for i := range 16000 {
		d.Changes = append(d.Changes, plan.FarmChange{New: testFarm(b, i)})
	}
	for b.Loop() {
		b.StopTimer()
		j, err := OpenJournal(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := j.Commit(context.Background(), d); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		j.Close()
		b.StartTimer()
	}
}
