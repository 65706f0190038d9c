package nft

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
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
	s, err := New(context.Background(), testLogger(), Options{NetNS: e.LB.NS, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	var d plan.Diff
	farms := map[string]*model.Farm{}
	for i := 1; i <= 8; i++ {
		f := e.farm(fmt.Sprintf("web%d", i), testutil.VIP4(i), 80, model.ProtoTCP, 8080)
		nf := mustValid(t, e.p, &f)
		farms[nf.Name] = nf
		d.Changes = append(d.Changes, plan.FarmChange{New: nf})
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
		n := strings.Count(out, "chain f-") + strings.Count(out, `comment "farm `)
		want := 0
		for name := range farms {
			if s.shardOf(name) == i {
				want++
			}
		}
		if n != want {
			t.Errorf("table %s has %d farms, want %d:\n%s", ShardTable(DefaultTable, i), n, want, out)
		}
	}

	// Restart: a new plane adopts the tables and reconciles them.
	s.Close()
	s2, err := New(context.Background(), testLogger(), Options{NetNS: e.LB.NS, Shards: 4})
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
	d = plan.Diff{}
	for _, f := range farms {
		d.Changes = append(d.Changes, plan.FarmChange{Old: f})
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
	s, err := New(context.Background(), testLogger(), Options{NetNS: e.LB.NS, Shards: 4})
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
	err = s.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: a}, {New: b}}})
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

// A plane started with another table count deletes the tables of the old
// layout once its own hold every farm, so no old rule keeps balancing (or
// serving a farm deleted since); tables that only look alike stay.
func TestOtherLayoutIsDeleted(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	ctx := context.Background()
	f := e.farm("web", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	farm := mustValid(t, e.p, &f)
	// e.p is a one-table plane: take its farm away first.
	if err := e.p.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	e.nft(t, "add", "table", "inet", "xlb-zz")
	e.nft(t, "add", "table", "inet", "xlbx")
	tables := func() string {
		return strings.Join(strings.Fields(e.nft(t, "list", "tables")), " ")
	}

	s, err := New(ctx, testLogger(), Options{NetNS: e.LB.NS, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Reconcile(ctx, []*model.Farm{farm}); err != nil {
		t.Fatal(err)
	}
	got := tables()
	for _, want := range []string{"inet xlb-00", "netdev xlb-03", "inet xlb-zz", "inet xlbx"} {
		if !strings.Contains(got, want) {
			t.Errorf("after the 4-table reconcile: %q missing from %s", want, got)
		}
	}
	if strings.Contains(got, "table inet xlb ") || strings.HasSuffix(got, "table inet xlb") || strings.Contains(got, "netdev xlb ") {
		t.Errorf("the one-table layout's tables are still there: %s", got)
	}
	if n, _ := e.askTCP(t, netip.AddrPortFrom(testutil.VIP4(1), 80)); n != "b0" {
		t.Errorf("after the switch to 4 tables: answer from %q", n)
	}

	// Back to one table, and the farm deleted meanwhile: nothing of the
	// 4-table layout may keep serving it.
	one := newPlane(t, e.LB.NS)
	if err := one.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	got = tables()
	if strings.Contains(got, "xlb-00") || strings.Contains(got, "xlb-03") {
		t.Errorf("the 4-table layout's tables are still there: %s", got)
	}
	for _, want := range []string{"inet xlb-zz", "inet xlbx", "inet xlb"} {
		if !strings.Contains(got, want) {
			t.Errorf("after the one-table reconcile: %q missing from %s", want, got)
		}
	}
	if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(testutil.VIP4(1), 80)); err == nil {
		t.Error("the deleted farm still answers after the switch back to one table")
	}
}
