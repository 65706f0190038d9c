package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// A full disk no longer stops the daemon's state from opening: changes
// in the journal that cannot be folded into the bbolt file (no room)
// load read-only, and changes are refused with an *UnavailableError.
// Once space is freed, it opens writable with nothing lost. Before, the
// open failed until space was freed.
func TestFullDiskOpensReadOnly(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(testutil.SmallFS(t, "16m"), "state")
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	put(t, j, 0, 300) // in the journal, not yet folded (Load would fold it)
	var want []string
	for i := range 300 {
		want = append(want, fmt.Sprintf("f%d", i))
	}
	slices.Sort(want)
	j.Close()
	free := testutil.FillFS(t, filepath.Dir(dir))

	j, err = OpenJournal(dir)
	if err != nil {
		t.Fatalf("open on a full disk: %v", err)
	}
	var ue *UnavailableError
	if err := j.ReadOnly(); !errors.As(err, &ue) {
		t.Fatalf("ReadOnly() = %v on a full disk", err)
	}
	if got := names(t, j); !slices.Equal(got, want) {
		t.Fatalf("read-only load: %d farms, want %d", len(got), len(want))
	}
	if err := j.Commit(ctx, plan.Diff{Changes: []plan.FarmChange{{New: testFarm(t, 900)}}}); !errors.As(err, &ue) {
		t.Fatalf("Apply on a read-only state: %v", err)
	}
	if err := j.Writable(); !errors.As(err, &ue) {
		t.Fatalf("Writable: %v", err)
	}
	j.Close()

	free()
	j, err = OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.ReadOnly(); err != nil {
		t.Fatalf("still read-only with room: %v", err)
	}
	if got := names(t, j); !slices.Equal(got, want) {
		t.Fatalf("after freeing space: %d farms, want %d", len(got), len(want))
	}
	put(t, j, 300, 301)
}

// A state directory with less room than the journal's preallocation (4
// MiB) opens with a smaller journal. Before, a 2 MB state directory
// refused to start. Below 64 KiB of room it opens read-only.
func TestSmallStateDir(t *testing.T) {
	dir := filepath.Join(testutil.SmallFS(t, "2m"), "state")
	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatalf("open a state in 2 MB: %v", err)
	}
	if err := j.ReadOnly(); err != nil {
		t.Fatalf("read-only: %v", err)
	}
	if j.foldAt >= defaultFoldAt || j.foldAt < minJournal {
		t.Errorf("journal of %d bytes", j.foldAt)
	}
	put(t, j, 0, 200) // more than the smaller journal holds: folds
	want := names(t, j)
	j.Close()
	j, err = OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(t, j); !slices.Equal(got, want) {
		t.Fatalf("reopened: %d farms, want %d", len(got), len(want))
	}
	j.Close()

	tiny := filepath.Join(testutil.SmallFS(t, "64k"), "state")
	j, err = OpenJournal(tiny)
	if err != nil {
		t.Fatalf("open in 64 KB: %v", err)
	}
	defer j.Close()
	if j.ReadOnly() == nil {
		t.Errorf("a journal in 64 KB opened writable")
	}
}

// A state directory removed or replaced while the state is open takes no
// change: it would be written to deleted files and lost at the next
// start, with its caller told it was saved.
func TestStateDirRemoved(t *testing.T) {
	for _, replace := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "state")
		j, err := OpenJournal(dir)
		if err != nil {
			t.Fatal(err)
		}
		put(t, j, 0, 1)
		if err := j.Writable(); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(dir)
		if replace {
			os.MkdirAll(dir, 0o700)
		}
		var ue *UnavailableError
		if err := j.Writable(); !errors.As(err, &ue) {
			t.Errorf("replace %v: Writable() = %v", replace, err)
		}
		j.Close()
	}
}

// BenchmarkJournalWritable is the check every change pays before it
// reaches the kernel (three stat calls).
func BenchmarkJournalWritable(b *testing.B) {
	j, err := OpenJournal(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	for b.Loop() {
		if err := j.Writable(); err != nil {
			b.Fatal(err)
		}
	}
}
