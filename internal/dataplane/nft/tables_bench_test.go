package nft

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// cidrTable returns an addr table of n distinct /24 prefixes (10.0.0.0/24
// onwards, then 11.0.0.0/24, ...).
func cidrTable(b testing.TB, name string, id uint16, n int) *model.Table {
	tb := model.NewTable(name, model.TableAddr)
	tb.ID, tb.Slot, tb.Verdict = id, uint32(id), model.ListDeny
	for i := range n {
		a := netip.AddrFrom4([4]byte{byte(10 + i>>16), byte(i >> 8), byte(i), 0})
		tb.PutEntry(model.TableEntry{Key: model.AddrKey(netip.PrefixFrom(a, 24))})
	}
	return &tb
}

// BenchmarkTablesNft measures the nft plane's table operations in a fresh
// namespace: creating a table of n CIDRs (one batch), swapping two tables
// of n entries, and adding one entry next to n.
func BenchmarkTablesNft(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	for _, n := range []int{1000, 100_000, 1_000_000} {
		a1, a2 := cidrTable(b, "a", 1, n), cidrTable(b, "b", 2, n)
		open := func(b *testing.B) *Tables {
			_, ns := testutil.NewNetNS(b)
			tp, err := OpenTables(ctx, testLogger(), Options{NetNS: ns})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { tp.Close() })
			return tp
		}
		create := func(tp *Tables, t *model.Table) error {
			return tp.ApplyTables(ctx, plan.TableDiff{Tables: []plan.TableChange{{New: t}}, Slots: []plan.SlotChange{{Slot: t.Slot, New: t}}})
		}
		b.Run(fmt.Sprintf("create/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				tp := open(b)
				b.StartTimer()
				if err := create(tp, a1); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("swap/n=%d", n), func(b *testing.B) {
			tp := open(b)
			if err := create(tp, a1); err != nil {
				b.Fatal(err)
			}
			if err := create(tp, a2); err != nil {
				b.Fatal(err)
			}
			x, y := a1, a2
			for b.Loop() {
				nx, ny := x.WithEntriesOf(y), y.WithEntriesOf(x)
				if err := tp.ApplyTables(ctx, plan.TableDiff{Tables: []plan.TableChange{{Old: x, New: &nx}, {Old: y, New: &ny}}}); err != nil {
					b.Fatal(err)
				}
				x, y = &nx, &ny
			}
		})
		b.Run(fmt.Sprintf("add-one/n=%d", n), func(b *testing.B) {
			tp := open(b)
			if err := create(tp, a1); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				e := model.TableEntry{Key: model.AddrKey(netip.PrefixFrom(netip.AddrFrom4([4]byte{200, byte(i >> 8), byte(i), 0}), 24))}
				i++
				nt := a1.Clone()
				nt.PutEntry(e)
				if err := tp.ApplyTables(ctx, plan.TableDiff{Slots: []plan.SlotChange{{Slot: a1.Slot, Old: a1, New: &nt, Put: []model.TableEntry{e}}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
