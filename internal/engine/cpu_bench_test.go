package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// memStore is a Store that keeps nothing: the benchmarks below time the
// engine's own CPU (decode, validate, diff, build), not bbolt's fsyncs.
type memStore struct{}

func (memStore) Load(context.Context) ([]model.Farm, error) { return nil, nil }
func (memStore) Commit(context.Context, plan.Diff) error    { return nil }
func (memStore) Close() error                               { return nil }

// addBody is the body of POST /farms adding farm name with n backends.
func addBody(name string, n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"farms":[{"name":%q,"virtual-addr":"172.16.0.1","virtual-ports":"80","backends":[`, name)
	for j := range n {
		if j > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"b%d","ip-addr":"172.17.%d.%d","port":"8080","weight":"1"}`, j, j>>8, j&255)
	}
	b.WriteString("]}]}")
	return []byte(b.String())
}

// BenchmarkAddFarm100Backends is the engine's CPU share of POST /farms
// adding a farm of 100 backends next to 0 or 10,000 farms: the body decoded
// inside the transaction (as the API's upsert does), Put, validate, diff,
// build, publish; the store and the data plane do nothing. The farm is
// deleted again outside the timer.
func BenchmarkAddFarm100Backends(b *testing.B) {
	for _, existing := range []int{0, 10000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			ctx := context.Background()
			e, err := New(ctx, quiet, fake.New(), memStore{})
			if err != nil {
				b.Fatal(err)
			}
			var all []model.Farm
			for i := range existing {
				all = append(all, webFarm(b, fmt.Sprintf("f%05d", i), fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), "80"))
			}
			if err := put(e, all...); err != nil {
				b.Fatal(err)
			}
			body := addBody("bench", 100)
			add := func(tx *Txn) error {
				farms, err := model.DecodeFarms(body, tx.Get)
				if err != nil {
					return err
				}
				for _, f := range farms {
					if err := tx.Put(f); err != nil {
						return err
					}
				}
				return nil
			}
			del := func(tx *Txn) error { return tx.Delete("bench") }
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := e.Change(ctx, add); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if _, err := e.Change(ctx, del); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkUpdateFarm100Backends is POST /farms changing the weights of a
// farm of 100 backends next to 0 or 10,000 farms, as
// BenchmarkAddFarm100Backends.
func BenchmarkUpdateFarm100Backends(b *testing.B) {
	for _, existing := range []int{0, 10000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			ctx := context.Background()
			e, err := New(ctx, quiet, fake.New(), memStore{})
			if err != nil {
				b.Fatal(err)
			}
			var all []model.Farm
			for i := range existing {
				all = append(all, webFarm(b, fmt.Sprintf("f%05d", i), fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), "80"))
			}
			if err := put(e, all...); err != nil {
				b.Fatal(err)
			}
			bodies := [2][]byte{addBody("bench", 100), []byte(strings.ReplaceAll(string(addBody("bench", 100)), `"weight":"1"`, `"weight":"2"`))}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				body := bodies[i%2]
				if _, err := e.Change(ctx, func(tx *Txn) error {
					farms, err := model.DecodeFarms(body, tx.Get)
					if err != nil {
						return err
					}
					return tx.Put(farms[0])
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkChangeSharedVIP changes one farm of 1 backend on a VIP that
// 0 or 1,000 other farms (other ports) share: the conflict check looks at
// every farm on the VIP.
func BenchmarkChangeSharedVIP(b *testing.B) {
	for _, others := range []int{0, 1000} {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			ctx := context.Background()
			e, err := New(ctx, quiet, fake.New(), memStore{})
			if err != nil {
				b.Fatal(err)
			}
			var all []model.Farm
			for i := range others {
				all = append(all, webFarm(b, fmt.Sprintf("f%05d", i), "10.0.0.1", fmt.Sprint(1000+i)))
			}
			if err := put(e, all...); err != nil {
				b.Fatal(err)
			}
			f := webFarm(b, "bench", "10.0.0.1", "80")
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f.Backends[0].Weight = uint32(i%100 + 1)
				if err := put(e, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBulkSharedVIP adds 1,000 farms on one VIP (other ports) in one
// change: the conflict check compares each with every other, O(n^2).
func BenchmarkBulkSharedVIP(b *testing.B) {
	ctx := context.Background()
	var all []model.Farm
	for i := range 1000 {
		all = append(all, webFarm(b, fmt.Sprintf("f%05d", i), "10.0.0.1", fmt.Sprint(1000+i)))
	}
	b.ReportAllocs()
	for b.Loop() {
		e, err := New(ctx, quiet, fake.New(), memStore{})
		if err != nil {
			b.Fatal(err)
		}
		if err := put(e, all...); err != nil {
			b.Fatal(err)
		}
	}
}
