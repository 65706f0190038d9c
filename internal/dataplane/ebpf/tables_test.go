package ebpf

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

const (
	xdpDrop     = 1 // XDP_DROP
	xdpPass     = 2 // XDP_PASS
	xdpRedirect = 4 // XDP_REDIRECT
)

// addrTable builds an addr table as the engine would hand it over.
func addrTable(tb testing.TB, name string, v model.ListVerdict, id uint16, slot uint32, keys ...string) *model.Table {
	tb.Helper()
	t := model.NewTable(name, model.TableAddr)
	t.Verdict, t.ID, t.Slot = v, id, slot
	for _, k := range keys {
		e, err := t.ParseEntry(model.EntryInput{Key: k}, 0)
		if err != nil {
			tb.Fatal(err)
		}
		t.PutEntry(e)
	}
	return &t
}

// created is the diff that creates tables.
func created(ts ...*model.Table) plan.TableDiff {
	var d plan.TableDiff
	for _, t := range ts {
		d.Tables = append(d.Tables, plan.TableChange{New: t})
		d.Slots = append(d.Slots, plan.SlotChange{Slot: t.Slot, New: t})
	}
	return d
}

func applyTables(tb testing.TB, p *Plane, d plan.TableDiff) {
	tb.Helper()
	if err := p.ApplyTables(context.Background(), d); err != nil {
		tb.Fatalf("apply tables: %v", err)
	}
}

// TestTablePolicies runs packets through both programs (tcx and XDP) with
// BPF_PROG_TEST_RUN: a blacklisted client is dropped by each, another
// passes; the entry's counters count the drops; a swap with an empty table
// lets the client through; detaching the policy stops the lookups.
func TestTablePolicies(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	farms := fixtureFarms(t)
	web := farms[0].Clone()
	web.Policies = []model.PolicyRef{{Name: "bl"}}
	if err := p.Check(&web); err != nil {
		t.Fatalf("check farm with a policy: %v", err)
	}
	bl := addrTable(t, "bl", model.ListDeny, 1, 1, client.String(), "fd00::/64")
	next := addrTable(t, "next", model.ListNone, 2, 2)
	d := created(bl, next)
	d.Farms = []plan.FarmChange{{New: &web}}
	applyTables(t, p, d)
	if p.tbls.noBatch {
		t.Errorf("the kernel refused batch updates of an LPM trie (kernel 6.18 takes them)")
	}
	farms[0] = &web
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	syn := func(src netip.Addr, sport uint16) []byte {
		return pktSpec{src: src, dst: vip1, sport: sport, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build()
	}
	denied, allowed := syn(client, 41000), syn(other, 41000)
	if v, _ := runProg(t, ns, p.objs.XlbIngress, denied); v != verdictDrop {
		t.Errorf("tcx: blacklisted client: verdict %d, want drop (%d)", v, verdictDrop)
	}
	if v, _ := runProg(t, ns, p.objs.XlbXdp, denied); v != xdpDrop {
		t.Errorf("xdp: blacklisted client: verdict %d, want XDP_DROP", v)
	}
	if v, _ := runProg(t, ns, p.objs.XlbIngress, allowed); v != verdictRedirect {
		t.Errorf("tcx: other client: verdict %d, want redirect (%d)", v, verdictRedirect)
	}
	if v, _ := runProg(t, ns, p.objs.XlbXdp, allowed); v != xdpPass {
		t.Errorf("xdp: other client: verdict %d, want XDP_PASS", v)
	}
	// The other farm on the VIP (dns, udp) has no policy.
	dns := pktSpec{src: client, dst: vip1, sport: 41000, dport: 53, proto: protoUDP}.build()
	if v, _ := runProg(t, ns, p.objs.XlbIngress, dns); v != verdictRedirect {
		t.Errorf("tcx: farm without policies: verdict %d, want redirect", v)
	}

	cs, err := p.TableCounters(context.Background(), bl)
	if err != nil {
		t.Fatal(err)
	}
	key := model.AddrKey(netip.PrefixFrom(client, 32))
	if c := cs[key]; c.Packets != 2 || c.Bytes != 2*uint64(len(denied)-14) {
		t.Errorf("counters of %s: %+v, want 2 packets of %d bytes", client, c, len(denied)-14)
	}
	if len(cs) != 1 {
		t.Errorf("counters: %d entries counted, want 1: %v", len(cs), cs)
	}

	// A value-less table's entries replaced keep their counters: swap
	// the policy with the empty table, and back.
	na, nb := bl.WithEntriesOf(next), next.WithEntriesOf(bl)
	applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: bl, New: &na}, {Old: next, New: &nb}}})
	if v, _ := runProg(t, ns, p.objs.XlbIngress, syn(client, 41001)); v != verdictRedirect {
		t.Errorf("after swap with an empty table: verdict %d, want redirect", v)
	}
	if cs, _ := p.TableCounters(context.Background(), &nb); cs[key].Packets != 2 {
		t.Errorf("the swapped entries' counters: %+v, want 2 packets (they move with the entries)", cs[key])
	}
	applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: &na, New: bl}, {Old: &nb, New: next}}})
	if v, _ := runProg(t, ns, p.objs.XlbIngress, syn(client, 41002)); v != verdictDrop {
		t.Errorf("swapped back: verdict %d, want drop", v)
	}

	// Detached: no policy key left, no lookup.
	plain := farms[0].Clone()
	plain.Policies = nil
	applyTables(t, p, plan.TableDiff{Farms: []plan.FarmChange{{Old: &web, New: &plain}}})
	if v, _ := runProg(t, ns, p.objs.XlbIngress, syn(client, 41003)); v != verdictRedirect {
		t.Errorf("policy detached: verdict %d, want redirect", v)
	}
	var conf uint32
	if err := p.objs.XlbTblConf.Lookup(uint32(0), &conf); err != nil || conf&(tblConfPort|tblConfAnyPort) != 0 {
		t.Errorf("policy flags with no farm using policies: %#x (%v), want none", conf, err)
	}
	if n, _ := countKeys(p.objs.XlbTblPolicy); n != 0 {
		t.Errorf("policy keys left: %d", n)
	}
}

