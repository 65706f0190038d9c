package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/xlb-lb/xlb/internal/model"
)

// Policies over iface tables (bpf/xlb_tables.h: tbl_hmatch,
// XLB_TBL_T_IFACE). The program matches the index of the interface a packet
// came in on; an iface table's entries are names, as ipfw's and nft's
// (`meta iifname @set`) are. So the loader resolves the names to indexes in
// the plane's namespace and keeps the slot's hash so as interfaces come, go
// and are renamed: the link watch calls syncIfaceTables on every link change
// (linksChanged). An entry whose interface is absent matches nothing until
// it appears, as on nft. The hash is written from the table and a fresh
// listing each time (an iface table holds a handful of names, and a listing
// is one netlink dump); an entry whose name keeps its interface keeps its
// counters.

// ifaceKey is the hash key of interface index idx.
func ifaceKey(idx uint32) xlbTblHkey {
	var k xlbTblHkey
	k.Src[0] = idx // the C struct's union: tbl_hkey.ifindex
	return k
}

// linkIndexes are interfaces' indexes by name.
func linkIndexes(links []netlink.Link) map[string]uint32 {
	out := make(map[string]uint32, len(links))
	for _, l := range links {
		a := l.Attrs()
		out[a.Name] = uint32(a.Index)
	}
	return out
}

// ifaceIndexes lists the plane's interfaces by name.
func (p *Plane) ifaceIndexes() (map[string]uint32, error) {
	links, err := p.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces for iface tables: %w", err)
	}
	return linkIndexes(links), nil
}

// syncIfaceNow is syncIface with the interfaces as they are now: for a
// table's fill, change or undo, which the link watch may not have seen yet.
func (p *Plane) syncIfaceNow(s *hSlot, t *model.Table) error {
	idx, err := p.ifaceIndexes()
	if err != nil {
		return err
	}
	_, err = p.syncIface(s, t, idx)
	return err
}

// syncIface makes slot s's hash hold table t's entries under the indexes
// the names have in idx (the entries of absent interfaces left out), and
// s.ifaces say which name each index was written for (the counters'
// keys). changed reports whether it wrote anything.
func (p *Plane) syncIface(s *hSlot, t *model.Table, idx map[string]uint32) (changed bool, err error) {
	want := map[uint32]model.TableEntry{}
	t.Entries("", func(e model.TableEntry) bool {
		if i, ok := idx[string(e.Key)]; ok {
			want[i] = e
		}
		return true
	})
	have := map[uint32]xlbTblVal{}
	var k xlbTblHkey
	var v xlbTblVal
	it := s.m.Iterate()
	for it.Next(&k, &v) {
		have[k.Src[0]] = v
	}
	if err := it.Err(); err != nil {
		return false, fmt.Errorf("table %q: read its hash: %w", t.Name, err)
	}
	if s.ifaces == nil {
		s.ifaces = map[uint32]string{}
	}
	for i := range have {
		if e, ok := want[i]; ok && s.ifaces[i] == string(e.Key) {
			continue
		}
		// Gone, or the index now another name's: counted afresh.
		if err := s.m.Delete(ifaceKey(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return changed, fmt.Errorf("table %q: delete interface index %d: %w", t.Name, i, err)
		}
		changed = true
		delete(have, i)
		delete(s.ifaces, i)
	}
	for i, e := range want {
		nv := tblValue(e.Value)
		if old, ok := have[i]; ok {
			nv.Packets, nv.Bytes = old.Packets, old.Bytes
			if nv == old {
				continue
			}
		}
		if err := s.m.Update(ifaceKey(i), nv, ebpf.UpdateAny); err != nil {
			return changed, fmt.Errorf("table %q: write interface %q (index %d): %w", t.Name, e.Key, i, err)
		}
		s.ifaces[i] = string(e.Key)
		changed = true
	}
	return changed, nil
}

// syncIfaceTables brings every iface table's hash in line with links (the
// namespace's interfaces now), and moves the policy generation on if that
// changed one: a tracked flow is checked again at its next packet, as after
// any change of a table (an interface renamed into a deny list cuts its
// flows off). p.mu must be held.
func (p *Plane) syncIfaceTables(links []netlink.Link) error {
	var idx map[string]uint32
	var errs []error
	changed := false
	for _, t := range p.tbls.tables {
		s := p.tbls.hslots[t.Slot]
		if t.Type != model.TableIface || s == nil {
			continue
		}
		if idx == nil {
			idx = linkIndexes(links)
		}
		c, err := p.syncIface(s, t, idx)
		changed = changed || c
		errs = append(errs, err)
	}
	if changed {
		errs = append(errs, p.bumpGen())
	}
	return errors.Join(errs...)
}
