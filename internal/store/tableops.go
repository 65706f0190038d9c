package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Table changes as operations on the store's buckets, so the journal can
// carry them (redo) and the store can take the last one back (undo) as it
// does farms. An operation list is a sequence of:
//
//	opPutMeta   name, value      tables[name] = value (encodeTableMeta)
//	opDelMeta   name             delete tables[name]
//	opNewSlot   slot             slots[slot] = an empty bucket (replacing any)
//	opDropSlot  slot             delete slots[slot]
//	opPutEntry  slot, key, value slots[slot][key] = value (appendEntryValue)
//	opDelEntry  slot, key        delete slots[slot][key]
//	opBackSlot  slot             slots[slot] = the bucket undoSlots[slot]
//	                             (a slot the last change freed, kept aside
//	                             so its undo costs O(1))
//	opPutAddr   name, value      addresses[name] = value (addresses.go)
//	opDelAddr   name             delete addresses[name]
//
// names, keys and values are uvarint length then bytes; slots are uvarints.
const (
	opPutMeta byte = iota + 1
	opDelMeta
	opNewSlot
	opDropSlot
	opPutEntry
	opDelEntry
	opBackSlot
	opPutAddr
	opDelAddr
)

// undoSlotsBucket holds the slots the last saved change freed, under their
// own numbers, until the next change: UndoLast moves them back.
var undoSlotsBucket = []byte("undo-slots")

// undoTablesKey (in the meta bucket) holds the undo of the last saved
// change's tables, as an operation list.
var undoTablesKey = []byte("undo-tables")

// journalTableEntries bounds the entries a change may write for the
// journal to carry it; a larger one goes to the bbolt file directly (its
// record would pass bigRecord anyway).
const journalTableEntries = 4096

type opWriter struct{ b, tmp []byte }

func (w *opWriter) bytes(v []byte) {
	w.b = binary.AppendUvarint(w.b, uint64(len(v)))
	w.b = append(w.b, v...)
}
func (w *opWriter) str(v string) {
	w.b = binary.AppendUvarint(w.b, uint64(len(v)))
	w.b = append(w.b, v...)
}
func (w *opWriter) num(v uint32) { w.b = binary.AppendUvarint(w.b, uint64(v)) }

func (w *opWriter) putMeta(t *model.Table) {
	w.b = append(w.b, opPutMeta)
	w.str(t.Name)
	w.bytes(encodeTableMeta(t))
}

func (w *opWriter) delMeta(name string) { w.b = append(w.b, opDelMeta); w.str(name) }
func (w *opWriter) slotOp(op byte, slot uint32) {
	w.b = append(w.b, op)
	w.num(slot)
}

func (w *opWriter) putEntry(slot uint32, t *model.Table, e model.TableEntry) {
	w.slotOp(opPutEntry, slot)
	w.str(string(e.Key))
	w.tmp = appendEntryValue(w.tmp[:0], t, e)
	w.bytes(w.tmp)
}

func (w *opWriter) delEntry(slot uint32, key model.TableKey) {
	w.slotOp(opDelEntry, slot)
	w.str(string(key))
}

// tableChangeEntries is how many entries a change writes to disk.
func tableChangeEntries(d plan.TableDiff) int {
	n := 0
	for _, c := range d.Slots {
		n += c.Entries()
	}
	return n
}

// encodeTableRedo is d as operations (what writeTables does).
func encodeTableRedo(d plan.TableDiff) []byte {
	var w opWriter
	for _, c := range d.Tables {
		if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
			w.delMeta(c.Old.Name)
		}
		if c.New != nil {
			w.putMeta(c.New)
		}
	}
	for _, c := range d.Slots {
		switch {
		case c.New == nil:
			w.slotOp(opDropSlot, c.Slot)
		case c.Old == nil:
			w.slotOp(opNewSlot, c.Slot)
			c.New.Entries("", func(e model.TableEntry) bool { w.putEntry(c.Slot, c.New, e); return true })
		default:
			for _, e := range c.Del {
				w.delEntry(c.Slot, e.Key)
			}
			for _, e := range c.Put {
				w.putEntry(c.Slot, c.New, e)
			}
		}
	}
	for _, c := range d.Addresses {
		w.addrOp(c.Old, c.New)
	}
	return w.b
}

