package ebpf

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// Policies over number, mac and flow tables (bpf/xlb_tables.h: tbl_hmatch).
// A slot of such a table is one hash (xh_<slot>, not preallocated) held at
// the slot's index in xlb_tbl_hash, keyed by struct tbl_hkey: the packet's
// source port (number), source Ethernet address (mac), or the flow fields
// the table has; the binding's flags tell the program the type and the
// fields, or the index of the packet's interface (iface: tables_iface.go).
//
// A restarted daemon makes these hashes anew (filled before they are bound,
// so filtering does not stop) and drops the earlier ones: their counters
// start again at zero, unlike the addr tables' tries, which are adopted.

const (
	tblTShift  = uint32(xlbXlbTblVerdictXLB_TBL_T_SHIFT)
	tblFFShift = uint32(xlbXlbTblVerdictXLB_TBL_FF_SHIFT)
	tblConfMAC = uint32(xlbXlbTblConfFlagXLB_TBL_CONF_MAC)
)

// hasHash reports whether a table's type is held in xlb_tbl_hash.
func hasHash(t *model.Table) bool {
	return t.Type == model.TableNumber || t.Type == model.TableMAC || t.Type == model.TableFlow ||
		t.Type == model.TableIface
}

// hashType is the binding's type bits of a table in xlb_tbl_hash.
func hashType(t *model.Table) uint32 {
	var typ uint32
	switch t.Type {
	case model.TableNumber:
		typ = uint32(xlbXlbTblTypeXLB_TBL_T_NUMBER)
	case model.TableMAC:
		typ = uint32(xlbXlbTblTypeXLB_TBL_T_MAC)
	case model.TableFlow:
		typ = uint32(xlbXlbTblTypeXLB_TBL_T_FLOW)
	case model.TableIface:
		typ = uint32(xlbXlbTblTypeXLB_TBL_T_IFACE)
	}
	return typ<<tblTShift | uint32(t.Flow)<<tblFFShift
}

// hSlot is one slot's hash and its index in xlb_tbl_hash.
type hSlot struct {
	idx uint32
	m   *ebpf.Map
	// ifaces: an iface table's interface names by the index each was
	// written under (syncIface).
	ifaces map[uint32]string
}

func hashName(slot uint32) string { return fmt.Sprintf("xh_%d", slot) }

// newHashSlot makes a slot's empty hash and puts it at a free index.
func (p *Plane) newHashSlot(slot uint32) (*hSlot, error) {
	spec := p.tbls.innerH.Copy()
	spec.Name = hashName(slot)
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("make hash %s: %w", spec.Name, err)
	}
	idx, err := p.tbls.idx.get()
	if err != nil {
		m.Close()
		return nil, err
	}
	s := &hSlot{idx: idx, m: m}
	if err := p.objs.XlbTblHash.Update(idx, m, ebpf.UpdateAny); err != nil {
		p.freeHashSlot(s)
		return nil, fmt.Errorf("put hash at slot index %d: %w", idx, err)
	}
	return s, nil
}

// freeHashSlot takes a slot's hash out of xlb_tbl_hash and releases its
// index.
func (p *Plane) freeHashSlot(s *hSlot) {
	if err := p.objs.XlbTblHash.Delete(s.idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		p.log.Error("free table slot", "index", s.idx, "err", err)
	}
	s.m.Close()
	p.tbls.idx.put(s.idx)
}

// hashKey is an entry's key in its slot's hash; ok is false for a key no
// packet can match (a number past 65535), and for an iface table's (its
// keys are the interfaces' indexes: syncIface).
func hashKey(t *model.Table, k model.TableKey) (xlbTblHkey, bool) {
	var h xlbTblHkey
	switch t.Type {
	case model.TableNumber:
		n := k.Number()
		if n > 0xffff {
			return h, false
		}
		h.Sport = ne16(uint16(n))
	case model.TableMAC:
		copy(h.Mac[:], k)
	case model.TableFlow:
		f := k.Flow(t.Flow)
		if t.Flow&model.FlowSrcIP != 0 {
			h.Src, h.Family = addrWords(f.SrcIP), familyOf(f.SrcIP)
		}
		if t.Flow&model.FlowDstIP != 0 {
			h.Dst, h.Family = addrWords(f.DstIP), familyOf(f.DstIP)
		}
		if t.Flow&model.FlowProto != 0 {
			h.Proto = f.Proto
		}
		if t.Flow&model.FlowSrcPort != 0 {
			h.Sport = ne16(f.SrcPort)
		}
		if t.Flow&model.FlowDstPort != 0 {
			h.Dport = ne16(f.DstPort)
		}
	default:
		return h, false
	}
	return h, true
}

