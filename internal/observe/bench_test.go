package observe

import (
	"context"
	"testing"
)

// BenchmarkScrape is one scrape of /metrics (collection and exposition)
// with 1,000 farms of 10 backends over a plane whose counters cost
// nothing: what the daemon's own side of a scrape costs. The target is a
// scrape under 100 ms; BenchmarkScrapeEBPF adds the eBPF plane's reads.
func BenchmarkScrape(b *testing.B) {
	eng := newTestEngine(b, 1000, 10)
	m := New(Options{Engine: eng, Version: "bench", Dataplane: "fake", ConnWalkEvery: 1})
	ctx := context.Background()
	b.ReportAllocs()
	var size int
	for b.Loop() {
		body, err := m.Expose(ctx)
		if err != nil {
			b.Fatal(err)
		}
		size = len(body)
	}
	b.ReportMetric(float64(size), "bytes/scrape")
}
