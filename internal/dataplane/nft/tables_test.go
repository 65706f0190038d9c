package nft

import (
	"context"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

func addrTable(t testing.TB, name string, id uint16, v model.ListVerdict, keys ...string) *model.Table {
	t.Helper()
	tb := model.NewTable(name, model.TableAddr)
	tb.ID, tb.Slot, tb.Verdict = id, uint32(id), v
	for _, k := range keys {
		e, err := tb.ParseEntry(model.EntryInput{Key: k}, 0)
		if err != nil {
			t.Fatal(err)
		}
		tb.PutEntry(e)
	}
	return &tb
}

// TestTablesRuleset checks the kernel objects of a policy table and a farm
// using it, as `nft list table` shows them, and that a swap rewrites the
// two tables' chains and moves no element.
func TestTablesRuleset(t *testing.T) {
	testutil.RequireRoot(t)
	name, ns := testutil.NewNetNS(t)
	tp, err := OpenTables(context.Background(), testLogger(), Options{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	ctx := context.Background()
	bl := addrTable(t, "bl", 1, model.ListDeny, "10.0.0.0/8", "10.1.2.3", "fd00::/64")
	nx := addrTable(t, "next", 2, model.ListNone, "192.0.2.0/24")
	f := model.NewFarm("web")
	f.VirtualAddr = testutil.VIP4(1)
	f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
	f.Policies = []model.PolicyRef{{Name: "bl"}}
	err = tp.ApplyTables(ctx, plan.TableDiff{
		Tables: []plan.TableChange{{New: bl}, {New: nx}},
		Slots:  []plan.SlotChange{{Slot: 1, New: bl}, {Slot: 2, New: nx}},
		Farms:  []plan.FarmChange{{New: &f}},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := testutil.Run(t, name, "nft", "list", "table", "inet", "xlb-tables")
	for _, want := range []string{
		"set s1-4-8 {", "elements = { 10.0.0.0 counter packets 0 bytes 0 }", "set s1-4-32 {", "elements = { 10.1.2.3 counter packets 0 bytes 0 }", "set s1-6-64 {",
		"ip saddr & 255.0.0.0 == @s1-4-8 drop", "ip saddr @s1-4-32 drop", "ip6 saddr & ffff:ffff:ffff:ffff:: == @s1-6-64 drop",
		"jump t1", "hook prerouting priority dstnat - 10",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, out)
		}
	}
	na, nn := bl.WithEntriesOf(nx), nx.WithEntriesOf(bl)
	if err := tp.ApplyTables(ctx, plan.TableDiff{Tables: []plan.TableChange{{Old: bl, New: &na}, {Old: nx, New: &nn}}}); err != nil {
		t.Fatal(err)
	}
	out = testutil.Run(t, name, "nft", "list", "chain", "inet", "xlb-tables", "t1")
	if !strings.Contains(out, "ip saddr & 255.255.255.0 == @s2-4-24 drop") || strings.Contains(out, "s1-") {
		t.Errorf("after swap t1 is\n%s", out)
	}
	// Reconcile repairs an element deleted by hand.
	testutil.Run(t, name, "nft", "delete", "element", "inet", "xlb-tables", "s2-4-24", "{ 192.0.2.0 }")
	if err := tp.ReconcileTables(ctx, []*model.Table{&na, &nn}, []*model.Farm{&f}); err != nil {
		t.Fatal(err)
	}
	out = testutil.Run(t, name, "nft", "list", "set", "inet", "xlb-tables", "s2-4-24")
	if !strings.Contains(out, "192.0.2.0") {
		t.Errorf("reconcile did not restore the element:\n%s", out)
	}
}

// TestTablesDetachAndDestroy: one change that takes a table off its last
// farm and destroys it is applied (the farm's policy chain goes before the
// table's chain it jumps to; the other order is refused with EBUSY).
func TestTablesDetachAndDestroy(t *testing.T) {
	testutil.RequireRoot(t)
	name, ns := testutil.NewNetNS(t)
	tp, err := OpenTables(context.Background(), testLogger(), Options{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	ctx := context.Background()
	al := addrTable(t, "al", 1, model.ListAllow, "203.0.113.0/25")
	f := model.NewFarm("web")
	f.VirtualAddr = testutil.VIP4(1)
	f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
	f.Policies = []model.PolicyRef{{Name: "al"}}
	if err := tp.ApplyTables(ctx, plan.TableDiff{Tables: []plan.TableChange{{New: al}}, Slots: []plan.SlotChange{{Slot: 1, New: al}},
		Farms: []plan.FarmChange{{New: &f}}}); err != nil {
		t.Fatal(err)
	}
	nf := f.Clone()
	nf.Policies = nil
	if err := tp.ApplyTables(ctx, plan.TableDiff{Tables: []plan.TableChange{{Old: al}}, Slots: []plan.SlotChange{{Slot: 1, Old: al}},
		Farms: []plan.FarmChange{{Old: &f, New: &nf}}}); err != nil {
		t.Fatalf("detach and destroy in one change: %v", err)
	}
	if out := testutil.Run(t, name, "nft", "list", "table", "inet", "xlb-tables"); strings.Contains(out, "chain t1") || strings.Contains(out, "s1-4-25") {
		t.Errorf("table al left in the kernel:\n%s", out)
	}
}
