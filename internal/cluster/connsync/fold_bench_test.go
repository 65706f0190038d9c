package connsync

import (
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// BenchmarkFold: a batch of 75 TCP flows' new, established and fin
// records (what a 10 ms batch holds at 7,500 new flows a second).
func BenchmarkFold(b *testing.B) {
	var in []dataplane.ConnEvent
	for st, kind := range []dataplane.ConnEventKind{dataplane.ConnNew, dataplane.ConnUpdate, dataplane.ConnUpdate} {
		for i := range 75 {
			c := dataplane.SyncConn{Proto: 6, Client: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), uint16(40000+i)),
				VIP: netip.MustParseAddrPort("10.99.0.2:80"), Backend: netip.MustParseAddrPort("10.200.0.11:8080"), TCPState: uint8(st + 1)}
			c.Reply = c.Client
			in = append(in, dataplane.ConnEvent{Kind: kind, Conn: c})
		}
	}
	var co coalescer
	evs := make([]dataplane.ConnEvent, len(in))
	for b.Loop() {
		copy(evs, in)
		if out := co.fold(evs); len(out) != 75 {
			b.Fatalf("%d records out", len(out))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(in)), "ns/record")
}
