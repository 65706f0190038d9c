package ebpf

import (
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
	testutil.RequireRoot(t)
	pin := mountBPFFS(t)
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	spec, err := loadXlb()
	if err != nil {
		t.Fatal(err)
	}
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
