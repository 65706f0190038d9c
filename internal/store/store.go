// Package store keeps xlb's desired state durable on local disk in an
// embedded bbolt database: one key per farm, so a change writes only the farms
// it touches, and every write is fsynced before the engine acknowledges it.
// The daemon puts a Journal in front of the bbolt file (journal.go): a change
// costs one fdatasync of an appended record instead of bbolt's two.
//
// With each change the store also keeps what undoes it (the previous version
// of every farm it touched). The engine writes the disk while the kernel
// applies the same change, so a crash can leave a change on disk whose kernel
// outcome nobody saw; if the kernel then refuses the saved state at start,
// the engine takes that last change back with UndoLast instead of failing to
// start.
package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

var (
	farmsBucket = []byte("farms")
	metaBucket  = []byte("meta")
	// undoKey holds the undo of the last Commit (see encodeUndo).
	undoKey = []byte("undo-last")
)

// Store is the durable copy of the desired state.
type Store interface {
	// Load returns every saved farm.
	Load(ctx context.Context) ([]model.Farm, error)
	// Commit writes a diff to disk atomically (all of it or none of
	// it). (The data plane "applies" a diff to the kernel; the store
	// "commits" it.)
	Commit(ctx context.Context, d plan.Diff) error
	Close() error
}

// Undoer is a Store that remembers the undo of its last Commit. The undo is
// only as good as the Old farms of the diffs given to Commit (the engine's
// diffs carry them; a store that merges diffs, like the Kubernetes proxy's
// write-behind, must not offer UndoLast).
type Undoer interface {
	// Revert takes back d, the diff of the last Commit, and forgets it: the
	// kernel refused d after the disk had taken it.
	Revert(ctx context.Context, d plan.Diff) error
	// UndoLast takes back the last Commit (or CommitChange) if it is still
	// remembered and returns the names of the farms it restored, and of
	// the tables as "table NAME" and the unused addresses as "address NAME" (none if there was nothing to take back).
	UndoLast(ctx context.Context) ([]string, error)
}

// Bolt is a Store in a bbolt file.
type Bolt struct {
	db  *bolt.DB
	dir string // the state directory
}

// FileName is the database's name inside the state directory.
const FileName = "xlb.db"

// initialMmapSize is bbolt's first mapping of the state file: 256 MiB of
// address space, room for a state of about a million farms of one backend.
const initialMmapSize = 256 << 20

// OpenBolt opens (creating if needed) the state database in dir, and
// brings it up to date (migrate).
func OpenBolt(dir string) (*Bolt, error) {
	s, err := openBolt(dir)
	if err == nil {
		if err = s.migrate(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, err
}

func openBolt(dir string) (*Bolt, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir %q: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	// The timeout turns "another xlb daemon holds this state dir" into an
	// error instead of a hang.
	//
	// InitialMmapSize reserves address space (not memory) for the file to
	// grow into: bbolt copies every node a transaction holds off the old
	// mapping each time the file outgrows it (node.dereference), which was
	// 30 % of a 16,000-farm restore's disk phase.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, InitialMmapSize: initialMmapSize})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("open state %q: locked by another process (is another xlb daemon using this --state-dir?)", path)
		}
		return nil, fmt.Errorf("open state %q: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(farmsBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(metaBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("init state %q: %w", path, err)
	}
	return &Bolt{db: db, dir: dir}, nil
}

// Load implements Store.
func (s *Bolt) Load(ctx context.Context) ([]model.Farm, error) {
	var farms []model.Farm
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(farmsBucket).ForEach(func(k, v []byte) error {
			// Not validated: the engine does that, and reports a saved
			// farm that no longer validates instead of refusing it.
			fs, err := model.DecodeFarmsUnchecked(v)
			if err != nil {
				return fmt.Errorf("saved farm %q: %w", k, err)
			}
			farms = append(farms, fs...)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	return farms, nil
}

// Commit implements Store. The same transaction records the undo of d.
func (s *Bolt) Commit(ctx context.Context, d plan.Diff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := writeDiff(tx, d); err != nil {
			return err
		}
		if err := clearTableUndo(tx); err != nil {
			return err
		}
		return tx.Bucket(metaBucket).Put(undoKey, encodeUndo(d))
	}); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// Revert implements Undoer.
func (s *Bolt) Revert(ctx context.Context, d plan.Diff) error {
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := writeDiff(tx, d.Inverse()); err != nil {
			return err
		}
		return tx.Bucket(metaBucket).Delete(undoKey)
	}); err != nil {
		return fmt.Errorf("save state: take back a change the kernel refused: %w", err)
	}
	return nil
}

// UndoLast implements Undoer. It takes back the last change's tables too
// (their names are returned as "table NAME").
func (s *Bolt) UndoLast(ctx context.Context) ([]string, error) {
	var names []string
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		names, err = undoLast(tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("take back the last saved change: %w", err)
	}
	return names, nil
}