// encodeTableUndo is what takes d back, as operations, from d alone (the
// journal's path: nothing is read from the bbolt file).
func encodeTableUndo(d plan.TableDiff) []byte {
	var w opWriter
	for i := len(d.Addresses) - 1; i >= 0; i-- {
		w.addrOp(d.Addresses[i].New, d.Addresses[i].Old)
	}
	for i := len(d.Slots) - 1; i >= 0; i-- {
		c := d.Slots[i]
		switch {
		case c.Old == nil:
			w.slotOp(opDropSlot, c.Slot)
		case c.New == nil:
			w.slotOp(opNewSlot, c.Slot)
			c.Old.Entries("", func(e model.TableEntry) bool { w.putEntry(c.Slot, c.Old, e); return true })
		default:
			replaced := make(map[model.TableKey]bool, len(c.Replaced))
			for _, e := range c.Replaced {
				replaced[e.Key] = true
				w.putEntry(c.Slot, c.Old, e)
			}
			for _, e := range c.Put {
				if !replaced[e.Key] {
					w.delEntry(c.Slot, e.Key)
				}
			}
			for _, e := range c.Del {
				w.putEntry(c.Slot, c.Old, e)
			}
		}
	}
	for i := len(d.Tables) - 1; i >= 0; i-- {
		c := d.Tables[i]
		if c.New != nil && (c.Old == nil || c.New.Name != c.Old.Name) {
			w.delMeta(c.New.Name)
		}
		if c.Old != nil {
			w.putMeta(c.Old)
		}
	}
	return w.b
}

// opReader walks an operation list.
type opReader struct {
	b   []byte
	err error
}

var errCorruptOps = errors.New("saved table change is corrupt")

