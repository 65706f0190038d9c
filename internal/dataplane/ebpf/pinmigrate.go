package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// grownValues are the pinned maps whose value a version lengthened with
// fields appended at its end, where zero means what the older version did,
// by the older value's size. Their pins are not dropped as stale
// (replaceStalePins) but carried over, each entry zero-extended, so a
// daemon upgraded across the change keeps its tracked flows (and the
// backends they point to) as a restart does.
var grownValues = map[string]uint32{
	"xlb_ct":       72, // struct ct_val before its mark (issue 17)
	"xlb_backends": 36, // struct backend before its mark
	"xlb_services": 48, // struct svc_val before its farm's policy ids
}

// setAsideGrown renames the pin of each map of grownValues that still has
// the older value (and otherwise this version's shape) to <pin>_old (bpffs refuses names with a dot), so
// the load makes the map anew; migrateGrown then fills it. It returns the
// names set aside.
func (p *Plane) setAsideGrown(spec *ebpf.CollectionSpec) ([]string, error) {
	var moved []string
	for name, oldSize := range grownValues {
		ms := spec.Maps[name]
		if ms == nil || ms.ValueSize <= oldSize {
			continue
		}
		path := filepath.Join(p.opts.PinPath, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			continue // none, or not a map: replaceStalePins decides
		}
		same := m.Type() == ms.Type && m.KeySize() == ms.KeySize && m.ValueSize() == oldSize &&
			m.MaxEntries() == ms.MaxEntries && m.Flags() == ms.Flags
		m.Close()
		if !same {
			continue
		}
		if err := os.Rename(path, path+"_old"); err != nil {
			return moved, fmt.Errorf("set pinned map %s aside: %w", path, err)
		}
		moved = append(moved, name)
	}
	return moved, nil
}

// migrateGrown copies the entries of the maps setAsideGrown set aside into
// this version's maps, zero-extending each value, and removes the old pins.
// A map that cannot be read is dropped as a stale one would be (logged).
func (p *Plane) migrateGrown(names []string) {
	for _, name := range names {
		path := filepath.Join(p.opts.PinPath, name) + "_old"
		n, err := migrateMap(path, p.pinned[name])
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			err = errors.Join(err, rmErr)
		}
		if err != nil {
			p.log.Warn("pinned map of an older version not fully carried over", "map", name, "entries", n, "err", err)
			continue
		}
		p.log.Info("pinned map of an older version carried over", "map", name, "entries", n)
	}
}

// migrateMap copies the entries of the map pinned at path into to, each
// value zero-extended to to's value size.
func migrateMap(path string, to *ebpf.Map) (int, error) {
	if to == nil {
		return 0, fmt.Errorf("no map to carry %s into", path)
	}
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return 0, err
	}
	defer old.Close()
	key := make([]byte, old.KeySize())
	val := make([]byte, old.ValueSize())
	grown := make([]byte, to.ValueSize())
	n := 0
	it := old.Iterate()
	for it.Next(&key, &val) {
		copy(grown, val)
		clear(grown[len(val):])
		if err := to.Update(key, grown, ebpf.UpdateAny); err != nil {
			return n, fmt.Errorf("carry an entry of %s over: %w", path, err)
		}
		n++
	}
	return n, it.Err()
}

// tableArrays are the pinned arrays of maps holding the tables' tries and
// hashes, whose inner maps' value is struct tbl_val.
var tableArrays = []string{xlbMapXlbTblAddr4, xlbMapXlbTblAddr6, xlbMapXlbTblHash}

// setAsideStaleTables renames the pin of each array of tables whose inner
// maps' shape is not this version's (struct tbl_val grew from 32 to 40
// bytes with its dscp) to <pin>_old, so the load makes the array anew and
// carryTables fills it; it returns the names set aside. MapSpec.Compatible
// compares the outer maps only, and the kernel checks a program's reads of
// an inner map against the shape the array was made with: loading this
// version's program over an older array fails. The shape is not readable
// from the array itself, so a map of this version's inner shape is put at
// index 0 (never used: a slot index is 1-65535) and taken out again; the
// kernel refuses it if the shapes differ.
func (p *Plane) setAsideStaleTables(spec *ebpf.CollectionSpec) ([]string, error) {
	var moved []string
	for _, name := range tableArrays {
		ms := spec.Maps[name]
		if ms == nil || ms.InnerMap == nil {
			return moved, fmt.Errorf("map %s not in the program", name)
		}
		path := filepath.Join(p.opts.PinPath, name)
		outer, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			continue // none, or not a map: replaceStalePins decides
		}
		err = innerFits(outer, ms.InnerMap)
		outer.Close()
		if err == nil {
			continue
		}
		p.log.Info("pinned table array holds maps of an older shape; carrying its tables over", "map", name, "err", err)
		if err := os.Rename(path, path+"_old"); err != nil {
			return moved, fmt.Errorf("set pinned map %s aside: %w", path, err)
		}
		moved = append(moved, name)
	}
	return moved, nil
}

