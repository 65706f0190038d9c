package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// JournalName is the journal's name inside the state directory.
const JournalName = "xlb.journal"

// Journal is the daemon's Store: the bbolt file of Bolt plus an append-only
// journal in front of it.
//
// Why: a bbolt commit fsyncs twice (its pages, then its meta page), and on a
// VM whose disk flush costs about 0.6 ms that made the disk, not the kernel,
// the slower half of an API change. A change here is acknowledged after one
// fdatasync of one appended record; the records are folded into the bbolt
// file in one transaction once the journal passes a size (and at every
// open), so the journal stays short and the bbolt file stays the state.
//
// A record is [uint32 length][uint32 CRC-32C of the payload][payload]; the
// payload holds the farms as the change leaves them (redo) and as they were
// (undo, for UndoLast). A record is acknowledged only after it is on disk,
// and the next is written only after that, so a crash can only leave a torn
// last record: replay stops at the first record that is short, zero or
// fails its checksum. Replaying a record twice (a crash between a fold and
// the journal's zeroing) gives the same farms, as each record sets whole
// farms.
//
// The file is preallocated: foldAt bytes of written zeros, records
// overwrite them from the start, and a fold zeroes what the records used.
// So an fdatasync writes the record's blocks only: an append would change
// the file's size too, which on ext4 costs a journal commit (and a second
// flush) per change; measured on this VM, about 0.1 ms of 0.75 ms per
// fdatasync. Zeroing, not truncating, also means no record of an earlier
// round can follow a new one and be replayed.
type Journal struct {
	mu   sync.Mutex
	db   *Bolt
	f    *os.File
	size int64 // bytes of valid records in f
	// used: f may hold bytes other than zero in [0, used) (records, or
	// a write that failed); a fold zeroes them.
	used int64

	// foldAt is the journal size past which Commit first folds it into the
	// bbolt file; a record larger than bigRecord, or a diff of more than
	// bulkChanges farms, goes to the bbolt file directly.
	foldAt, bigRecord int64

	// ro is set when the state was opened read-only (readonly.go): the
	// disk had no room to fold or preallocate the journal.
	ro *UnavailableError
	// id is what the state directory and its files were at open
	// (guard.go): a change is refused once they are gone or replaced.
	id stateID

	// onSync, when set, is told how long each fdatasync of a record took
	// (SetSyncObserver).
	onSync func(time.Duration)
}

// SetSyncObserver makes the journal report how long each fdatasync of a
// record takes (the store's share of a change). Call it before the first
// change.
func (j *Journal) SetSyncObserver(fn func(time.Duration)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.onSync = fn
}

const (
	defaultFoldAt    = 4 << 20
	defaultBigRecord = 512 << 10
	recordHeader     = 8
	// bulkChanges: a diff of more farms goes to the bbolt file directly
	// (it would be a big record anyway).
	bulkChanges = 256
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var _ Undoer = (*Journal)(nil)

// OpenJournal opens (creating if needed) the state in dir and folds what
// the journal holds into the bbolt file. If the disk has no room for that,
// it opens the state read-only instead (ReadOnly says why): the saved
// state loads, changes are refused.
func OpenJournal(dir string) (*Journal, error) {
	j, err := openJournal(dir)
	if err != nil && isNoSpace(err) {
		return openReadOnly(dir, err)
	}
	return j, err
}

func openJournal(dir string) (*Journal, error) {
	db, err := openBolt(dir)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, JournalName)
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open state journal %q: %w", path, err)
	}
	if os.IsNotExist(statErr) {
		// The journal's directory entry must be durable before any
		// record in it is acknowledged.
		if err := syncDir(dir); err != nil {
			f.Close()
			db.Close()
			return nil, fmt.Errorf("create state journal %q: %w", path, err)
		}
	}
	j := &Journal{db: db, f: f, foldAt: defaultFoldAt, bigRecord: defaultBigRecord}
	st, err := f.Stat()
	if err == nil {
		j.size, j.used = st.Size(), st.Size()
		err = j.fold()
	}
	if err == nil {
		err = j.db.migrate() // after the fold: see migrate
	}
	if err == nil {
		err = j.preallocate(st.Size())
	}
	if err == nil {
		j.id, err = identify(dir)
	}
	if err != nil {
		f.Close()
		db.Close()
		return nil, fmt.Errorf("state journal %q: %w", path, err)
	}
	return j, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Load implements Store.