// TestTablePolicyCache: a tracked flow that passed its farm's policies
// passes without a lookup until a change of tables; a client added to the
// deny list is cut off from its established flow at its next packet (the
// policy generation moved on), and so after the generation wraps (every
// entry's recorded generation cleared, so none matches a later one).
func TestTablePolicyCache(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	farms := fixtureFarms(t)
	web := farms[0].Clone()
	web.Policies = []model.PolicyRef{{Name: "bl"}}
	bl := addrTable(t, "bl", model.ListDeny, 1, 1, "192.0.2.0/24")
	d := created(bl)
	d.Farms = []plan.FarmChange{{New: &web}}
	applyTables(t, p, d)
	farms[0] = &web
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	pkt := func(flags uint8) []byte {
		return pktSpec{src: other, dst: vip1, sport: 42000, dport: 80, proto: protoTCP, tcpFlags: flags, payload: []byte("x")}.build()
	}
	entryGen := func() uint32 {
		var v xlbCtVal
		k := xlbCtKey{Src: [4]uint32{ne32(other)}, Dst: [4]uint32{ne32(vip1)}, Sport: ne16(42000), Dport: ne16(80), Proto: protoTCP, Family: afInet}
		if err := p.objs.XlbCt.Lookup(k, &v); err != nil {
			t.Fatalf("the flow's entry: %v", err)
		}
		return uint32(v.NhFlags) >> 1
	}
	if v, _ := runProg(t, ns, p.objs.XlbIngress, pkt(tcpSYN)); v != verdictRedirect {
		t.Fatalf("syn: verdict %d, want redirect", v)
	}
	if v, _ := runProg(t, ns, p.objs.XlbIngress, pkt(tcpACK)); v != verdictRedirect {
		t.Fatalf("ack: verdict %d, want redirect", v)
	}
	if g := entryGen(); g != p.tbls.gen || g == 0 {
		t.Errorf("the flow's recorded generation is %d, want the current %d", g, p.tbls.gen)
	}
	// An unrelated entry added: the generation moves on, the flow is
	// checked again and passes.
	next := bl.Clone()
	e, _ := next.ParseEntry(model.EntryInput{Key: "198.51.100.0/24"}, 0)
	next.PutEntry(e)
	applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: bl, New: &next}},
		Slots: []plan.SlotChange{{Slot: 1, Old: bl, New: &next, Put: []model.TableEntry{e}}}})
	if v, _ := runProg(t, ns, p.objs.XlbIngress, pkt(tcpACK)); v != verdictRedirect {
		t.Errorf("after an unrelated change: verdict %d, want redirect", v)
	}
	if g := entryGen(); g != p.tbls.gen {
		t.Errorf("after a recheck the recorded generation is %d, want %d", g, p.tbls.gen)
	}
	// The client added: its established flow is cut off at once.
	deny := func(from *model.Table) *model.Table {
		nt := from.Clone()
		e, _ := nt.ParseEntry(model.EntryInput{Key: other.String()}, 0)
		nt.PutEntry(e)
		applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: from, New: &nt}},
			Slots: []plan.SlotChange{{Slot: 1, Old: from, New: &nt, Put: []model.TableEntry{e}}}})
		return &nt
	}
	undeny := func(from *model.Table) *model.Table {
		nt := from.Clone()
		e, _ := nt.DeleteEntry(model.AddrKey(netip.PrefixFrom(other, 32)))
		applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: from, New: &nt}},
			Slots: []plan.SlotChange{{Slot: 1, Old: from, New: &nt, Del: []model.TableEntry{e}}}})
		return &nt
	}
	cur := deny(&next)
	for i := range 3 {
		if v, _ := runProg(t, ns, p.objs.XlbIngress, pkt(tcpACK)); v != verdictDrop {
			t.Errorf("packet %d of an established flow after its client was denied: verdict %d, want drop", i, v)
		}
	}
	// Across a wrap of the generation: the flow passes at generation 127,
	// the generations restart, the client is denied at a later generation
	// equal to none an entry holds.
	cur = undeny(cur)
	p.mu.Lock()
	p.tbls.gen = tblGenMax - 2
	p.mu.Unlock()
	cur = undeny(deny(cur)) // two changes: generation 127
	if p.tbls.gen != tblGenMax {
		t.Fatalf("generation %d, want %d", p.tbls.gen, tblGenMax)
	}
	if v, _ := runProg(t, ns, p.objs.XlbIngress, pkt(tcpACK)); v != verdictRedirect || entryGen() != tblGenMax {
		t.Fatalf("at generation %d: verdict %d, recorded %d", tblGenMax, v, entryGen())
	}
	cur = deny(cur) // wraps: generation 1, entries cleared
	if p.tbls.gen != 1 || entryGen() != 0 {
		t.Errorf("after the wrap: generation %d, the flow's %d; want 1 and 0", p.tbls.gen, entryGen())
	}
	if v, _ := runProg(t, ns, p.objs.XlbIngress, pkt(tcpACK)); v != verdictDrop {
		t.Errorf("after the wrap: verdict %d, want drop", v)
	}
	_ = cur
}

