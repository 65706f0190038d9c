package model

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkValidateFarm100Backends is one Validate of a valid farm of 100
// backends: it runs at least twice per API call that adds one (decode, and
// the engine's Put).
func BenchmarkValidateFarm100Backends(b *testing.B) {
	farms, err := DecodeFarms(farmBody(100), noFarm)
	if err != nil {
		b.Fatal(err)
	}
	f := &farms[0]
	b.ReportAllocs()
	for b.Loop() {
		if err := f.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

// Repeated backend names are found in small farms (nameSet's table) and
// large ones (its map), and the error names the first repeat.
func TestValidateDuplicateBackends(t *testing.T) {
	for _, n := range []int{3, 100, nameSetSlots / 2, nameSetSlots/2 + 1, 1000} {
		f := NewFarm("web")
		f.VirtualAddr = netip.MustParseAddr("10.1.1.1")
		for j := range n {
			b := NewBackend(fmt.Sprintf("b%d", j))
			b.Addr = netip.AddrFrom4([4]byte{172, 16, byte(j >> 8), byte(j)})
			f.Backends = append(f.Backends, b)
		}
		if err := f.Validate(); err != nil {
			t.Fatalf("%d backends: %v", n, err)
		}
		f.Backends[n-1].Name = f.Backends[n/2].Name
		err := f.Validate()
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != "backends" || fe.Value != f.Backends[n/2].Name || fe.Object != `farm "web"` {
			t.Errorf("%d backends, the last named as backend %d: %v", n, n/2, err)
		}
	}
}