func (j *Journal) Load(ctx context.Context) ([]model.Farm, error) {
	if j.ro != nil {
		return j.loadReadOnly(ctx)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	return j.db.Load(ctx)
}

// Commit implements Store: the change is on disk when it returns.
func (j *Journal) Commit(ctx context.Context, d plan.Diff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if j.ro != nil {
		return j.ro
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(d.Changes) > bulkChanges {
		// A bulk change (a restore, a bulk POST) goes to the bbolt file
		// without being encoded as a record first.
		if err := j.fold(); err != nil {
			return fmt.Errorf("save state: %w", err)
		}
		return j.db.Commit(ctx, d)
	}
	rec := encodeRecord(d)
	if int64(len(rec)) > j.bigRecord || j.size+int64(len(rec)) > j.foldAt {
		if err := j.fold(); err != nil {
			return fmt.Errorf("save state: %w", err)
		}
		if int64(len(rec)) > j.bigRecord {
			return j.db.Commit(ctx, d)
		}
	}
	return j.append(rec)
}

// append writes one record after the last and syncs it: the change is on
// disk when it returns.
func (j *Journal) append(rec []byte) error {
	// A failed write or sync leaves the record unacknowledged; the next
	// one overwrites it from j.size, and the next fold zeroes what is left.
	j.used = max(j.used, j.size+int64(len(rec)))
	if _, err := j.f.WriteAt(rec, j.size); err != nil {
		return fmt.Errorf("save state: write journal: %w", err)
	}
	t0 := time.Now()
	if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
		return fmt.Errorf("save state: sync journal: %w", err)
	}
	if j.onSync != nil {
		j.onSync(time.Since(t0))
	}
	j.size += int64(len(rec))
	return nil
}

// Revert implements Undoer. It is rare (the kernel refused a change the disk
// took), so it folds the journal and lets the bbolt file take d back.
func (j *Journal) Revert(ctx context.Context, d plan.Diff) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return fmt.Errorf("save state: take back a change the kernel refused: %w", err)
	}
	return j.db.Revert(ctx, d)
}

// UndoLast implements Undoer.
func (j *Journal) UndoLast(ctx context.Context) ([]string, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return nil, fmt.Errorf("take back the last saved change: %w", err)
	}
	return j.db.UndoLast(ctx)
}

// Close implements Store. The journal is not folded: the next open does it.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var errs []error
	if j.f != nil { // nil: read-only without a journal file
		errs = append(errs, j.f.Close())
	}
	if j.db != nil {
		errs = append(errs, j.db.Close())
	}
	return errors.Join(errs...)
}