func (r *opReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errCorruptOps
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *opReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil || uint64(len(r.b)) < n {
		r.err = errCorruptOps
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// tableOp is one decoded operation.
type tableOp struct {
	op        byte
	name, key []byte // name: of a table; key: of an entry
	slot      uint32
	val       []byte
}

// eachOp calls fn for each operation of ops in order.
func eachOp(ops []byte, fn func(o tableOp) error) error {
	r := opReader{b: ops}
	for len(r.b) > 0 {
		o := tableOp{op: r.b[0]}
		r.b = r.b[1:]
		switch o.op {
		case opPutMeta:
			o.name, o.val = r.bytes(), r.bytes()
		case opDelMeta, opDelAddr:
			o.name = r.bytes()
		case opPutAddr:
			o.name, o.val = r.bytes(), r.bytes()
		case opNewSlot, opDropSlot, opBackSlot:
			o.slot = uint32(r.uvarint())
		case opPutEntry:
			o.slot = uint32(r.uvarint())
			o.key, o.val = r.bytes(), r.bytes()
		case opDelEntry:
			o.slot = uint32(r.uvarint())
			o.key = r.bytes()
		default:
			return errCorruptOps
		}
		if r.err != nil {
			return r.err
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

// applyTableOps applies an operation list in a bbolt transaction.
func applyTableOps(tx *bolt.Tx, ops []byte) error {
	if len(ops) == 0 {
		return nil
	}
	tb, err := tx.CreateBucketIfNotExists(tablesBucket)
	if err != nil {
		return err
	}
	slots, err := tx.CreateBucketIfNotExists(slotsBucket)
	if err != nil {
		return err
	}
	var cur *bolt.Bucket // the slot bucket of the last entry op
	var curSlot uint32
	slot := func(n uint32) (*bolt.Bucket, error) {
		if cur != nil && curSlot == n {
			return cur, nil
		}
		b, err := slots.CreateBucketIfNotExists(slotKey(n))
		cur, curSlot = b, n
		return b, err
	}
	addrs, err := tx.CreateBucketIfNotExists(addressesBucket)
	if err != nil {
		return err
	}
	return eachOp(ops, func(o tableOp) error {
		switch o.op {
		case opPutAddr:
			return addrs.Put(o.name, o.val)
		case opDelAddr:
			return addrs.Delete(o.name)
		case opPutMeta:
			return tb.Put(o.name, o.val)
		case opDelMeta:
			return tb.Delete(o.name)
		case opNewSlot, opDropSlot, opBackSlot:
			cur = nil
			if err := slots.DeleteBucket(slotKey(o.slot)); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
				return err
			}
			switch o.op {
			case opNewSlot:
				_, err := slots.CreateBucket(slotKey(o.slot))
				return err
			case opBackSlot:
				aside := tx.Bucket(undoSlotsBucket)
				if aside == nil || aside.Bucket(slotKey(o.slot)) == nil {
					return fmt.Errorf("undo of table slot %d: its entries were not kept", o.slot)
				}
				return tx.MoveBucket(slotKey(o.slot), aside, slots)
			}
			return nil
		case opPutEntry:
			b, err := slot(o.slot)
			if err != nil {
				return err
			}
			return b.Put(o.key, o.val)
		case opDelEntry:
			b, err := slot(o.slot)
			if err != nil {
				return err
			}
			return b.Delete(o.key)
		}
		return errCorruptOps
	})
}

// clearTableUndo forgets the undo of the previous change's tables.
func clearTableUndo(tx *bolt.Tx) error {
	if err := tx.DeleteBucket(undoSlotsBucket); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
		return err
	}
	return tx.Bucket(metaBucket).Delete(undoTablesKey)
}

// writeTablesUndo is writeTables that also returns the exact undo, read
// from the file as it is overwritten: each definition's and entry's
// previous bytes, and freed slots moved aside whole (O(1) however large).
func writeTablesUndo(tx *bolt.Tx, d plan.TableDiff) ([]byte, error) {
	tb, err := tx.CreateBucketIfNotExists(tablesBucket)
	if err != nil {
		return nil, err
	}
	slots, err := tx.CreateBucketIfNotExists(slotsBucket)
	if err != nil {
		return nil, err
	}
	// undo is built forwards and applied backwards: ops are kept as
	// separate lists and reversed at the end.
	var undo [][]byte
	rec := func(fn func(w *opWriter)) {
		var w opWriter
		fn(&w)
		undo = append(undo, w.b)
	}
	meta := func(name string) {
		old := tb.Get([]byte(name))
		rec(func(w *opWriter) {
			if old == nil {
				w.delMeta(name)
				return
			}
			w.b = append(w.b, opPutMeta)
			w.str(name)
			w.bytes(old)
		})
	}
	for _, c := range d.Tables {
		if c.Old != nil && (c.New == nil || c.New.Name != c.Old.Name) {
			meta(c.Old.Name)
			if err := tb.Delete([]byte(c.Old.Name)); err != nil {
				return nil, err
			}
		}
		if c.New != nil {
			meta(c.New.Name)
			if err := tb.Put([]byte(c.New.Name), encodeTableMeta(c.New)); err != nil {
				return nil, err
			}
		}
	}
	if len(d.Addresses) > 0 {
		addrs, err := tx.CreateBucketIfNotExists(addressesBucket)
		if err != nil {
			return nil, err
		}
		for _, c := range d.Addresses {
			name := addressName(c)
			old := addrs.Get([]byte(name))
			rec(func(w *opWriter) {
				if old == nil {
					w.str2(opDelAddr, name)
					return
				}
				w.b = append(w.b, opPutAddr)
				w.str(name)
				w.bytes(old)
			})
			if err := putAddress(addrs, c); err != nil {
				return nil, err
			}
		}
	}
	for _, c := range d.Slots {
		key := slotKey(c.Slot)
		switch {
		case c.New == nil:
			if slots.Bucket(key) == nil {
				continue
			}
			aside, err := tx.CreateBucketIfNotExists(undoSlotsBucket)
			if err != nil {
				return nil, err
			}
			if err := aside.DeleteBucket(key); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
				return nil, err
			}
			if err := tx.MoveBucket(key, slots, aside); err != nil {
				return nil, err
			}
			rec(func(w *opWriter) { w.slotOp(opBackSlot, c.Slot) })
		case c.Old == nil:
			if err := writeTables(tx, plan.TableDiff{Slots: []plan.SlotChange{c}}); err != nil {
				return nil, err
			}
			rec(func(w *opWriter) { w.slotOp(opDropSlot, c.Slot) })
		default:
			b, err := slots.CreateBucketIfNotExists(key)
			if err != nil {
				return nil, err
			}
			entry := func(k model.TableKey) {
				old := b.Get([]byte(k))
				rec(func(w *opWriter) {
					if old == nil {
						w.delEntry(c.Slot, k)
						return
					}
					w.slotOp(opPutEntry, c.Slot)
					w.str(string(k))
					w.bytes(old)
				})
			}
			for _, e := range c.Del {
				entry(e.Key)
				if err := b.Delete([]byte(e.Key)); err != nil {
					return nil, err
				}
			}
			var arena valueArena
			for _, e := range c.Put {
				entry(e.Key)
				if err := b.Put([]byte(e.Key), arena.value(c.New, e)); err != nil {
					return nil, err
				}
			}
		}
	}
	n := 0
	for _, u := range undo {
		n += len(u)
	}
	out := make([]byte, 0, n)
	for i := len(undo) - 1; i >= 0; i-- {
		out = append(out, undo[i]...)
	}
	return out, nil
}

// memTables is the tables' buckets in memory: what a read-only state
// loads, the bbolt file's tables with the journal's records applied.
type memTables struct {
	metas map[string][]byte
	slots map[uint32]map[string][]byte
	addrs map[string][]byte // nil: not wanted
}

func (m *memTables) apply(ops []byte) error {
	return eachOp(ops, func(o tableOp) error {
		switch o.op {
		case opPutAddr:
			if m.addrs != nil {
				m.addrs[string(o.name)] = o.val
			}
		case opDelAddr:
			delete(m.addrs, string(o.name))
		case opPutMeta:
			m.metas[string(o.name)] = o.val
		case opDelMeta:
			delete(m.metas, string(o.name))
		case opNewSlot:
			m.slots[o.slot] = map[string][]byte{}
		case opDropSlot:
			delete(m.slots, o.slot)
		case opBackSlot:
			return fmt.Errorf("undo of table slot %d in a journal record", o.slot)
		case opPutEntry:
			if m.slots[o.slot] == nil {
				m.slots[o.slot] = map[string][]byte{}
			}
			m.slots[o.slot][string(o.key)] = o.val
		case opDelEntry:
			delete(m.slots[o.slot], string(o.key))
		}
		return nil
	})
}
