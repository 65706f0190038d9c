package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Tables on disk: bucket "tables" maps a table's name to its definition
// (uint16 ID, uint32 slot, then the table's JSON without entries); bucket
// "slots" holds one nested bucket per slot (its 4-byte big-endian number)
// mapping each entry's binary key to its expiry and value (entryValue). So
// adding k entries writes k keys, and a swap rewrites two definitions and
// no entry: the same O(changed) as in the kernel.
var (
	tablesBucket = []byte("tables")
	slotsBucket  = []byte("slots")
)

// TableStore is a Store that keeps named tables too.
type TableStore interface {
	// LoadTables returns every saved table with its entries.
	LoadTables(ctx context.Context) ([]*model.Table, error)
	// CommitTables saves the table and slot changes of d atomically (its
	// Farms are saved by Commit).
	CommitTables(ctx context.Context, d plan.TableDiff) error
}

var (
	_ TableStore = (*Bolt)(nil)
	_ TableStore = (*Journal)(nil)
)

// LoadTables implements TableStore.
func (s *Bolt) LoadTables(ctx context.Context) ([]*model.Table, error) {
	var out []*model.Table
	err := s.db.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(tablesBucket)
		if tb == nil {
			return nil
		}
		slots := tx.Bucket(slotsBucket)
		return tb.ForEach(func(k, v []byte) error {
			t, err := decodeTableMeta(v)
			if err != nil {
				return fmt.Errorf("saved table %q: %w", k, err)
			}
			var sb *bolt.Bucket
			if slots != nil {
				sb = slots.Bucket(slotKey(t.Slot))
			}
			if sb != nil {
				if err := sb.ForEach(func(ek, ev []byte) error {
					e, err := decodeEntry(t, ek, ev)
					if err != nil {
						return fmt.Errorf("saved table %q entry %q: %w", t.Name, t.FormatKey(model.TableKey(ek)), err)
					}
					t.PutEntry(e)
					return nil
				}); err != nil {
					return err
				}
			}
			out = append(out, t)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("load tables: %w", err)
	}
	return out, nil
}

// CommitTables implements TableStore.
func (s *Bolt) CommitTables(ctx context.Context, d plan.TableDiff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(d.Tables) == 0 && len(d.Slots) == 0 && len(d.Addresses) == 0 {
		return nil
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return writeTables(tx, d) }); err != nil {
		return fmt.Errorf("save tables: %w", err)
	}
	return nil
}