// fold applies the journal's records to the bbolt file in one transaction
// (the undo kept is the last record's) and empties the journal (zeroes what
// was used). Records after the first bad one are dropped: they were never
// acknowledged.
func (j *Journal) fold() error {
	if j.ro != nil {
		return j.ro
	}
	if j.size == 0 && j.used == 0 {
		return nil
	}
	buf := make([]byte, j.size)
	if _, err := io.ReadFull(io.NewSectionReader(j.f, 0, j.size), buf); err != nil {
		return fmt.Errorf("read journal: %w", err)
	}
	recs := validRecords(buf)
	if len(recs) > 0 {
		err := j.db.db.Update(func(tx *bolt.Tx) error {
			farms := tx.Bucket(farmsBucket)
			// The undo kept is the last record's: an earlier change's
			// table undo (and the slots it kept aside) goes.
			if err := clearTableUndo(tx); err != nil {
				return err
			}
			var undo, tundo []byte
			for _, r := range recs {
				redo, u, tredo, tu, err := r.split()
				if err != nil {
					return err
				}
				undo, tundo = u, tu
				// The redo list has encodeUndo's layout: each farm as
				// the change leaves it, nothing for a deleted one.
				if err := decodeUndo(redo, func(name string, v []byte) error {
					if v == nil {
						return farms.Delete([]byte(name))
					}
					return farms.Put([]byte(name), v)
				}); err != nil {
					return err
				}
				if err := applyTableOps(tx, tredo); err != nil {
					return err
				}
			}
			if len(tundo) > 0 {
				if err := tx.Bucket(metaBucket).Put(undoTablesKey, tundo); err != nil {
					return err
				}
			}
			return tx.Bucket(metaBucket).Put(undoKey, undo)
		})
		if err != nil {
			return fmt.Errorf("fold journal into the state file: %w", err)
		}
	}
	if _, err := j.f.WriteAt(make([]byte, j.used), 0); err != nil {
		return fmt.Errorf("empty journal: %w", err)
	}
	if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
		return fmt.Errorf("empty journal: %w", err)
	}
	j.size, j.used = 0, 0
	return nil
}

// recTables marks, in a record's length word, a record that carries table
// changes too (encodeTableRecord's layout). Records are far shorter than
// 2 GiB, so the bit was always clear before.
const recTables = 1 << 31

// journalRecord is one valid record's payload.
type journalRecord struct {
	payload []byte
	tables  bool // encodeTableRecord's layout
}

// validRecords returns the journal's records up to the first that is
// short, zero or fails its checksum.
func validRecords(buf []byte) []journalRecord {
	var recs []journalRecord
	for len(buf) >= recordHeader {
		word := binary.LittleEndian.Uint32(buf)
		n := word &^ recTables
		sum := binary.LittleEndian.Uint32(buf[4:])
		if n == 0 || uint64(n) > uint64(len(buf)-recordHeader) {
			break
		}
		payload := buf[recordHeader : recordHeader+int(n)]
		if crc32.Checksum(payload, castagnoli) != sum {
			break
		}
		recs = append(recs, journalRecord{payload: payload, tables: word&recTables != 0})
		buf = buf[recordHeader+int(n):]
	}
	return recs
}