// TestTablesRestart: a plane closed and opened again (a daemon restart)
// keeps filtering from the new program's first packet, before any
// reconcile; the reconcile then repairs a trie edited by hand (a deleted
// entry back, a stray one gone) and keeps the entries' counters.
func TestTablesRestart(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	pin := mountBPFFS(t)
	p := newPlane(t, ns, pin, []string{"front"}, 4096)
	farms := fixtureFarms(t)
	web := farms[0].Clone()
	web.Policies = []model.PolicyRef{{Name: "bl"}}
	farms[0] = &web
	bl := addrTable(t, "bl", model.ListDeny, 7, 3, client.String(), "10.100.9.0/24")
	d := created(bl)
	d.Farms = []plan.FarmChange{{New: &web}}
	applyTables(t, p, d)
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	syn := func(src netip.Addr, sport uint16) []byte {
		return pktSpec{src: src, dst: vip1, sport: sport, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build()
	}
	if v, _ := runProg(t, ns, p.objs.XlbIngress, syn(client, 42000)); v != verdictDrop {
		t.Fatalf("before restart: verdict %d, want drop", v)
	}
	p.Close()

	q := newPlane(t, ns, pin, []string{"front"}, 4096)
	if v, _ := runProg(t, ns, q.objs.XlbIngress, syn(client, 42001)); v != verdictDrop {
		t.Errorf("restarted, before reconcile: verdict %d, want drop", v)
	}
	// Hand edits: the client's entry deleted, a stray one added.
	var bind xlbTblBind
	if err := q.objs.XlbTblMeta.Lookup(uint32(7), &bind); err != nil || bind.Slot == 0 {
		t.Fatalf("table id 7 is not bound: %+v (%v)", bind, err)
	}
	var trie *ebpf.Map
	if err := q.objs.XlbTblAddr4.Lookup(bind.Slot, &trie); err != nil {
		t.Fatalf("find the bound trie: %v", err)
	}
	defer trie.Close()
	if err := trie.Delete(xlbTblKey4{Prefixlen: 32, Addr: ne32(client)}); err != nil {
		t.Fatal(err)
	}
	if err := trie.Put(xlbTblKey4{Prefixlen: 32, Addr: ne32(other)}, xlbTblVal{}); err != nil {
		t.Fatal(err)
	}
	if err := q.ReconcileTables(context.Background(), []*model.Table{bl}, farms); err != nil {
		t.Fatalf("reconcile tables: %v", err)
	}
	if err := q.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	if v, _ := runProg(t, ns, q.objs.XlbIngress, syn(client, 42002)); v != verdictDrop {
		t.Errorf("deleted entry repaired: verdict %d, want drop", v)
	}
	if v, _ := runProg(t, ns, q.objs.XlbIngress, syn(other, 42002)); v != verdictRedirect {
		t.Errorf("stray entry removed: verdict %d, want redirect", v)
	}
	// The trie was adopted (the same map), so the /24's counters stay.
	if err := q.objs.XlbTblAddr4.Lookup(bind.Slot, &trie); err != nil {
		t.Fatal(err)
	}
	info, _ := trie.Info()
	if info.Name != "xt4_3" {
		t.Errorf("bound trie is %q, want xt4_3", info.Name)
	}
	objs, err := q.KernelObjects(context.Background())
	if err != nil || len(objs) != 3 {
		t.Errorf("kernel inventory: %q (%v), want services, tables and policies", objs, err)
	}
	// Nothing saved: everything goes.
	if err := q.ReconcileTables(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if idxs, _ := placedIndices(q.objs.XlbTblAddr4); len(idxs) != 0 {
		t.Errorf("tries left after reconciling no tables: %v", idxs)
	}
	if err := q.objs.XlbTblMeta.Lookup(uint32(7), &bind); err != nil || bind != (xlbTblBind{}) {
		t.Errorf("table id 7 still bound: %+v (%v)", bind, err)
	}
	if v, _ := runProg(t, ns, q.objs.XlbIngress, syn(client, 42003)); v != verdictRedirect {
		t.Errorf("no tables: verdict %d, want redirect", v)
	}
}

// TestTableValueKeepsCounters: replacing an entry's value (mark) keeps
// what it counted; a failed change takes back what it did.
func TestTableValueKeepsCounters(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	tb := addrTable(t, "m", model.ListNone, 1, 1)
	tb.Values = model.ValMark
	e, err := tb.ParseEntry(model.EntryInput{Key: "10.0.0.0/8", Value: "mark=5", ValueSet: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tb.PutEntry(e)
	applyTables(t, p, created(tb))
	trie := p.tbls.slots[1].v4
	k := xlbTblKey4{Prefixlen: 8, Addr: ne32(netip.MustParseAddr("10.0.0.0"))}
	if err := trie.Put(k, xlbTblVal{Packets: 9, Bytes: 900, Mark: 5}); err != nil {
		t.Fatal(err)
	}
	nt := tb.Clone()
	e2, _ := nt.ParseEntry(model.EntryInput{Key: "10.0.0.0/8", Value: "mark=6", ValueSet: true}, 0)
	nt.PutEntry(e2)
	applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: tb, New: &nt}},
		Slots: []plan.SlotChange{{Slot: 1, Old: tb, New: &nt, Put: []model.TableEntry{e2}, Replaced: []model.TableEntry{e}}}})
	var v xlbTblVal
	if err := trie.Lookup(k, &v); err != nil {
		t.Fatal(err)
	}
	if v.Mark != 6 || v.Packets != 9 || v.Bytes != 900 {
		t.Errorf("entry after a value change: %+v, want mark 6 with 9 packets, 900 bytes", v)
	}
}
