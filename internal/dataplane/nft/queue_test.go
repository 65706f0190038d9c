package nft

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestQueue: a farm's new connections go to its nfqueue before they are
// balanced. Without a reader they pass (bypass); a reader sees each new
// connection's first packet, addressed to the VIP, and its verdict
// decides: accepted connections reach a backend, dropped ones do not.
func TestQueue(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	vip := testutil.VIP4(1)
	f := e.farm("queued", vip, 80, model.ProtoTCP, 8080)
	u := e.farm("queued-udp", vip, 53, model.ProtoUDP, 8080)
	f.Queue, u.Queue = 3, 4
	e.put(t, prev, f, u)
	out := e.nft(t, "list", "table", "inet", "xlb")
	// nft lists the xtables target as `queue num 3 bypass` (after a
	// warning of libxtables, which knows no inet family).
	if !strings.Contains(out, "ct state new counter packets 0 bytes 0 ") || !strings.Contains(out, "queue num 3 bypass") {
		t.Errorf("listing lacks the queue rule:\n%s", out)
	}
	to, toU := netip.AddrPortFrom(vip, 80), netip.AddrPortFrom(vip, 53)
	if name, _ := e.askTCP(t, to); name != "b0" {
		t.Fatalf("without a reader (bypass): answered by %q", name)
	}
	q := testutil.ListenNFQueue(t, e.LB.NS, 3)
	qu := testutil.ListenNFQueue(t, e.LB.NS, 4)
	for range 3 {
		if name, _ := e.askTCP(t, to); name != "b0" {
			t.Fatalf("reader accepting: answered by %q", name)
		}
	}
	if name, _ := e.askUDP(t, toU); name != "b0" {
		t.Fatalf("udp, reader accepting: answered by %q", name)
	}
	if err := q.WaitSeen(3, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := qu.WaitSeen(1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// One packet per connection (its first), to the VIP (before dnat).
	for _, p := range q.Seen() {
		if p.Src != e.Client.IPv4 || p.Dst != vip || p.DstPort != 80 || p.Proto != 6 {
			t.Errorf("queued packet %+v, want tcp %s -> %s:80", p, e.Client.IPv4, vip)
		}
	}
	if n := len(q.Seen()); n != 3 {
		t.Errorf("queue 3 received %d packets for 3 connections, want 3 (new connections only)", n)
	}
	q.SetDrop(true)
	if _, err := testutil.AskTCP(e.Client.NS, to); err == nil {
		t.Errorf("reader dropping: the connection was answered")
	}
	// Without queue the rule goes.
	f.Queue = -1
	e.put(t, prev, f)
	if out := e.nft(t, "list", "table", "inet", "xlb"); strings.Contains(out, "queue num 3") {
		t.Errorf("queue -1: the rule is still there:\n%s", out)
	}
	if name, _ := e.askTCP(t, to); name != "b0" {
		t.Errorf("queue off: answered by %q", name)
	}
}
