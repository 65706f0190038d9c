package ebpf

import (
	"context"
	"math/bits"
	"net/netip"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// jhash3 is bpf/xlb_csum.h's xlb_jhash_3words, to predict the program's
// choices.
func jhash3(a, b, c, initval uint32) uint32 {
	const iv = 0xdeadbeef
	a += iv
	b += iv
	c += initval
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// symhash is the program's symmetric hash of a tuple (ports in host order).
func symhash(src, dst netip.Addr, sport, dport uint16, proto uint8) uint32 {
	a, b := ne32(src), ne32(dst)
	if a > b {
		a, b = b, a
	}
	if sport > dport {
		sport, dport = dport, sport
	}
	return jhash3(a, b, uint32(sport)<<16|uint32(dport), hashSeed^uint32(proto))
}

func TestSymhashIsSymmetric(t *testing.T) {
	for i := range 100 {
		s, d := netip.AddrFrom4([4]byte{10, 0, byte(i), 1}), netip.AddrFrom4([4]byte{192, 168, 1, byte(i)})
		if symhash(s, d, uint16(1000+i), 80, 6) != symhash(d, s, 80, uint16(1000+i), 6) {
			t.Fatalf("symhash differs for %s:%d <-> %s:80", s, 1000+i, d)
		}
	}
}

// TestSchedulerFixtures checks with BPF_PROG_TEST_RUN that symhash and
// maglev farms send each flow where the Go model of the program's hash and
// the farm's table say, and that priority groups are honoured.
func TestSchedulerFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	bes := []string{"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080"}
	sym := farm(t, "sym", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedSymhash, bes...)
	mag := farm(t, "mag", "10.99.0.2", 80, model.ProtoTCP, model.ModeDNAT, model.SchedMaglev, bes...)
	prio := farm(t, "prio", "10.99.0.3", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, bes...)
	// nftlb's rule: b2 down raises the level to 2; b0 (a spare of
	// level 3) stays on standby.
	prio.Backends[0].Priority = 3
	prio.Backends[1].Priority = 1
	prio.Backends[2].Priority = 1
	prio.Backends[2].State = model.StateDown
	if err := p.Reconcile(context.Background(), []*model.Farm{sym, mag, prio}); err != nil {
		t.Fatal(err)
	}
	backendOf := func(g *generation, h uint32) netip.Addr {
		be := g.bes[g.slots[h%uint32(len(g.slots))]]
		return netip.AddrFrom4(ne4(be.Addr[0]))
	}
	spread := map[string]map[netip.Addr]int{"sym": {}, "mag": {}}
	for i := range 60 {
		sport := uint16(30000 + i*7)
		// symhash
		_, out := runProg(t, ns, p.objs.XlbIngress, pktSpec{src: client, sport: sport, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
		got, err := parse(out)
		if err != nil {
			t.Fatal(err)
		}
		want := backendOf(p.farms["sym"], symhash(client, vip1, sport, 80, protoTCP))
		if got.dst != want {
			t.Errorf("symhash flow from port %d went to %s, want %s", sport, got.dst, want)
		}
		spread["sym"][got.dst]++
		// maglev: plan.FlowSlot over the whole flow
		_, out = runProg(t, ns, p.objs.XlbIngress, pktSpec{src: client, sport: sport, dst: vip2, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
		if got, err = parse(out); err != nil {
			t.Fatal(err)
		}
		g := p.farms["mag"]
		if len(g.slots) != plan.MaglevSize(3) {
			t.Fatalf("maglev farm has %d slots, want %d", len(g.slots), plan.MaglevSize(3))
		}
		slot := plan.FlowSlot(plan.MaglevKeys(mag), plan.Flow{Src: client, Dst: vip2, SPort: sport, DPort: 80}, len(g.slots))
		be := g.bes[g.slots[slot]]
		want = netip.AddrFrom4(ne4(be.Addr[0]))
		if got.dst != want {
			t.Errorf("maglev flow from port %d went to %s, want %s", sport, got.dst, want)
		}
		spread["mag"][got.dst]++
		// priority: only the up backend at or below the level serves.
		_, out = runProg(t, ns, p.objs.XlbIngress, pktSpec{src: client, sport: sport, dst: vip3, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
		if got, err = parse(out); err != nil {
			t.Fatal(err)
		}
		if got.dst != be2 {
			t.Errorf("priority: flow went to %s, want %s (priority 1, up)", got.dst, be2)
		}
	}
	for name, s := range spread {
		if len(s) != 3 {
			t.Errorf("%s: 60 flows reached %d backends: %v", name, len(s), s)
		}
	}
}

func ne4(v uint32) [4]byte {
	var b [4]byte
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	return b
}

// TestPersistenceFixtures: persistence srcip sends a client's new flows to
// its backend while the TTL runs, across a change of the farm (a new
// generation), and not once the backend is gone or the TTL has passed.
func TestPersistenceFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	ctx := context.Background()
	f1 := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080", "10.200.0.12:8080")
	f1.Persistence = model.KeySrcIP
	f1.PersistTTL = 2
	if err := check(f1); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(ctx, diffOf(nil, f1)); err != nil {
		t.Fatal(err)
	}
	client2 := netip.MustParseAddr("10.100.0.3")
	sport := uint16(20000)
	flow := func(src netip.Addr) netip.Addr {
		t.Helper()
		sport++
		_, out := runProg(t, ns, p.objs.XlbIngress, pktSpec{src: src, sport: sport, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
		got, err := parse(out)
		if err != nil {
			t.Fatal(err)
		}
		return got.dst
	}
	if got := flow(client); got != be1 {
		t.Fatalf("first flow to %s, want %s", got, be1)
	}
	if got := flow(client2); got != be2 {
		t.Fatalf("another client's flow to %s, want %s (rr)", got, be2)
	}
	for i := range 4 {
		if got := flow(client); got != be1 {
			t.Errorf("persistent flow %d went to %s, want %s", i, got, be1)
		}
	}
	// A new generation of the farm (a third backend) keeps the client's backend.
	f2 := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	f2.Persistence, f2.PersistTTL = model.KeySrcIP, 2
	if err := p.Apply(ctx, diffOf(f1, f2)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got := flow(client); got != be1 {
			t.Errorf("after the farm changed, persistent flow %d went to %s, want %s", i, got, be1)
		}
	}
	st, _ := p.Stats()
	if st["persist_hit"] != 7 {
		t.Errorf("persist_hit = %d, want 7", st["persist_hit"])
	}
	// Without be1, the client is scheduled again (and sticks to the new one).
	f3 := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.12:8080", "10.200.0.13:8080")
	f3.Persistence, f3.PersistTTL = model.KeySrcIP, 2
	if err := p.Apply(ctx, diffOf(f2, f3)); err != nil {
		t.Fatal(err)
	}
	next := flow(client)
	if next == be1 {
		t.Fatalf("flow went to removed backend %s", be1)
	}
	if got := flow(client); got != next {
		t.Errorf("new persistent backend %s not kept: %s", next, got)
	}
	// After the TTL the record is ignored (the scheduler decides), and the
	// flow makes a new one.
	hits := func() uint64 { st, _ := p.Stats(); return st["persist_hit"] }
	h0 := hits()
	time.Sleep(2100 * time.Millisecond)
	flow(client)
	if h := hits(); h != h0 {
		t.Errorf("persistence used after its TTL (persist_hit %d -> %d)", h0, h)
	}
	flow(client)
	if h := hits(); h != h0+1 {
		t.Errorf("no new persistence record after the TTL (persist_hit %d -> %d)", h0, h)
	}
}
