package model

import (
	"net/netip"

	"github.com/google/btree"
)

// entrySet holds a table's entries in a copy-on-write B-tree ordered by
// key. Why a B-tree: a published snapshot must not change, a change must
// cost O(changed) (not a copy of a million entries), and a million entries
// must fit in reasonable memory. google/btree's Clone is O(1) and lazy:
// the clone copies a node only when it writes into it, so adding k entries
// next to n copies O(k log n) nodes, and entries sit inline in the nodes'
// slices (32 bytes each plus the key's bytes), not one heap node per entry
// as in a radix tree (BenchmarkTableEntries measures both costs).
type entrySet struct {
	tree *btree.BTreeG[TableEntry] // nil: empty
	// lens counts an addr table's entries per family and prefix length,
	// so a most-specific lookup tries only the lengths present. Shared
	// between clones; copied before the first write (lensOwned).
	lens      *prefixLens
	lensOwned bool
	// expiring counts the entries with an expiry, so the engine's reaper
	// visits only tables that have some.
	expiring int
}

type prefixLens [2][129]uint32

// btreeDegree: nodes of up to 63 entries; measured against 16 and 128 in
// BenchmarkTableEntries (insert, clone-and-insert, lookup) it is close to
// the best of each.
const btreeDegree = 32

func lessEntry(a, b TableEntry) bool { return a.Key < b.Key }

func (s *entrySet) len() int {
	if s.tree == nil {
		return 0
	}
	return s.tree.Len()
}

// clone returns a set that shares everything with s until either writes.
func (s *entrySet) clone() entrySet {
	c := entrySet{lens: s.lens, expiring: s.expiring}
	if s.tree != nil {
		c.tree = s.tree.Clone()
	}
	return c
}

func (s *entrySet) get(k TableKey) (TableEntry, bool) {
	if s.tree == nil {
		return TableEntry{}, false
	}
	return s.tree.Get(TableEntry{Key: k})
}

// put inserts or replaces e and returns the entry it replaced.
func (s *entrySet) put(e TableEntry, addr bool) (TableEntry, bool) {
	if s.tree == nil {
		s.tree = btree.NewG(btreeDegree, lessEntry)
	}
	old, replaced := s.tree.ReplaceOrInsert(e)
	if !replaced && addr {
		s.countLen(e.Key, 1)
	}
	if e.Expires != 0 {
		s.expiring++
	}
	if replaced && old.Expires != 0 {
		s.expiring--
	}
	return old, replaced
}

// del removes the entry with key k and returns it.
func (s *entrySet) del(k TableKey, addr bool) (TableEntry, bool) {
	if s.tree == nil {
		return TableEntry{}, false
	}
	old, ok := s.tree.Delete(TableEntry{Key: k})
	if ok && addr {
		s.countLen(k, -1)
	}
	if ok && old.Expires != 0 {
		s.expiring--
	}
	return old, ok
}

func (s *entrySet) countLen(k TableKey, n int) {
	if !s.lensOwned {
		c := new(prefixLens)
		if s.lens != nil {
			*c = *s.lens
		}
		s.lens, s.lensOwned = c, true
	}
	fam := 0
	if k.Is6() {
		fam = 1
	}
	s.lens[fam][k[len(k)-1]] += uint32(n)
}

// ascend calls fn for each entry from key from (all if ""), in key order,
// until fn returns false.
func (s *entrySet) ascend(from TableKey, fn func(TableEntry) bool) {
	if s.tree == nil {
		return
	}
	if from == "" {
		s.tree.Ascend(fn)
		return
	}
	s.tree.AscendGreaterOrEqual(TableEntry{Key: from}, fn)
}

// Entry returns the entry with exactly that key.
func (t *Table) Entry(k TableKey) (TableEntry, bool) { return t.entries.get(k) }

// Entries calls fn for each entry in key order, starting at from ("" for
// the first), until fn returns false.
func (t *Table) Entries(from TableKey, fn func(TableEntry) bool) { t.entries.ascend(from, fn) }

// PutEntry inserts or replaces an entry and returns the one it replaced.
// Only for a table being built (the engine's working copy, made by Clone):
// a published table never changes.
func (t *Table) PutEntry(e TableEntry) (TableEntry, bool) {
	return t.entries.put(e, t.Type == TableAddr)
}

// DeleteEntry removes the entry with key k and returns it. Only for a table
// being built, like PutEntry.
func (t *Table) DeleteEntry(k TableKey) (TableEntry, bool) {
	return t.entries.del(k, t.Type == TableAddr)
}

// ClearEntries removes every entry (flush). Only for a table being built.
func (t *Table) ClearEntries() { t.entries = entrySet{} }

// Expiring reports how many entries have an expiry.
func (t *Table) Expiring() int { return t.entries.expiring }

// LookupAddr returns the most specific entry of an addr table that holds a
// (ipfw's table lookup): it tries the prefix lengths the table has, longest
// first, so a lookup costs one B-tree search per distinct length.
func (t *Table) LookupAddr(a netip.Addr) (TableEntry, bool) {
	if t.Type != TableAddr || t.entries.lens == nil {
		return TableEntry{}, false
	}
	a = a.Unmap()
	fam := 0
	if a.Is6() {
		fam = 1
	}
	lens := &t.entries.lens[fam]
	for bits := a.BitLen(); bits >= 0; bits-- {
		if lens[bits] == 0 {
			continue
		}
		p, _ := a.Prefix(bits)
		if e, ok := t.entries.get(AddrKey(p)); ok {
			return e, true
		}
	}
	return TableEntry{}, false
}

// Lookup finds the entry a key as text selects: for an addr table the most
// specific prefix holding the address, for the others the exact key.
func (t *Table) Lookup(text string) (TableEntry, bool, error) {
	if t.Type == TableAddr {
		a, err := netip.ParseAddr(text)
		if err != nil {
			return TableEntry{}, false, &FieldError{Object: tableObject(t.Name), Field: "key", Value: text,
				Problem: "a lookup in an addr table takes one IPv4 or IPv6 address"}
		}
		e, ok := t.LookupAddr(a)
		return e, ok, nil
	}
	k, err := t.ParseKey(text)
	if err != nil {
		return TableEntry{}, false, &FieldError{Object: tableObject(t.Name), Field: "key", Value: text, Problem: err.Error()}
	}
	e, ok := t.entries.get(k)
	return e, ok, nil
}

// MemoryEstimate is about how many bytes of the daemon's memory the
// entries take: the B-tree's share per entry (measured with
// BenchmarkTableEntries: 57-69 bytes an addr entry) plus the keys' and
// values' own bytes.
func (t *Table) MemoryEstimate() int {
	per := 48
	if t.Values != 0 {
		per += 64
	}
	if t.entries.tree == nil {
		return 0
	}
	keyLen := 0
	if e, ok := t.entries.tree.Min(); ok {
		keyLen = len(e.Key)
	}
	return t.Len() * (per + (keyLen+7)/8*8)
}