// carryTables puts into each array setAsideStaleTables set aside's new
// one, at the index it had, a copy of every table it held: a map of this
// version's inner shape with the old map's name and size, its entries
// zero-extended (a dscp of 0 leaves the DSCP; counters and limits' state
// kept). It runs before the program is attached, so the farms' policies
// never find their tables empty across an upgrade (replacing the arrays
// instead left them empty until ReconcileTables refilled them: allow lists
// dropped everything meanwhile). The daemon then adopts the copies by
// their names, as after a restart. The old pins are removed; a table that
// could not be carried is logged, and ReconcileTables makes it anew.
func (p *Plane) carryTables(spec *ebpf.CollectionSpec, moved []string) {
	for _, name := range moved {
		path := filepath.Join(p.opts.PinPath, name) + "_old"
		n, err := carryTableArray(path, p.pinned[name], spec.Maps[name].InnerMap.ValueSize)
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			err = errors.Join(err, rmErr)
		}
		if err != nil {
			p.log.Warn("tables of an older version not fully carried over (ReconcileTables rebuilds them)", "map", name, "tables", n, "err", err)
			continue
		}
		p.log.Info("tables of an older version carried over", "map", name, "tables", n)
	}
}

// carryTableArray copies each inner map of the array of maps pinned at path
// into a new map like it with values of valueSize bytes (to's inner maps'),
// puts it at the same index of to, and returns how many it carried.
func carryTableArray(path string, to *ebpf.Map, valueSize uint32) (int, error) {
	if to == nil {
		return 0, fmt.Errorf("no array to carry %s into", path)
	}
	old, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return 0, err
	}
	defer old.Close()
	n := 0
	for idx := range old.MaxEntries() {
		var id uint32
		if err := old.Lookup(idx, &id); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return n, fmt.Errorf("read index %d of %s: %w", idx, path, err)
		}
		if err := carryInner(to, idx, ebpf.MapID(id), valueSize); err != nil {
			return n, fmt.Errorf("carry index %d of %s over: %w", idx, path, err)
		}
		n++
	}
	return n, nil
}

// carryInner copies the map of id into a new one like it with values of
// valueSize bytes, each zero-extended, and puts it at index idx of to.
func carryInner(to *ebpf.Map, idx uint32, id ebpf.MapID, valueSize uint32) error {
	om, err := ebpf.NewMapFromID(id)
	if err != nil {
		return err
	}
	defer om.Close()
	info, err := om.Info()
	if err != nil {
		return err
	}
	spec := &ebpf.MapSpec{Name: info.Name, Type: om.Type(), KeySize: om.KeySize(), ValueSize: valueSize,
		MaxEntries: om.MaxEntries(), Flags: om.Flags()}
	nm, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("make %s anew: %w", info.Name, err)
	}
	defer nm.Close()
	key := make([]byte, om.KeySize())
	val := make([]byte, om.ValueSize())
	grown := make([]byte, nm.ValueSize())
	it := om.Iterate()
	for it.Next(&key, &val) {
		copy(grown, val)
		clear(grown[len(val):])
		if err := nm.Update(key, grown, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("copy an entry of %s: %w", info.Name, err)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", info.Name, err)
	}
	return to.Update(idx, nm, ebpf.UpdateAny)
}

// innerFits reports whether outer takes a map made from inner (put at
// index 0 and removed).
func innerFits(outer *ebpf.Map, inner *ebpf.MapSpec) error {
	is := inner.Copy()
	is.MaxEntries = 1
	is.Name = "xlb_probe"
	probe, err := ebpf.NewMap(is)
	if err != nil {
		return fmt.Errorf("make a probe of %s's inner map: %w", inner.Name, err)
	}
	defer probe.Close()
	if err := outer.Update(uint32(0), probe, ebpf.UpdateAny); err != nil {
		return err
	}
	return outer.Delete(uint32(0))
}
