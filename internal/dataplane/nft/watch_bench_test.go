package nft

import (
	"context"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// BenchmarkDriftWatch is the drift watch's cost on the apply path: an
// Apply of one farm of 100 backends, and of 1000 farms of 4 backends (a
// bulk POST), over the default 32 tables holding 1000 farms, with no
// watch (off), with the watch reading the events (events: the kernel
// builds a notification per object once anyone listens), and with
// DriftSeen after each Apply, as the engine calls it before answering
// (barrier: the watch has read every event of the change).
func BenchmarkDriftWatch(b *testing.B) {
	testutil.RequireRoot(b)
	for _, size := range []struct {
		name            string
		farms, backends int
	}{{"farm=1x100", 1, 100}, {"farms=1000x4", 1000, 4}} {
		for _, mode := range []string{"off", "events", "barrier"} {
			b.Run(size.name+"/watch="+mode, func(b *testing.B) {
				p := benchPlane(b, DefaultShards, 1000, func(j int) int { return 1 + j%2 })
				s := p.(*Plane)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if mode != "off" {
					if err := s.WatchDrift(ctx, func(string) {}); err != nil {
						b.Fatal(err)
					}
				}
				var add, del plan.Diff
				for i := range size.farms {
					f := benchFarm(2000+i, size.backends)
					add.Changes = append(add.Changes, plan.FarmChange{New: f})
					del.Changes = append(del.Changes, plan.FarmChange{Old: f})
				}
				b.ResetTimer()
				for range b.N {
					if err := s.Apply(ctx, add); err != nil {
						b.Fatal(err)
					}
					if mode == "barrier" {
						if _, err := s.DriftSeen(ctx); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					if err := s.Apply(ctx, del); err != nil {
						b.Fatal(err)
					}
					if mode == "barrier" {
						if _, err := s.DriftSeen(ctx); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
				}
			})
		}
	}
}
