package ebpf

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestStalePinReplaced: a pinned map left by another version, whose shape
// this program's differs from, is replaced at start (logged) instead of
// failing the load; a compatible pin is adopted as it is.
func TestStalePinReplaced(t *testing.T) {
	pin, spec := pinSetup(t)
	const stale = "xlb_persist"
	want := spec.Maps[stale]
	if want == nil || want.Pinning != ebpf.PinByName {
		t.Fatalf("%s is not a pinned map of the program", stale)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: stale, Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(pin, stale)); err != nil {
		t.Fatal(err)
	}
	newPlane(t, fixtureNS(t), pin, nil, 1024)
	m, err := ebpf.LoadPinnedMap(filepath.Join(pin, stale), nil)
	if err != nil {
		t.Fatalf("the plane left no %s pinned: %v", stale, err)
	}
	defer m.Close()
	if err := want.Compatible(m); err != nil {
		t.Errorf("the stale %s pin was kept: %v", stale, err)
	}
}

// TestGrownPinCarriedOver: an xlb_ct pinned by the version before marks
// (72-byte values) is carried over at start, its entries zero-extended
// (mark 0), so an upgrade across the change keeps the tracked flows;
// without the carry-over the pin is replaced empty (the test fails).
func TestGrownPinCarriedOver(t *testing.T) {
	pin, spec := pinSetup(t)
	ms := spec.Maps[xlbMapXlbCt]
	const size = 1024
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: xlbMapXlbCt, Type: ms.Type, KeySize: ms.KeySize, ValueSize: grownValues[xlbMapXlbCt],
		MaxEntries: size, Flags: ms.Flags})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	key := xlbCtKey{Src: [4]uint32{0x0200640a}, Dst: [4]uint32{0x0100630a}, Sport: 0x409c, Dport: 0x5000, Proto: 6, Family: 1}
	v := xlbCtVal{Src: key.Src, Dst: [4]uint32{0x0b00c80a}, Sport: key.Sport, Dport: 0x901f, Svc: 7, Backend: 9, Seen: 12345, Ifindex: 3}
	var vb bytes.Buffer
	if err := binary.Write(&vb, binary.NativeEndian, v); err != nil {
		t.Fatal(err)
	}
	if err := old.Update(&key, vb.Bytes()[:grownValues[xlbMapXlbCt]], ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(pin, xlbMapXlbCt)); err != nil {
		t.Fatal(err)
	}
	p := newPlane(t, fixtureNS(t), pin, nil, size)
	var got xlbCtVal
	if err := p.objs.XlbCt.Lookup(&key, &got); err != nil {
		t.Fatalf("the old version's flow is gone: %v", err)
	}
	if got != v {
		t.Errorf("carried over %+v, want %+v", got, v)
	}
	if _, err := os.Stat(filepath.Join(pin, xlbMapXlbCt+"_old")); !os.IsNotExist(err) {
		t.Errorf("the old pin is left: %v", err)
	}
}

// TestGrownServicesCarriedOver: a service pinned by a version before
// svc_val's policy ids (48 bytes) is carried over, its ids zero: "not
// known", so its packets look their farm's policies up by key as before
// (tbl_svc_refs). Fails without xlb_services in grownValues (the pin is
// replaced as stale and the service is gone).
func TestGrownServicesCarriedOver(t *testing.T) {
	const oldSize = 48 // struct svc_val before tbl_ids
	pin, spec := pinSetup(t)
	ms := spec.Maps[xlbMapXlbServices]
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: xlbMapXlbServices, Type: ms.Type, KeySize: ms.KeySize,
		ValueSize: oldSize, MaxEntries: ms.MaxEntries, Flags: ms.Flags})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	key := xlbSvcKey{Addr: [4]uint32{0x0500630a}, Port: 0x3500, Proto: 17, Family: 1}
	v := xlbSvcVal{Id: 7, Slots: 3, Mode: 4, Sched: 1, PersistTtl: 60, NewIv: 1000, NewTol: 2000}
	var vb bytes.Buffer
	if err := binary.Write(&vb, binary.NativeEndian, v); err != nil {
		t.Fatal(err)
	}
	if err := old.Update(&key, vb.Bytes()[:oldSize], ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(pin, xlbMapXlbServices)); err != nil {
		t.Fatal(err)
	}
	p := newPlane(t, fixtureNS(t), pin, nil, 1024)
	var got xlbSvcVal
	if err := p.objs.XlbServices.Lookup(&key, &got); err != nil {
		t.Fatalf("the old version's service is gone: %v", err)
	}
	if got != v {
		t.Errorf("carried over %+v, want %+v", got, v)
	}
}

