package connsync

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// TestCoalesce: within a batch, a connection's updates fold into its
// earlier new or update record (which takes the latest state, keeping its
// kind and place); ends, new records, other translations and sessions
// are not folded across.
func TestCoalesce(t *testing.T) {
	st := func(c dataplane.SyncConn, s uint8, to uint32) dataplane.SyncConn {
		c.TCPState, c.Timeout = s, to
		return c
	}
	ev := func(k dataplane.ConnEventKind, c dataplane.SyncConn) dataplane.ConnEvent {
		return dataplane.ConnEvent{Kind: k, Conn: c}
	}
	c1, c2 := conn(1, false), conn(2, true)
	other := c1
	other.Backend = netip.MustParseAddrPort("10.200.0.12:8080") // a new connection on c1's tuple, elsewhere
	const (
		New, Upd, End, Sess = dataplane.ConnNew, dataplane.ConnUpdate, dataplane.ConnEnd, dataplane.ConnSession
	)
	for _, tc := range []struct {
		name    string
		in, out []dataplane.ConnEvent
	}{
		{"new, established, fin: one new record in the fin state",
			[]dataplane.ConnEvent{ev(New, st(c1, 1, 120)), ev(New, c2), ev(Upd, st(c1, 3, 300)), ev(Upd, st(c1, 4, 120))},
			[]dataplane.ConnEvent{ev(New, st(c1, 4, 120)), ev(New, c2)}},
		{"updates only: one update",
			[]dataplane.ConnEvent{ev(Upd, st(c1, 3, 300)), ev(Upd, st(c2, 3, 300)), ev(Upd, st(c1, 4, 120))},
			[]dataplane.ConnEvent{ev(Upd, st(c1, 4, 120)), ev(Upd, st(c2, 3, 300))}},
		{"an end: nothing folds across it",
			[]dataplane.ConnEvent{ev(New, c1), ev(End, c1), ev(Upd, st(c1, 4, 120))},
			[]dataplane.ConnEvent{ev(New, c1), ev(End, c1), ev(Upd, st(c1, 4, 120))}},
		{"a new record starts over",
			[]dataplane.ConnEvent{ev(Upd, st(c1, 4, 120)), ev(New, st(c1, 1, 120)), ev(Upd, st(c1, 3, 300))},
			[]dataplane.ConnEvent{ev(Upd, st(c1, 4, 120)), ev(New, st(c1, 3, 300))}},
		{"another translation is another connection",
			[]dataplane.ConnEvent{ev(New, c1), ev(Upd, st(other, 3, 300))},
			[]dataplane.ConnEvent{ev(New, c1), ev(Upd, st(other, 3, 300))}},
		{"sessions stay",
			[]dataplane.ConnEvent{ev(Sess, c1), ev(Sess, c1), ev(Upd, c1), ev(Upd, c1)},
			[]dataplane.ConnEvent{ev(Sess, c1), ev(Sess, c1), ev(Upd, c1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var co coalescer
			got := co.fold(slices.Clone(tc.in))
			if !slices.Equal(got, tc.out) {
				t.Fatalf("folded\n%v\ninto\n%v\nwant\n%v", tc.in, got, tc.out)
			}
		})
	}
}

// TestSyncFoldsBatch: a connection's records in one batch of the data
// plane reach the peer as one, in the latest state.
func TestSyncFoldsBatch(t *testing.T) {
	a, b := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.2")
	planeA, planeB := newFakePlane(), newFakePlane()
	startNode(t, Config{Name: "a", Listen: a, Peers: []netip.AddrPort{b}, Key: key, Wait: time.Minute}, planeA)
	nodeB := startNode(t, Config{Name: "b", Listen: b, Peers: []netip.AddrPort{a}, Key: key, Wait: time.Minute}, planeB)
	waitFor(t, "b caught up with a", func() bool { ok, _ := nodeB.Ready(); return ok })
	syn, est, fin := conn(5, false), conn(5, false), conn(5, false)
	syn.TCPState, est.TCPState, fin.TCPState = 1, 3, 4
	recv0 := nodeB.Counters().ConnsReceived
	planeA.events <- []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: syn}, {Kind: dataplane.ConnUpdate, Conn: est},
		{Kind: dataplane.ConnNew, Conn: conn(6, false)}, {Kind: dataplane.ConnUpdate, Conn: fin}}
	waitFor(t, "both connections on b", func() bool {
		_, ok6 := planeB.has(conn(6, false).Client)
		got, ok5 := planeB.has(fin.Client)
		return ok6 && ok5 && got == fin
	})
	if n := nodeB.Counters().ConnsReceived - recv0; n != 2 {
		t.Fatalf("b received %d records, want 2 (one a connection)", n)
	}
	planeB.mu.Lock()
	defer planeB.mu.Unlock()
	if k := planeB.kinds[fin.Client]; k != dataplane.ConnNew {
		t.Fatalf("b installed connection 5 as kind %d, want new", k)
	}
}
