package connsync

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// twoCallers calls the watcher's fn from two goroutines at once, as
// sessionsync does (its poll beside the plane's events), each with its
// own reused batch (fn keeps none).
type twoCallers struct {
	*fakePlane
	batches int
}

func (p *twoCallers) WatchConns(ctx context.Context, fn func([]dataplane.ConnEvent)) error {
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := make([]dataplane.ConnEvent, 0, 4)
			for i := range p.batches {
				batch = batch[:0]
				for j := range 2 {
					c := conn(g*10000+i*2+j, false)
					batch = append(batch, dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: c})
					c.TCPState = 4
					batch = append(batch, dataplane.ConnEvent{Kind: dataplane.ConnUpdate, Conn: c})
				}
				fn(batch)
				clear(batch) // the plane reuses it: what fn queued must not change
			}
		}()
	}
	wg.Wait()
	<-ctx.Done()
	return nil
}

// TestWatchTwoCallers: batches handed to the watcher from two goroutines
// at once, each reused by its caller, reach the peer's queue whole, each
// connection's two records folded into one in its final state (fails
// under -race without the watcher's lock: the fold's map is shared).
func TestWatchTwoCallers(t *testing.T) {
	const batches = 300
	dp := &twoCallers{fakePlane: newFakePlane(), batches: batches}
	peer := netip.MustParseAddrPort("127.0.0.2:1")
	n, err := New(quiet, Config{Listen: netip.MustParseAddrPort("127.0.0.1:1"), Peers: []netip.AddrPort{peer}, Key: make([]byte, 16)}, dp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.watch(ctx) }()
	defer func() { cancel(); <-done }()
	p := n.peers[peer.Addr()]
	seen := map[netip.AddrPort]bool{}
	for deadline := time.Now().Add(20 * time.Second); len(seen) < 2*batches*2; {
		select {
		case pl := <-p.queue:
			evs, err := parseConns(nil, pl.b)
			pl.release()
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != 2 {
				t.Fatalf("a batch of %d records, want 2 (each connection's two folded)", len(evs))
			}
			for _, ev := range evs {
				if ev.Kind != dataplane.ConnNew || ev.Conn.TCPState != 4 || seen[ev.Conn.Client] {
					t.Fatalf("record %+v: want each connection once, new, in its final state", ev)
				}
				seen[ev.Conn.Client] = true
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%d connections of %d reached the queue", len(seen), 2*batches*2)
		}
	}
}