// preallocate makes the (empty) journal file foldAt bytes of written zeros
// if it is shorter (a new file, or one of an xlb that appended), so that
// records only ever overwrite blocks that exist. Not fallocate: on ext4 its
// unwritten extents would be converted, a metadata change, at each first
// write.
//
// A disk without room for foldAt bytes gets a smaller journal: at most
// half the free space, so the bbolt file has room to take the folds (at
// least minJournal; below that the state opens read-only). A change then
// folds more often, and a record over half the journal goes to the bbolt
// file directly.
func (j *Journal) preallocate(size int64) error {
	if size >= j.foldAt {
		return nil
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(j.f.Fd()), &fs); err == nil {
		if half := size + int64(fs.Bavail)*int64(fs.Bsize)/2; half < j.foldAt {
			j.foldAt = half &^ 4095
			j.bigRecord = min(j.bigRecord, j.foldAt/2)
		}
	}
	if j.foldAt < minJournal {
		return fmt.Errorf("preallocate the journal: %d bytes of room, at least %d needed: %w", 2*j.foldAt, 2*minJournal, syscall.ENOSPC)
	}
	if size >= j.foldAt {
		return nil
	}
	if _, err := j.f.WriteAt(make([]byte, j.foldAt-size), size); err != nil {
		return fmt.Errorf("preallocate %d bytes: %w", j.foldAt, err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("preallocate: %w", err)
	}
	return nil
}

// encodeRecord frames d as a journal record: uvarint length of the redo
// list, the redo list (each farm d touches as d leaves it, in encodeUndo's
// layout, the last version of a farm winning), then the undo list
// (encodeUndo).
//
// The record is built in one buffer sized up front, the farms' cached JSON
// appended straight into it: it was copied three times (AppendJSON into a
// buffer of its own, into the redo list, into the payload), about 50 KB
// allocated for a farm of 100 backends.
func encodeRecord(d plan.Diff) []byte {
	last := make(map[string]int, len(d.Changes)) // name -> index in entries
	type entry struct {
		name string
		f    *model.Farm // nil: deleted
	}
	var entries []entry
	set := func(name string, f *model.Farm) {
		if i, ok := last[name]; ok {
			entries[i].f = f
			return
		}
		last[name] = len(entries)
		entries = append(entries, entry{name, f})
	}
	for _, c := range d.Changes {
		if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
			set(c.Old.Name, nil)
		}
		if c.New != nil {
			set(c.New.Name, c.New)
		}
	}
	redoLen := 0
	for _, e := range entries {
		redoLen += farmEntrySize(e.name, e.f)
	}
	undoMax := 0 // the undo list's size if no name repeats
	for _, c := range d.Changes {
		if c.Old != nil {
			undoMax += farmEntrySize(c.Old.Name, c.Old)
		}
		if c.New != nil {
			undoMax += farmEntrySize(c.New.Name, nil)
		}
	}
	payload := make([]byte, recordHeader, recordHeader+binary.MaxVarintLen64+redoLen+undoMax)
	payload = binary.AppendUvarint(payload, uint64(redoLen))
	for _, e := range entries {
		payload = appendFarmEntry(payload, e.name, e.f)
	}
	payload = appendUndo(payload, d)
	binary.LittleEndian.PutUint32(payload, uint32(len(payload)-recordHeader))
	binary.LittleEndian.PutUint32(payload[4:], crc32.Checksum(payload[recordHeader:], castagnoli))
	return payload
}

// split returns a record's farm redo and undo lists and its table redo and
// undo operation lists (none in a record of farms only).
func (r journalRecord) split() (redo, undo, tredo, tundo []byte, err error) {
	if !r.tables {
		redo, undo, err = splitRecord(r.payload)
		return redo, undo, nil, nil, err
	}
	p := r.payload
	var parts [3][]byte
	for i := range parts {
		n, k := binary.Uvarint(p)
		if k <= 0 || uint64(len(p)-k) < n {
			return nil, nil, nil, nil, errors.New("journal record is corrupt")
		}
		parts[i], p = p[k:k+int(n)], p[k+int(n):]
	}
	return parts[0], parts[1], parts[2], p, nil
}

// splitRecord returns a record payload's redo and undo lists.
func splitRecord(p []byte) (redo, undo []byte, err error) {
	n, k := binary.Uvarint(p)
	if k <= 0 || uint64(len(p)-k) < n {
		return nil, nil, errors.New("journal record is corrupt")
	}
	return p[k : k+int(n)], p[k+int(n):], nil
}

// encodeTableRecord is the record of a change with tables: uvarint-length
// prefixed farm redo list, farm undo list and table redo operations, then
// the table undo operations (tableops.go).
func encodeTableRecord(d plan.Diff, td plan.TableDiff) []byte {
	farms := encodeRecord(d)[recordHeader:]
	redo, undo, _ := splitRecord(farms)
	tredo, tundo := encodeTableRedo(td), encodeTableUndo(td)
	payload := make([]byte, recordHeader, recordHeader+len(farms)+len(tredo)+len(tundo)+3*binary.MaxVarintLen64)
	for _, part := range [][]byte{redo, undo, tredo} {
		payload = binary.AppendUvarint(payload, uint64(len(part)))
		payload = append(payload, part...)
	}
	payload = append(payload, tundo...)
	binary.LittleEndian.PutUint32(payload, uint32(len(payload)-recordHeader)|recTables)
	binary.LittleEndian.PutUint32(payload[4:], crc32.Checksum(payload[recordHeader:], castagnoli))
	return payload
}
