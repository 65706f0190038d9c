package model

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	iradix "github.com/hashicorp/go-immutable-radix/v2"
)

// cidrKeys returns n distinct /24 and /32 keys spread over 10.0.0.0/8 and
// beyond.
func cidrKeys(n int) []TableKey {
	out := make([]TableKey, n)
	for i := range n {
		a := netip.AddrFrom4([4]byte{byte(1 + i>>16), byte(i >> 8), byte(i), 0})
		bits := 24
		if i%2 == 1 {
			bits = 32
			a = netip.AddrFrom4([4]byte{byte(1 + i>>16), byte(i >> 8), byte(i), 1})
		}
		out[i] = AddrKey(netip.PrefixFrom(a, bits))
	}
	return out
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// BenchmarkTableEntries measures the published representation of a table's
// entries (copy-on-write B-tree) at 1k-1M entries: bulk load, one add to a
// clone of a loaded table (what one API add costs the snapshot), a
// most-specific lookup, and the memory per entry. The iradix rows are the
// persistent radix tree farms use, for comparison.
func BenchmarkTableEntries(b *testing.B) {
	for _, n := range []int{1000, 100_000, 1_000_000} {
		keys := cidrKeys(n)
		b.Run(fmt.Sprintf("btree/load/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				t := NewTable("t", TableAddr)
				for _, k := range keys {
					t.PutEntry(TableEntry{Key: k})
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/entry")
		})
		base := heapInUse()
		t := NewTable("t", TableAddr)
		for _, k := range keys {
			t.PutEntry(TableEntry{Key: k})
		}
		perEntry := float64(heapInUse()-base) / float64(n)
		b.Run(fmt.Sprintf("btree/clone-add-one/n=%d", n), func(b *testing.B) {
			extra := AddrKey(netip.MustParsePrefix("200.0.0.0/8"))
			for b.Loop() {
				c := t.Clone()
				c.PutEntry(TableEntry{Key: extra})
			}
			b.ReportMetric(perEntry, "heap-B/entry")
		})
		b.Run(fmt.Sprintf("btree/lookup/n=%d", n), func(b *testing.B) {
			a := netip.MustParseAddr("1.2.4.77") // in 1.2.4.0/24 (i = 0x0204)
			for b.Loop() {
				if _, ok := t.LookupAddr(a); !ok {
					b.Fatal("no match")
				}
			}
		})
		runtime.KeepAlive(t)

		base = heapInUse()
		tr := iradix.New[TableEntry]()
		tx := tr.Txn()
		for _, k := range keys {
			tx.Insert([]byte(k), TableEntry{Key: k})
		}
		tr = tx.Commit()
		perEntry = float64(heapInUse()-base) / float64(n)
		b.Run(fmt.Sprintf("iradix/clone-add-one/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				tr.Insert([]byte("\x04\xc8\x00\x00\x00\x08"), TableEntry{})
			}
			b.ReportMetric(perEntry, "heap-B/entry")
		})
		runtime.KeepAlive(tr)
	}
}
