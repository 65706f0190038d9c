package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// cidrTable returns an addr deny table of n distinct /24 prefixes
// (10.0.0.0/24 onwards), as the nft plane's benchmark builds it.
func cidrTable(name string, id uint16, n int) *model.Table {
	tb := model.NewTable(name, model.TableAddr)
	tb.ID, tb.Slot, tb.Verdict = id, uint32(id), model.ListDeny
	for i := range n {
		a := netip.AddrFrom4([4]byte{byte(10 + i>>16), byte(i >> 8), byte(i), 0})
		tb.PutEntry(model.TableEntry{Key: model.AddrKey(netip.PrefixFrom(a, 24))})
	}
	return &tb
}

// BenchmarkTablesEBPF measures the eBPF plane's table operations, the
// ApplyTables call (building the batches, the bpf syscalls): creating a
// table of n CIDRs (batched add into a new trie), deleting all n entries
// in one change (what a flush is), swapping two tables of n entries, and
// adding one entry next to n.
func BenchmarkTablesEBPF(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	ns := fixtureNS(b)
	p := newPlane(b, ns, mountBPFFS(b), []string{"front"}, 4096)
	for _, n := range []int{1000, 100_000, 1_000_000} {
		a1, a2 := cidrTable("a", 1, n), cidrTable("b", 2, n)
		empty := cidrTable("a", 1, 0)
		create := func(t *model.Table) error { return p.ApplyTables(ctx, created(t)) }
		destroy := func(t *model.Table) error {
			return p.ApplyTables(ctx, plan.TableDiff{Tables: []plan.TableChange{{Old: t}}, Slots: []plan.SlotChange{{Slot: t.Slot, Old: t}}})
		}
		b.Run(fmt.Sprintf("create/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := create(a1); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := destroy(a1); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("flush/n=%d", n), func(b *testing.B) {
			var all []model.TableEntry
			a1.Entries("", func(e model.TableEntry) bool { all = append(all, e); return true })
			for b.Loop() {
				b.StopTimer()
				if err := create(a1); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := p.ApplyTables(ctx, plan.TableDiff{Slots: []plan.SlotChange{{Slot: 1, Old: a1, New: empty, Del: all}}}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := destroy(empty); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("swap/n=%d", n), func(b *testing.B) {
			if err := create(a1); err != nil {
				b.Fatal(err)
			}
			if err := create(a2); err != nil {
				b.Fatal(err)
			}
			x, y := a1, a2
			for b.Loop() {
				nx, ny := x.WithEntriesOf(y), y.WithEntriesOf(x)
				if err := p.ApplyTables(ctx, plan.TableDiff{Tables: []plan.TableChange{{Old: x, New: &nx}, {Old: y, New: &ny}}}); err != nil {
					b.Fatal(err)
				}
				x, y = &nx, &ny
			}
			b.StopTimer()
			if err := destroy(x); err != nil {
				b.Fatal(err)
			}
			if err := destroy(y); err != nil {
				b.Fatal(err)
			}
		})
		b.Run(fmt.Sprintf("add-one/n=%d", n), func(b *testing.B) {
			if err := create(a1); err != nil {
				b.Fatal(err)
			}
			i := 0
			cur := a1
			for b.Loop() {
				e := model.TableEntry{Key: model.AddrKey(netip.PrefixFrom(netip.AddrFrom4([4]byte{200, byte(i >> 8), byte(i), 0}), 24))}
				i++
				nt := cur.Clone()
				nt.PutEntry(e)
				if err := p.ApplyTables(ctx, plan.TableDiff{Slots: []plan.SlotChange{{Slot: 1, Old: cur, New: &nt, Put: []model.TableEntry{e}}}}); err != nil {
					b.Fatal(err)
				}
				cur = &nt
			}
			b.StopTimer()
			if err := destroy(cur); err != nil {
				b.Fatal(err)
			}
		})
	}
}
