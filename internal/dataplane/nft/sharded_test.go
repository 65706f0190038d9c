package nft

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestShardedPlane: farms spread over several tables, one Apply touching
// several tables is one batch, traffic reaches every farm, a restarted
// plane reconciles each table, and a deleted farm leaves nothing behind.
func TestShardedPlane(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	e := newEnv(t, 2, false)
	e.startServers(t, 8080)
	s, err := NewSharded(context.Background(), testLogger(), Options{NetNS: e.LB.NS, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	var d dataplane.Diff
	farms := map[string]*model.Farm{}
	for i := 1; i <= 8; i++ {
		f := e.farm(fmt.Sprintf("web%d", i), testutil.VIP4(i), 80, model.ProtoTCP, 8080)
		nf := mustValid(t, e.p, &f)
		farms[nf.Name] = nf
		d.Changes = append(d.Changes, dataplane.FarmChange{New: nf})
	}
	if err := s.Apply(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{}
	for name := range farms {
		used[s.shardOf(name)] = true
	}
	if len(used) < 2 {
		t.Fatalf("8 farms landed in %d table(s): the test cannot see sharding", len(used))
	}
	ask := func(when string) {
		t.Helper()
		for i := 1; i <= 8; i++ {
			if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(testutil.VIP4(i), 80)); err != nil {
				t.Fatalf("%s: farm web%d: %v", when, i, err)
			}
		}
	}
	ask("after apply")
	for i := range 4 {
		out := e.nft(t, "list", "table", "inet", ShardTable(DefaultTable, i))
		n := strings.Count(out, "chain f-")
		want := 0
		for name := range farms {
			if s.shardOf(name) == i {
				want++
			}
		}
		if n != want {
			t.Errorf("table %s has %d farm chains, want %d:\n%s", ShardTable(DefaultTable, i), n, want, out)
		}
	}

	// Restart: a new plane adopts the tables and reconciles them.
	s.Close()
	s2, err := NewSharded(context.Background(), testLogger(), Options{NetNS: e.LB.NS, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	var all []*model.Farm
	for _, f := range farms {
		all = append(all, f)
	}
	if err := s2.Reconcile(context.Background(), all); err != nil {
		t.Fatal(err)
	}
	ask("after restart")

	// Delete every farm in one Apply: nothing of them is left.
	d = dataplane.Diff{}
	for _, f := range farms {
		d.Changes = append(d.Changes, dataplane.FarmChange{Old: f})
	}
	if err := s2.Apply(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if out := e.nft(t, "list", "ruleset"); strings.Contains(out, "chain f-") || strings.Contains(out, "10.99.0.") {
		t.Errorf("deleted farms left objects behind:\n%s", out)
	}
}

// TestShardedApplyIsOneBatch: when the kernel refuses one table's part of
// a change, no table changes.
func TestShardedApplyIsOneBatch(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	e := newEnv(t, 1, false)
	s, err := NewSharded(context.Background(), testLogger(), Options{NetNS: e.LB.NS, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// Two farms in different tables; the second's table is deleted by
	// hand first, so its part of the batch fails in the kernel.
	var a, b *model.Farm
	for i := 1; b == nil; i++ {
		f := e.farm(fmt.Sprintf("f%d", i), testutil.VIP4(i), 80, model.ProtoTCP, 8080)
		nf := mustValid(t, e.p, &f)
		switch {
		case a == nil:
			a = nf
		case s.shardOf(nf.Name) != s.shardOf(a.Name):
			b = nf
		}
	}
	e.nft(t, "delete", "table", "inet", ShardTable(DefaultTable, s.shardOf(b.Name)))
	before := e.nft(t, "list", "table", "inet", ShardTable(DefaultTable, s.shardOf(a.Name)))
	err = s.Apply(context.Background(), dataplane.Diff{Changes: []dataplane.FarmChange{{New: a}, {New: b}}})
	if err == nil {
		t.Fatal("apply into a deleted table succeeded")
	}
	if after := e.nft(t, "list", "table", "inet", ShardTable(DefaultTable, s.shardOf(a.Name))); after != before {
		t.Errorf("the other table changed although the batch failed:\n%s\nwas:\n%s", after, before)
	}
	// The plane still works after the failure (new connection).
	if err := s.Reconcile(context.Background(), []*model.Farm{a}); err != nil {
		t.Fatal(err)
	}
	if out := e.nft(t, "list", "table", "inet", ShardTable(DefaultTable, s.shardOf(a.Name))); !strings.Contains(out, a.VirtualAddr.String()+" . tcp . 80 : goto "+chainDir4) {
		t.Errorf("farm a missing after reconcile:\n%s", out)
	}
}