// undoLast applies and forgets the kept undo of the last change.
func undoLast(tx *bolt.Tx) ([]string, error) {
	var names []string
	meta := tx.Bucket(metaBucket)
	if tundo := meta.Get(undoTablesKey); len(tundo) > 0 {
		ops := append([]byte(nil), tundo...)
		if err := eachOp(ops, func(o tableOp) error {
			if o.op == opPutMeta || o.op == opDelMeta {
				names = append(names, "table "+string(o.name))
			}
			if o.op == opPutAddr || o.op == opDelAddr {
				names = append(names, "address "+string(o.name))
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if err := applyTableOps(tx, ops); err != nil {
			return nil, err
		}
	}
	if err := clearTableUndo(tx); err != nil {
		return nil, err
	}
	raw := meta.Get(undoKey)
	if raw == nil {
		return names, nil
	}
	farms := tx.Bucket(farmsBucket)
	err := decodeUndo(raw, func(name string, old []byte) error {
		names = append(names, name)
		if old == nil {
			return farms.Delete([]byte(name))
		}
		return farms.Put([]byte(name), old)
	})
	if err != nil {
		return nil, err
	}
	return names, meta.Delete(undoKey)
}

// writeDiff puts d's farms into the farms bucket, in the order of their
// names: bbolt keeps a node's keys in a sorted slice, so a key put before
// others that are already there shifts them all; in name order each put
// appends. A restore of 16,000 farms in the order of its file spent half
// its disk time shifting (BenchmarkJournalBulk: 116 -> 57 ms). The sort is
// stable, so the operations of one name keep their order.
func writeDiff(tx *bolt.Tx, d plan.Diff) error {
	type op struct {
		name string
		farm *model.Farm // nil: delete
	}
	ops := make([]op, 0, len(d.Changes))
	for _, c := range d.Changes {
		if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
			ops = append(ops, op{name: c.Old.Name})
		}
		if c.New != nil {
			ops = append(ops, op{name: c.New.Name, farm: c.New})
		}
	}
	slices.SortStableFunc(ops, func(a, b op) int { return strings.Compare(a.name, b.name) })
	b := tx.Bucket(farmsBucket)
	for _, o := range ops {
		var err error
		if o.farm == nil {
			err = b.Delete([]byte(o.name))
		} else {
			err = b.Put([]byte(o.name), o.farm.AppendJSON(nil))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// encodeUndo lists, for every farm name d touches, the farm as it was before
// d (or nothing if it did not exist): records of uvarint name length, name,
// uvarint (length of the old JSON + 1, 0 for "did not exist"), old JSON.
// A name touched twice keeps its first (oldest) version.
func encodeUndo(d plan.Diff) []byte { return appendUndo(nil, d) }

// appendUndo appends encodeUndo's list to buf.
func appendUndo(buf []byte, d plan.Diff) []byte {
	seen := make(map[string]bool, 2*len(d.Changes))
	rec := func(name string, old *model.Farm) {
		if !seen[name] {
			seen[name] = true
			buf = appendFarmEntry(buf, name, old)
		}
	}
	for _, c := range d.Changes {
		if c.Old != nil {
			rec(c.Old.Name, c.Old)
		}
		if c.New != nil {
			rec(c.New.Name, nil)
		}
	}
	return buf
}

// appendFarmEntry appends one record of encodeUndo's layout: uvarint name
// length, name, uvarint (length of f's JSON + 1, 0 when f is nil: no
// farm), f's JSON, appended straight from the farm (its cached encoding
// once sealed) rather than copied out first.
func appendFarmEntry(buf []byte, name string, f *model.Farm) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(name)))
	buf = append(buf, name...)
	if f == nil {
		return binary.AppendUvarint(buf, 0)
	}
	buf = binary.AppendUvarint(buf, uint64(f.JSONLen())+1)
	return f.AppendJSON(buf)
}

// farmEntrySize is the length of what appendFarmEntry appends.
func farmEntrySize(name string, f *model.Farm) int {
	n := uvarintLen(uint64(len(name))) + len(name)
	if f == nil {
		return n + 1
	}
	v := f.JSONLen()
	return n + uvarintLen(uint64(v)+1) + v
}

func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// decodeUndo calls fn for each record of encodeUndo's output; old is nil for
// a farm that did not exist.
func decodeUndo(raw []byte, fn func(name string, old []byte) error) error {
	for len(raw) > 0 {
		n, k := binary.Uvarint(raw)
		if k <= 0 || uint64(len(raw)-k) < n {
			return errors.New("undo record is corrupt")
		}
		name := string(raw[k : k+int(n)])
		raw = raw[k+int(n):]
		m, k := binary.Uvarint(raw)
		if k <= 0 || m > 0 && uint64(len(raw)-k) < m-1 {
			return errors.New("undo record is corrupt")
		}
		raw = raw[k:]
		var old []byte
		if m > 0 {
			old = append([]byte(nil), raw[:m-1]...)
			raw = raw[m-1:]
		}
		if err := fn(name, old); err != nil {
			return err
		}
	}
	return nil
}

// Close implements Store.
func (s *Bolt) Close() error { return s.db.Close() }
