package ebpf

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/model"
)

// ReconcileTables implements dataplane.TablePlane. The tries a restarted
// daemon finds in the arrays of maps are adopted (their names say their
// slot) and brought to the saved entries in place: a missing entry is
// added, an extra one removed, a changed value rewritten with its counters
// kept. Packets keep being filtered all along, the table never empty. A
// slot without tries gets new ones, filled before anything is bound to
// them. Then every table id is bound to its slot (one batch over all ids,
// which unbinds those no table has), farms' policies are written, and
// tries and policy keys no table or farm owns are removed. It costs
// O(entries): every trie is read once.
func (p *Plane) ReconcileTables(ctx context.Context, tables []*model.Table, farms []*model.Farm) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &p.tbls
	// The pinned generation (an earlier daemon's): no cached pass is
	// trusted while the kernel is being brought to the saved tables, and
	// the next generation is one no entry holds.
	var conf uint32
	if err := p.objs.XlbTblConf.Lookup(uint32(0), &conf); err != nil {
		return fmt.Errorf("read policy flags: %w", err)
	}
	old := (conf >> tblGenShift) & tblGenMax
	t.gen = 0
	// Services' policy ids an earlier daemon stamped are not trusted once
	// this one writes its conf: they are written again at the end.
	t.refs = ((conf>>tblRefsShift)&tblRefsMax)%tblRefsMax + 1
	for _, s := range t.slots {
		s.close()
	}
	for _, s := range t.hslots {
		s.m.Close()
	}
	t.reset()
	found, err := p.placedTries()
	if err != nil {
		return err
	}
	for _, s := range found {
		t.idx.next = max(t.idx.next, s.idx+1)
	}
	// The hashes of number, mac and flow tables are made anew (filled
	// before they are bound); the earlier ones go once nothing is bound
	// to them.
	oldHash, err := placedIndices(p.objs.XlbTblHash)
	if err != nil {
		return err
	}
	for _, i := range oldHash {
		t.idx.next = max(t.idx.next, i+1)
	}
	kept := map[uint32]bool{} // indices of adopted slots
	defer func() {
		for _, s := range found {
			if !kept[s.idx] {
				s.close()
			}
		}
	}()
	// Indices in use but not adopted are free once their tries are
	// taken out (below); new slots take indices above them all.
	binds := make([]xlbTblBind, maxTables)
	for _, tb := range tables {
		if err := ctx.Err(); err != nil {
			return err
		}
		t.tables[tb.Name] = tb
		t.byID[tb.ID] = tb
		if hasHash(tb) {
			hs, err := p.fillHashSlot(tb)
			if err != nil {
				return err
			}
			t.hslots[tb.Slot] = hs
			binds[tb.ID] = p.binding(tb)
			continue
		}
		if tb.Type != model.TableAddr {
			continue
		}
		s := found[tb.Slot]
		if s != nil {
			if err := p.syncSlot(s, tb); err != nil {
				return fmt.Errorf("table %q: %w", tb.Name, err)
			}
			kept[s.idx] = true
		} else {
			if s, err = p.newSlot(tb.Slot); err != nil {
				return err
			}
			if err := p.putEntries(s, func(fn func(model.TableEntry) bool) { tb.Entries("", fn) }, false); err != nil {
				p.freeSlot(s)
				return fmt.Errorf("table %q: %w", tb.Name, err)
			}
		}
		t.slots[tb.Slot] = s
		binds[tb.ID] = p.binding(tb)
	}
	ids := make([]uint32, maxTables)
	for i := range ids {
		ids[i] = uint32(i)
	}
	if err := p.bind(ids, binds); err != nil {
		return err
	}
	for _, i := range oldHash {
		if usedIndex(t.slots, i) || usedHashIndex(t.hslots, i) {
			continue
		}
		if err := p.objs.XlbTblHash.Delete(i); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove earlier hash at slot index %d: %w", i, err)
		}
	}
	// Farms' policies.
	stale := map[xlbSvcKey]bool{}
	{
		var k xlbSvcKey
		var v xlbTblPolicy
		it := p.objs.XlbTblPolicy.Iterate()
		for it.Next(&k, &v) {
			stale[k] = true
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read farms' policies: %w", err)
		}
	}
	for _, f := range farms {
		if len(f.Policies) == 0 {
			continue
		}
		t.farms[f.Name] = f
		if err := p.writeFarmPolicies(f, t.tables, false); err != nil {
			return err
		}
		for _, k := range policyKeys(f) {
			delete(stale, k)
		}
	}
	if err := p.reconcileSources(farms, t.tables); err != nil {
		return err
	}
	if err := p.writeConf(); err != nil {
		return err
	}
	for k := range stale {
		if err := p.objs.XlbTblPolicy.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove stale policies: %w", err)
		}
	}
	// Tries no table is bound to any more (nothing refers to their
	// indices now).
	for _, outer := range []*ebpf.Map{p.objs.XlbTblAddr4, p.objs.XlbTblAddr6} {
		idxs, err := placedIndices(outer)
		if err != nil {
			return err
		}
		for _, i := range idxs {
			if kept[i] || usedIndex(t.slots, i) {
				continue
			}
			if err := outer.Delete(i); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("remove stray trie at slot index %d: %w", i, err)
			}
		}
	}
	for i := uint32(1); i < t.idx.next; i++ {
		if !usedIndex(t.slots, i) && !usedHashIndex(t.hslots, i) {
			t.idx.put(i)
		}
	}
	if old == 0 || old >= tblGenMax {
		if err := p.restartGen(); err != nil {
			return err
		}
	} else {
		t.gen = old + 1
		if err := p.writeConf(); err != nil {
			return err
		}
	}
	return p.restampServices()
}