// pinSetup is a pin directory of the test's own and the program's spec.
func pinSetup(t *testing.T) (string, *ebpf.CollectionSpec) {
	t.Helper()
	testutil.RequireRoot(t)
	pin := mountBPFFS(t)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	spec, err := loadXlb()
	if err != nil {
		t.Fatal(err)
	}
	return pin, spec
}

// TestStaleTablesCarried: the arrays of tables pinned by the version before
// table dscp values (tries and hashes of 32-byte struct tbl_val) are made
// anew at start, and each table they held is carried over at its index,
// under its name, with its entries (counters, mark) before the program is
// attached: the load does not fail on them (without setAsideStaleTables it
// does: the verifier checks the program's reads of the inner maps against
// the older shape), the farms' policies never find their tables empty
// (when the arrays were replaced instead, they were until ReconcileTables
// refilled them), and the new arrays take this version's tries.
func TestStaleTablesCarried(t *testing.T) {
	pin, spec := pinSetup(t)
	const idx = 9
	for _, name := range tableArrays {
		ms := spec.Maps[name].Copy()
		ms.Pinning, ms.Key, ms.Value = ebpf.PinNone, nil, nil
		ms.InnerMap.ValueSize, ms.InnerMap.Key, ms.InnerMap.Value = 32, nil, nil
		old, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatalf("make an older %s: %v", name, err)
		}
		defer old.Close()
		is := ms.InnerMap.Copy()
		is.Name = "xt_old_" + name[len(name)-1:]
		inner, err := ebpf.NewMap(is)
		if err != nil {
			t.Fatal(err)
		}
		defer inner.Close()
		key, val := make([]byte, is.KeySize), make([]byte, 32)
		key[0] = 32               // an LPM trie's prefix length; any key for the hash
		val[0], val[16] = 7, 0x42 // packets, mark
		if err := inner.Update(key, val, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if err := old.Update(uint32(idx), inner, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if err := old.Pin(filepath.Join(pin, name)); err != nil {
			t.Fatal(err)
		}
	}
	p := newPlane(t, fixtureNS(t), pin, nil, 1024)
	for _, name := range tableArrays {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pin, name), nil)
		if err != nil {
			t.Fatalf("no %s pinned: %v", name, err)
		}
		defer m.Close()
		if err := innerFits(m, spec.Maps[name].InnerMap); err != nil {
			t.Errorf("%s does not take this version's maps: %v", name, err)
		}
		var inner *ebpf.Map
		if err := m.Lookup(uint32(idx), &inner); err != nil {
			t.Errorf("%s: the table at index %d was not carried over: %v", name, idx, err)
			continue
		}
		defer inner.Close()
		info, _ := inner.Info()
		key := make([]byte, inner.KeySize())
		key[0] = 32
		val := make([]byte, inner.ValueSize())
		if err := inner.Lookup(key, val); err != nil {
			t.Errorf("%s: the carried table %q lost its entry: %v", name, info.Name, err)
			continue
		}
		if info.Name != "xt_old_"+name[len(name)-1:] || inner.ValueSize() != spec.Maps[name].InnerMap.ValueSize || val[0] != 7 || val[16] != 0x42 {
			t.Errorf("%s: carried %q, value size %d, entry % x", name, info.Name, inner.ValueSize(), val)
		}
	}
	if _, err := os.Stat(filepath.Join(pin, tableArrays[0]+"_old")); !os.IsNotExist(err) {
		t.Errorf("the set-aside array's pin is still there: %v", err)
	}
	applyTables(t, p, created(dscpTable(t, "ds", 1, 1, [2]string{"10.0.0.0/8", "46"})))
}