// keyOfHash turns a hash key back into the entry's key (the counters).
func keyOfHash(t *model.Table, h xlbTblHkey) model.TableKey {
	switch t.Type {
	case model.TableNumber:
		return model.NumberKey(uint32(be16(h.Sport)))
	case model.TableMAC:
		return model.TableKey(h.Mac[:])
	}
	var f model.FlowKey
	fam := h.Family
	addr := func(w [4]uint32) netip.Addr { return wordsAddr(w, fam) }
	if t.Flow&model.FlowSrcIP != 0 {
		f.SrcIP = addr(h.Src)
	}
	if t.Flow&model.FlowDstIP != 0 {
		f.DstIP = addr(h.Dst)
	}
	f.Proto, f.SrcPort, f.DstPort = h.Proto, be16(h.Sport), be16(h.Dport)
	return f.Key(t.Flow)
}

// putHash writes entries into a slot's hash (values over existing ones
// keep their counters when keep is set).
func (p *Plane) putHash(s *hSlot, t *model.Table, entries []model.TableEntry, keep bool) error {
	if t.Type == model.TableIface {
		return errors.New("an iface table's hash is written whole (syncIface)")
	}
	var keys []xlbTblHkey
	var vals []xlbTblVal
	for _, e := range entries {
		k, ok := hashKey(t, e.Key)
		if !ok {
			continue
		}
		v := tblValue(e.Value)
		if keep {
			var old xlbTblVal
			if err := s.m.Lookup(k, &old); err == nil {
				v.Packets, v.Bytes = old.Packets, old.Bytes
			}
		}
		keys, vals = append(keys, k), append(vals, v)
	}
	for len(keys) > 0 {
		n := min(len(keys), tblChunk)
		if _, err := s.m.BatchUpdate(keys[:n], vals[:n], nil); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				return fmt.Errorf("write %d entries into hash: %w", n, err)
			}
			for i := range n {
				if err := s.m.Update(keys[i], vals[i], ebpf.UpdateAny); err != nil {
					return fmt.Errorf("write entry into hash: %w", err)
				}
			}
		}
		keys, vals = keys[n:], vals[n:]
	}
	return nil
}

// delHash removes entries from a slot's hash (missing ones are no error).
func (p *Plane) delHash(s *hSlot, t *model.Table, entries []model.TableEntry) error {
	var keys []xlbTblHkey
	for _, e := range entries {
		if k, ok := hashKey(t, e.Key); ok {
			keys = append(keys, k)
		}
	}
	return batchDel(s.m, keys, &p.tbls.noBatch)
}

// hashCounters reads the counters of a hash slot's entries.
func hashCounters(s *hSlot, t *model.Table, out dataplane.TableCounters) error {
	var k xlbTblHkey
	var v xlbTblVal
	it := s.m.Iterate()
	for it.Next(&k, &v) {
		if v.Packets == 0 {
			continue
		}
		key := keyOfHash(t, k)
		if t.Type == model.TableIface {
			key = model.TableKey(s.ifaces[k.Src[0]])
		}
		out[key] = dataplane.EntryCounters{Packets: v.Packets, Bytes: v.Bytes}
	}
	return it.Err()
}

// fillHashSlot makes and fills a slot's hash for table t.
func (p *Plane) fillHashSlot(t *model.Table) (*hSlot, error) {
	s, err := p.newHashSlot(t.Slot)
	if err != nil {
		return nil, err
	}
	if t.Type == model.TableIface {
		if err := p.syncIfaceNow(s, t); err != nil {
			p.freeHashSlot(s)
			return nil, fmt.Errorf("table %q: %w", t.Name, err)
		}
		return s, nil
	}
	var all []model.TableEntry
	t.Entries("", func(e model.TableEntry) bool { all = append(all, e); return true })
	if err := p.putHash(s, t, all, false); err != nil {
		p.freeHashSlot(s)
		return nil, fmt.Errorf("table %q: %w", t.Name, err)
	}
	return s, nil
}

// macFarms reports whether a farm with policies uses a mac table (the
// program then loads packets' source MAC).
func (p *Plane) macFarms() bool {
	for _, f := range p.tbls.farms {
		for _, ref := range f.Policies {
			if t := p.tbls.tables[ref.Name]; t != nil && t.Type == model.TableMAC {
				return true
			}
		}
	}
	return false
}
