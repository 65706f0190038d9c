package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/model"
)

// BenchmarkConnOwners is what a connection count (a scrape of /metrics,
// `xlb list`) pays before the data plane reads anything: the owners of
// each VIP, protocol and port built from the whole state, next to 16,000
// farms: built=new, each time the state changed (buildConnOwners);
// built=memo, again for the same state (Engine.connOwners).
func BenchmarkConnOwners(b *testing.B) {
	e, err := New(context.Background(), quiet, fake.New(), memStore{})
	if err != nil {
		b.Fatal(err)
	}
	var all []model.Farm
	for i := range 16000 {
		all = append(all, webFarm(b, fmt.Sprintf("f%05d", i), fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), "80"))
	}
	if err := put(e, all...); err != nil {
		b.Fatal(err)
	}
	b.Run("built=new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buildConnOwners(e.Snapshot())
		}
	})
	b.Run("built=memo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e.connOwners(e.Snapshot())
		}
	})
}