func usedHashIndex(slots map[uint32]*hSlot, i uint32) bool {
	for _, s := range slots {
		if s.idx == i {
			return true
		}
	}
	return false
}

func usedIndex(slots map[uint32]*tblSlot, i uint32) bool {
	for _, s := range slots {
		if s.idx == i {
			return true
		}
	}
	return false
}

// placedTries opens the tries in the arrays of maps, by the slot their
// names give; a slot is found only with both tries at one index.
func (p *Plane) placedTries() (map[uint32]*tblSlot, error) {
	byIdx := map[uint32]*tblSlot{}
	names := map[uint32]uint32{} // index -> slot
	closeAll := func() {
		for _, s := range byIdx {
			s.close()
		}
	}
	for _, v6 := range []bool{false, true} {
		outer := p.objs.XlbTblAddr4
		if v6 {
			outer = p.objs.XlbTblAddr6
		}
		idxs, err := placedIndices(outer)
		if err != nil {
			closeAll()
			return nil, err
		}
		for _, idx := range idxs {
			var m *ebpf.Map
			if err := outer.Lookup(idx, &m); err != nil {
				if errors.Is(err, ebpf.ErrKeyNotExist) {
					continue // taken out since the batch read
				}
				closeAll()
				return nil, fmt.Errorf("read table slot %d: %w", idx, err)
			}
			info, err := m.Info()
			slot, ok := uint32(0), false
			if err == nil {
				slot, ok = trieSlot(info.Name, v6)
			}
			s := byIdx[idx]
			if !ok || (v6 && (s == nil || names[idx] != slot)) {
				m.Close() // not ours, or not a pair
				continue
			}
			if s == nil {
				s = &tblSlot{idx: idx}
				byIdx[idx] = s
				names[idx] = slot
			}
			if v6 {
				s.v6 = m
			} else {
				s.v4 = m
			}
		}
	}
	found := map[uint32]*tblSlot{}
	for idx, s := range byIdx {
		slot := names[idx]
		if s.v4 == nil || s.v6 == nil || found[slot] != nil {
			s.close()
			continue
		}
		found[slot] = s
	}
	return found, nil
}

// trieSlot reads the slot from a trie's name (trieName).
func trieSlot(name string, v6 bool) (uint32, bool) {
	prefix := "xt4_"
	if v6 {
		prefix = "xt6_"
	}
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 32)
	return uint32(n), err == nil
}

// placedIndices lists the indices of an array of maps that hold a trie.
// It reads the array in batches (the values are the inner maps' ids):
// iterating its 65,536 indices one lookup at a time took about 150 ms a
// map, which every drift repair and start paid twice per family, with no
// table at all (ReconcileTables: 580 ms, now a few ms).
func placedIndices(outer *ebpf.Map) ([]uint32, error) {
	var idxs []uint32
	keys := make([]uint32, 4096)
	ids := make([]uint32, len(keys))
	var c ebpf.MapBatchCursor
	for {
		n, err := outer.BatchLookup(&c, keys, ids, nil)
		idxs = append(idxs, keys[:n]...)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return idxs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read table slots: %w", err)
		}
	}
}

// syncSlot brings an adopted slot's tries to a table's entries.
func (p *Plane) syncSlot(s *tblSlot, tb *model.Table) error {
	seen := make(map[model.TableKey]bool, tb.Len())
	var fix []model.TableEntry
	var extra []model.TableEntry
	check := func(k model.TableKey, v xlbTblVal) {
		e, ok := tb.Entry(k)
		if !ok {
			extra = append(extra, model.TableEntry{Key: k})
			return
		}
		seen[k] = true
		want := tblValue(e.Value)
		want.Packets, want.Bytes = v.Packets, v.Bytes
		if want != v {
			fix = append(fix, e)
		}
	}
	var k4 xlbTblKey4
	var k6 xlbTblKey6
	var v xlbTblVal
	it := s.v4.Iterate()
	for it.Next(&k4, &v) {
		check(model.AddrKey(key4Prefix(k4)), v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read trie: %w", err)
	}
	it = s.v6.Iterate()
	for it.Next(&k6, &v) {
		check(model.AddrKey(key6Prefix(k6)), v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read trie: %w", err)
	}
	if err := p.delEntries(s, extra); err != nil {
		return err
	}
	if err := p.putEntries(s, func(fn func(model.TableEntry) bool) {
		for _, e := range fix {
			if !fn(e) {
				return
			}
		}
	}, true); err != nil {
		return err
	}
	return p.putEntries(s, func(fn func(model.TableEntry) bool) {
		tb.Entries("", func(e model.TableEntry) bool {
			if seen[e.Key] {
				return true
			}
			return fn(e)
		})
	}, false)
}