func writeTables(tx *bolt.Tx, d plan.TableDiff) error {
	if err := writeAddresses(tx, d); err != nil {
		return err
	}
	tb, err := tx.CreateBucketIfNotExists(tablesBucket)
	if err != nil {
		return err
	}
	slots, err := tx.CreateBucketIfNotExists(slotsBucket)
	if err != nil {
		return err
	}
	for _, c := range d.Tables {
		if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
			if err := tb.Delete([]byte(c.Old.Name)); err != nil {
				return err
			}
		}
		if c.New != nil {
			if err := tb.Put([]byte(c.New.Name), encodeTableMeta(c.New)); err != nil {
				return err
			}
		}
	}
	for _, c := range d.Slots {
		key := slotKey(c.Slot)
		switch {
		case c.New == nil:
			if err := slots.DeleteBucket(key); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
				return err
			}
		case c.Old == nil:
			if err := slots.DeleteBucket(key); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
				return err
			}
			b, err := slots.CreateBucket(key)
			if err != nil {
				return err
			}
			// Entries come in key order: full pages, no splits half
			// way.
			b.FillPercent = 1.0
			var arena valueArena
			c.New.Entries("", func(e model.TableEntry) bool {
				err = b.Put([]byte(e.Key), arena.value(c.New, e))
				return err == nil
			})
			if err != nil {
				return err
			}
		default:
			b, err := slots.CreateBucketIfNotExists(key)
			if err != nil {
				return err
			}
			for _, e := range c.Del {
				if err := b.Delete([]byte(e.Key)); err != nil {
					return err
				}
			}
			var arena valueArena
			for _, e := range c.Put {
				if err := b.Put([]byte(e.Key), arena.value(c.New, e)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// valueArena hands out encoded values that stay valid until the
// transaction commits, as bbolt requires of what Put is given, without an
// allocation per entry: values are appended to one buffer, and a buffer
// that is outgrown is left to the values already in it.
type valueArena struct{ buf []byte }

func (a *valueArena) value(t *model.Table, e model.TableEntry) []byte {
	if cap(a.buf)-len(a.buf) < 64 {
		a.buf = make([]byte, 0, 64<<10)
	}
	start := len(a.buf)
	a.buf = appendEntryValue(a.buf, t, e)
	return a.buf[start:len(a.buf):len(a.buf)]
}

func slotKey(slot uint32) []byte { return binary.BigEndian.AppendUint32(nil, slot) }

func encodeTableMeta(t *model.Table) []byte {
	b := binary.BigEndian.AppendUint16(nil, t.ID)
	b = binary.BigEndian.AppendUint32(b, t.Slot)
	return t.AppendJSON(b, model.VocabTables, false, 0, 0)
}

func decodeTableMeta(v []byte) (*model.Table, error) {
	if len(v) < 6 {
		return nil, errors.New("definition is corrupt")
	}
	none := func(string) (*model.Table, bool) { return nil, false }
	tds, err := model.DecodeTables(v[6:], none, model.VocabTables)
	if err != nil {
		return nil, err
	}
	t := tds[0].Table
	t.ID = binary.BigEndian.Uint16(v)
	t.Slot = binary.BigEndian.Uint32(v[2:])
	return &t, nil
}

// appendEntryValue encodes an entry's expiry and value: uvarint expiry
// (0: never), then the fields of the table's valtype in order (numbers as
// uvarints, names as uvarint length and bytes).
func appendEntryValue(b []byte, t *model.Table, e model.TableEntry) []byte {
	b = binary.AppendUvarint(b, uint64(e.Expires))
	if t.Values == 0 {
		return b
	}
	v := e.Value
	if v == nil {
		v = &model.TableValue{}
	}
	if t.Values&model.ValMark != 0 {
		b = binary.AppendUvarint(b, uint64(v.Mark))
	}
	if t.Values&model.ValFarm != 0 {
		b = binary.AppendUvarint(b, uint64(len(v.Farm)))
		b = append(b, v.Farm...)
	}
	if t.Values&model.ValBackend != 0 {
		b = binary.AppendUvarint(b, uint64(len(v.Backend)))
		b = append(b, v.Backend...)
	}
	if t.Values&model.ValLimit != 0 {
		b = binary.AppendUvarint(b, uint64(v.Limit))
	}
	if t.Values&model.ValDSCP != 0 {
		b = append(b, v.DSCP)
	}
	if t.Values&model.ValTag != 0 {
		b = binary.AppendUvarint(b, uint64(v.Tag))
	}
	return b
}

func decodeEntry(t *model.Table, k, b []byte) (model.TableEntry, error) {
	e := model.TableEntry{Key: model.TableKey(k)}
	corrupt := errors.New("saved value is corrupt")
	num := func() (uint64, bool) {
		n, m := binary.Uvarint(b)
		if m <= 0 {
			return 0, false
		}
		b = b[m:]
		return n, true
	}
	str := func() (string, bool) {
		n, ok := num()
		if !ok || uint64(len(b)) < n {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	exp, ok := num()
	if !ok {
		return e, corrupt
	}
	e.Expires = int64(exp)
	if t.Values == 0 {
		return e, nil
	}
	v := &model.TableValue{}
	var n uint64
	if t.Values&model.ValMark != 0 {
		if n, ok = num(); !ok {
			return e, corrupt
		}
		v.Mark = uint32(n)
	}
	if t.Values&model.ValFarm != 0 {
		if v.Farm, ok = str(); !ok {
			return e, corrupt
		}
	}
	if t.Values&model.ValBackend != 0 {
		if v.Backend, ok = str(); !ok {
			return e, corrupt
		}
	}
	if t.Values&model.ValLimit != 0 {
		if n, ok = num(); !ok {
			return e, corrupt
		}
		v.Limit = uint32(n)
	}
	if t.Values&model.ValDSCP != 0 {
		if len(b) < 1 {
			return e, corrupt
		}
		v.DSCP, b = b[0], b[1:]
	}
	if t.Values&model.ValTag != 0 {
		if n, ok = num(); !ok {
			return e, corrupt
		}
		v.Tag = uint32(n)
	}
	e.Value = v
	return e, nil
}

// LoadTables implements TableStore.
func (j *Journal) LoadTables(ctx context.Context) ([]*model.Table, error) {
	if j.ro != nil {
		return j.loadTablesReadOnly(ctx)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return nil, fmt.Errorf("load tables: %w", err)
	}
	return j.db.LoadTables(ctx)
}

// CommitTables implements TableStore: the tables alone go to the bbolt
// file, with no undo (for stores in front of this one; the engine saves
// through CommitChange).
func (j *Journal) CommitTables(ctx context.Context, d plan.TableDiff) error {
	if j.ro != nil {
		return j.ro
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return fmt.Errorf("save tables: %w", err)
	}
	return j.db.CommitTables(ctx, d)
}

// ChangeStore is a Store that saves a change's farms and tables as one unit
// and keeps one undo for both (UndoLast takes back either).
type ChangeStore interface {
	// CommitChange writes d and td to disk atomically.
	CommitChange(ctx context.Context, d plan.Diff, td plan.TableDiff) error
	// RevertChange takes back d and td, the last CommitChange: the kernel
	// refused them after the disk had taken them.
	RevertChange(ctx context.Context, d plan.Diff, td plan.TableDiff) error
}

var (
	_ ChangeStore = (*Bolt)(nil)
	_ ChangeStore = (*Journal)(nil)
)

// CommitChange implements ChangeStore: one bbolt transaction, with the
// exact undo read from the file as it is overwritten.
func (s *Bolt) CommitChange(ctx context.Context, d plan.Diff, td plan.TableDiff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := clearTableUndo(tx); err != nil {
			return err
		}
		tundo, err := writeTablesUndo(tx, td)
		if err != nil {
			return err
		}
		if err := writeDiff(tx, d); err != nil {
			return err
		}
		meta := tx.Bucket(metaBucket)
		if len(tundo) > 0 {
			if err := meta.Put(undoTablesKey, tundo); err != nil {
				return err
			}
		}
		return meta.Put(undoKey, encodeUndo(d))
	}); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// RevertChange implements ChangeStore: the undo kept is the change's.
func (s *Bolt) RevertChange(ctx context.Context, d plan.Diff, td plan.TableDiff) error {
	if _, err := s.UndoLast(ctx); err != nil {
		return fmt.Errorf("save state: take back a change the kernel refused: %w", err)
	}
	return nil
}

// CommitChange implements ChangeStore. A change of at most
// journalTableEntries entries is one journal record (one fdatasync, as a
// farm change); a larger one, or a bulk change, folds the journal and goes
// to the bbolt file.
func (j *Journal) CommitChange(ctx context.Context, d plan.Diff, td plan.TableDiff) error {
	if len(td.Tables)+len(td.Slots)+len(td.Addresses) == 0 {
		return j.Commit(ctx, d)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if j.ro != nil {
		return j.ro
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	direct := func() error {
		if err := j.fold(); err != nil {
			return fmt.Errorf("save state: %w", err)
		}
		return j.db.CommitChange(ctx, d, td)
	}
	if len(d.Changes) > bulkChanges || tableChangeEntries(td) > journalTableEntries {
		return direct()
	}
	rec := encodeTableRecord(d, td)
	if int64(len(rec)) > j.bigRecord {
		return direct()
	}
	if j.size+int64(len(rec)) > j.foldAt {
		if err := j.fold(); err != nil {
			return fmt.Errorf("save state: %w", err)
		}
	}
	return j.append(rec)
}

// RevertChange implements ChangeStore.
func (j *Journal) RevertChange(ctx context.Context, d plan.Diff, td plan.TableDiff) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fold(); err != nil {
		return fmt.Errorf("save state: take back a change the kernel refused: %w", err)
	}
	return j.db.RevertChange(ctx, d, td)
}

// loadTablesReadOnly is LoadTables of a read-only state: the bbolt file's
// tables with the journal's records applied in memory.
func (j *Journal) loadTablesReadOnly(ctx context.Context) ([]*model.Table, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	m := memTables{metas: map[string][]byte{}, slots: map[uint32]map[string][]byte{}}
	if j.db != nil {
		err := j.db.db.View(func(tx *bolt.Tx) error {
			if tb := tx.Bucket(tablesBucket); tb != nil {
				if err := tb.ForEach(func(k, v []byte) error { m.metas[string(k)] = bytes.Clone(v); return nil }); err != nil {
					return err
				}
			}
			slots := tx.Bucket(slotsBucket)
			if slots == nil {
				return nil
			}
			return slots.ForEachBucket(func(k []byte) error {
				if len(k) != 4 {
					return nil
				}
				es := map[string][]byte{}
				m.slots[binary.BigEndian.Uint32(k)] = es
				return slots.Bucket(k).ForEach(func(ek, ev []byte) error { es[string(ek)] = bytes.Clone(ev); return nil })
			})
		})
		if err != nil {
			return nil, fmt.Errorf("load tables: %w", err)
		}
	}
	if j.f != nil {
		buf, err := io.ReadAll(io.NewSectionReader(j.f, 0, 1<<62))
		if err != nil {
			return nil, fmt.Errorf("load tables: read journal: %w", err)
		}
		for _, r := range validRecords(buf) {
			_, _, tredo, _, err := r.split()
			if err == nil {
				err = m.apply(tredo)
			}
			if err != nil {
				return nil, fmt.Errorf("load tables: replay journal: %w", err)
			}
		}
	}
	var out []*model.Table
	for name, v := range m.metas {
		t, err := decodeTableMeta(v)
		if err != nil {
			return nil, fmt.Errorf("saved table %q: %w", name, err)
		}
		for k, ev := range m.slots[t.Slot] {
			e, err := decodeEntry(t, []byte(k), ev)
			if err != nil {
				return nil, fmt.Errorf("saved table %q entry %q: %w", t.Name, t.FormatKey(model.TableKey(k)), err)
			}
			t.PutEntry(e)
		}
		out = append(out, t)
	}
	return out, ctx.Err()
}
