package ebpf

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestConnSyncWake: a reader that found the ring empty arms the program's
// wake-up and sleeps (here for an hour); a new flow's record wakes it, it
// disarms the wake-up and reads again every few milliseconds; the end of
// its context wakes it too. Without the program's wake-up the record
// would wait the hour.
func TestConnSyncWake(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p, err := New(context.Background(), testLogger(t), Options{NetNS: ns, Interfaces: []string{"front", "back"},
		PinPath: mountBPFFS(t), ConnTableSize: 4096, syncIdleWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := p.Reconcile(ctx, syncFarms(t)); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var got atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- p.WatchConns(wctx, func(evs []dataplane.ConnEvent) { got.Add(int64(len(evs))) })
	}()
	armed := func() bool {
		var w uint32
		return p.objs.XlbSyncWake.Get(&w) == nil && w == 1
	}
	waitFor(t, "the reader, idle, arms the wake-up", armed)
	time.Sleep(50 * time.Millisecond) // asleep in its idle wait, not in its last look
	for i, flags := range []uint8{tcpSYN, tcpACK} {
		verdict, _ := runProg(t, ns, p.objs.XlbIngress, pktSpec{src: client, sport: 40100, dst: vip1, dport: 80,
			proto: protoTCP, tcpFlags: flags}.build())
		if verdict != verdictRedirect {
			t.Fatalf("packet %d: verdict %d", i, verdict)
		}
	}
	waitFor(t, "both records read", func() bool { return got.Load() == 2 })
	if armed() {
		t.Fatal("wake-up still armed after a record woke the reader")
	}
	// Idle again: armed again, and the end of ctx ends the wait.
	waitFor(t, "the wake-up armed again", armed)
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WatchConns: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchConns still waiting 10s after its context ended")
	}
	if armed() {
		t.Fatal("wake-up left armed after WatchConns returned")
	}
}
