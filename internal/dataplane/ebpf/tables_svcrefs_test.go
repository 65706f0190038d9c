package ebpf

import (
	"context"
	"maps"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestTablePolicyFromService: a stateless farm's packet takes its farm's
// policy ids from its service's value (tables_svcrefs.go, tbl_svc_refs):
// the value carries them under the current refs generation once the
// policies are applied; a packet is dropped by them with the farm's
// xlb_tbl_policy key gone (so the program did not look it up); a value
// stamped with another generation is not trusted (the key is looked up
// again); detaching the policy rewrites the value in the same apply; a
// change of the table's entries and a swap leave every service alone (the
// refs generation does not move).
//
// TestTablePolicyTouchedServices covers which services a change of
// policies writes.
func TestTablePolicyFromService(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	stl := farm(t, "stl", "10.99.0.5", 53, model.ProtoUDP, model.ModeStlsDNAT, model.SchedRR, "10.200.0.11:5353")
	stl.Policies = []model.PolicyRef{{Name: "bl"}}
	bl := addrTable(t, "bl", model.ListDeny, 1, 1, client.String())
	empty := addrTable(t, "empty", model.ListDeny, 2, 2)
	d := created(bl, empty)
	d.Farms = []plan.FarmChange{{New: stl}}
	applyTables(t, p, d)
	if err := p.Reconcile(context.Background(), []*model.Farm{stl}); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.99.0.5")
	key := xlbSvcKey{Addr: addrWords(vip), Port: ne16(53), Proto: protoUDP, Family: familyOf(vip)}
	pkt := func(src netip.Addr) []byte {
		return pktSpec{src: src, dst: vip, sport: 43000, dport: 53, proto: protoUDP, payload: []byte("x")}.build()
	}
	want := func(what string, src netip.Addr, drop bool) {
		t.Helper()
		for i := range 2 { // the second reads what the first left (this CPU's copies)
			v := runProgCPU0(t, ns, p.objs.XlbIngress, pkt(src))
			if (v == verdictDrop) != drop {
				t.Errorf("%s: packet %d from %s: verdict %d, drop %v", what, i, src, v, drop)
			}
		}
	}
	value := func() xlbSvcVal { return serviceValue(t, p, key) }
	refs := func() uint16 { return refsGen(p) }
	v := value()
	if v.TblGen == 0 || v.TblGen != refs() || v.TblN != 1 || v.TblIds[0] != bl.ID {
		t.Fatalf("service value carries ids %v (n %d) under %d, want [%d] under %d", v.TblIds, v.TblN, v.TblGen, bl.ID, refs())
	}
	want("deny list", client, true)
	want("deny list, another client", other, false)

	// The farm's policy key gone, and the copies of it not trusted (the
	// policy generation moved on): the service's value still drops.
	var pol xlbTblPolicy
	if err := p.objs.XlbTblPolicy.Lookup(key, &pol); err != nil {
		t.Fatal(err)
	}
	if err := p.objs.XlbTblPolicy.Delete(key); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	err := p.bumpGen()
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	want("policy key gone, ids in the service", client, true)

	// A value stamped with another refs generation is not trusted: its
	// "no policies" is not believed, the key (back) is looked up.
	if err := p.objs.XlbTblPolicy.Put(key, pol); err != nil {
		t.Fatal(err)
	}
	stale := v
	stale.TblIds, stale.TblN, stale.TblGen = [8]uint16{}, 0, v.TblGen+1
	if err := p.objs.XlbServices.Put(key, stale); err != nil {
		t.Fatal(err)
	}
	want("stale stamp", client, true)
	// The same "no policies" under the current stamp is believed.
	stale.TblGen = v.TblGen
	if err := p.objs.XlbServices.Put(key, stale); err != nil {
		t.Fatal(err)
	}
	want("current stamp, no ids", client, false)

	// An entry added and a swap move no refs generation and touch no
	// service; the entry drops at the next packet all the same.
	before := refs()
	nb := bl.Clone()
	e, _ := nb.ParseEntry(model.EntryInput{Key: other.String()}, 0)
	nb.PutEntry(e)
	applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: bl, New: &nb}},
		Slots: []plan.SlotChange{{Slot: 1, Old: bl, New: &nb, Put: []model.TableEntry{e}}}})
	if refs() != before {
		t.Errorf("an entry's change moved the refs generation %d -> %d", before, refs())
	}
	if got := value(); got != stale {
		t.Errorf("an entry's change rewrote the service: %+v", got)
	}
	v.TblGen = before
	if err := p.objs.XlbServices.Put(key, v); err != nil {
		t.Fatal(err)
	}
	want("entry added", other, true)

	// A swap with the empty table: bl's id stays, its entries go; no
	// service is rewritten, and bl's farm stops dropping at once.
	nx, ny := nb.WithEntriesOf(empty), empty.WithEntriesOf(&nb)
	applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: &nb, New: &nx}, {Old: empty, New: &ny}}})
	if refs() != before {
		t.Errorf("a swap moved the refs generation %d -> %d", before, refs())
	}
	if got := value(); got != v {
		t.Errorf("a swap rewrote the service: %+v, want %+v", got, v)
	}
	want("swapped with an empty table", client, false)

	// Detached: the service's value says so in the same apply, under the
	// same refs generation (which only a start moves on).
	nf := stl.Clone()
	nf.Policies = nil
	applyTables(t, p, plan.TableDiff{Farms: []plan.FarmChange{{Old: stl, New: &nf}}})
	if refs() != before {
		t.Errorf("detaching a policy moved the refs generation %d -> %d", before, refs())
	}
	if got := value(); got.TblN != 0 || got.TblGen != refs() {
		t.Errorf("after the detach the service carries ids %v (n %d) under %d, want none under %d", got.TblIds, got.TblN, got.TblGen, refs())
	}
	want("policy detached", client, false)
}

// TestTablePolicyTouchedServices: a change of one farm's policies writes
// the values of the services whose policy ids it moves, and no other
// (refsTouched): attaching a deny list to a farm, or to a VIP's every-port
// farm, gives the farm's service (and the same VIP's port farm without
// policies of its own, which tbl_farm_refs answers from the every-port
// key) the table's id under the refs generation in the same apply, and
// its packets are dropped; an unrelated farm's value is not written (a
// marker put into it survives every change). Fails when the farm's own
// key is not matched (its value keeps a trusted "no policies": the packet
// passes), when the every-port key is not, and when every service is
// written again (the marker is gone).
func TestTablePolicyTouchedServices(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	mk := func(name, vip string, port uint16) *model.Farm {
		be := map[string]string{"stl": "10.200.0.11:5353", "p53": "10.200.0.12:5353", "un": "10.200.0.13:5353"}[name]
		return farm(t, name, vip, port, model.ProtoUDP, model.ModeStlsDNAT, model.SchedRR, be)
	}
	stl, any, p53, un := mk("stl", "10.99.0.5", 53), farm(t, "any", "10.99.0.6", 0, model.ProtoUDP, model.ModeStlsDNAT, model.SchedRR, "10.200.0.14:0"), mk("p53", "10.99.0.6", 53), mk("un", "10.99.0.7", 53)
	all := []*model.Farm{stl, any, p53, un}
	if err := p.Reconcile(context.Background(), all); err != nil {
		t.Fatal(err)
	}
	// As a daemon starts: the refs generation is taken up from the
	// pinned conf, and every service stamped with it.
	bl := addrTable(t, "bl", model.ListDeny, 1, 1, client.String())
	if err := p.ReconcileTables(context.Background(), []*model.Table{bl}, all); err != nil {
		t.Fatal(err)
	}
	key := func(vip string, port uint16) xlbSvcKey {
		a := netip.MustParseAddr(vip)
		return xlbSvcKey{Addr: addrWords(a), Port: ne16(port), Proto: protoUDP, Family: familyOf(a)}
	}
	value := func(k xlbSvcKey) xlbSvcVal { return serviceValue(t, p, k) }
	refs := func() uint16 { return refsGen(p) }
	carries := func(what string, k xlbSvcKey, ids ...uint16) {
		t.Helper()
		v := value(k)
		if v.TblGen != refs() || int(v.TblN) != len(ids) || (len(ids) > 0 && v.TblIds[0] != ids[0]) {
			t.Errorf("%s: service carries ids %v (n %d) under %d, want %v under %d", what, v.TblIds, v.TblN, v.TblGen, ids, refs())
		}
	}
	want := func(what, vip string, drop bool) {
		t.Helper()
		dst := netip.MustParseAddr(vip)
		for i := range 2 {
			pkt := pktSpec{src: client, dst: dst, sport: 43000, dport: 53, proto: protoUDP, payload: []byte("x")}.build()
			if v := runProgCPU0(t, ns, p.objs.XlbIngress, pkt); (v == verdictDrop) != drop {
				t.Errorf("%s: packet %d to %s: verdict %d, drop %v", what, i, vip, v, drop)
			}
		}
	}
	// The unrelated farm's marker: ids no change would give it, under
	// the current stamp.
	uk := key("10.99.0.7", 53)
	marker := value(uk)
	marker.TblIds, marker.TblN, marker.TblGen = [8]uint16{77}, 1, refs()
	if err := p.objs.XlbServices.Put(uk, marker); err != nil {
		t.Fatal(err)
	}
	untouched := func(what string) {
		t.Helper()
		if got := value(uk); got != marker {
			t.Errorf("%s: an unrelated farm's service was written again: ids %v (n %d) under %d", what, got.TblIds, got.TblN, got.TblGen)
		}
	}
	with := func(f *model.Farm) *model.Farm {
		n := f.Clone()
		n.Policies = []model.PolicyRef{{Name: "bl"}}
		return &n
	}
	before := refs()

	stlBL := with(stl)
	applyTables(t, p, plan.TableDiff{Farms: []plan.FarmChange{{Old: stl, New: stlBL}}})
	carries("attached to stl", key("10.99.0.5", 53), bl.ID)
	carries("stl attached, p53", key("10.99.0.6", 53))
	want("attached to stl", "10.99.0.5", true)
	want("attached to stl, p53", "10.99.0.6", false)
	untouched("attached to stl")

	anyBL := with(any)
	applyTables(t, p, plan.TableDiff{Farms: []plan.FarmChange{{Old: any, New: anyBL}}})
	carries("attached to every port, its own key", key("10.99.0.6", 0), bl.ID)
	carries("attached to every port, p53", key("10.99.0.6", 53), bl.ID)
	want("attached to every port, p53", "10.99.0.6", true)
	untouched("attached to every port")

	applyTables(t, p, plan.TableDiff{Farms: []plan.FarmChange{{Old: stlBL, New: stl}, {Old: anyBL, New: any}}})
	carries("detached, stl", key("10.99.0.5", 53))
	carries("detached, p53", key("10.99.0.6", 53))
	want("detached, stl", "10.99.0.5", false)
	want("detached, p53", "10.99.0.6", false)
	untouched("detached")
	if refs() != before {
		t.Errorf("a change of policies moved the refs generation %d -> %d", before, refs())
	}

	// The index of services by VIP that refsTouched reads (svcIndex)
	// follows Apply, a rolled back one too: p53 moves to another VIP
	// (the first try rolled back by a context cancelled after its first
	// change), and the every-port policy of its old VIP no longer
	// reaches it.
	checkSvcIndex(t, p)
	p53moved := mk("p53", "10.99.0.8", 53)
	un2 := mk("un", "10.99.0.9", 53)
	if err := p.Apply(&cancelAfter{Context: context.Background(), n: 1}, plan.Diff{Changes: []plan.FarmChange{{Old: p53, New: p53moved}, {Old: un, New: un2}}}); err == nil {
		t.Fatal("an apply cancelled after its first change succeeded")
	}
	checkSvcIndex(t, p)
	if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: p53, New: p53moved}}}); err != nil {
		t.Fatal(err)
	}
	checkSvcIndex(t, p)
	applyTables(t, p, plan.TableDiff{Farms: []plan.FarmChange{{Old: any, New: anyBL}}})
	carries("every port, p53 moved away", key("10.99.0.8", 53))
	want("every port, p53 moved away", "10.99.0.8", false)
	carries("every port, its own key", key("10.99.0.6", 0), bl.ID)
}

// cancelAfter is a context whose Err is nil n times, then Canceled: an
// Apply checks it before each change, so the changes after the n-th are
// rolled back.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// checkSvcIndex fails unless the plane's index of services by VIP holds
// exactly its farms' service keys.
func checkSvcIndex(t *testing.T, p *Plane) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	want := svcIndex{}
	for _, g := range p.farms {
		want.add(g)
	}
	count := func(x svcIndex) map[svcRef]int {
		m := map[svcRef]int{}
		for vip, refs := range x {
			for _, r := range refs {
				if vipKey(r.k) != vip {
					t.Errorf("service key %+v of farm %q indexed under VIP %+v", r.k, r.g.farm, vip)
				}
				m[r]++
			}
		}
		return m
	}
	if got, w := count(p.svcIdx), count(want); !maps.Equal(got, w) {
		t.Errorf("index of services by VIP: %d keys, want %d (the farms' keys)", len(got), len(w))
	}
}

// serviceValue is service k's value in xlb_services.
func serviceValue(t *testing.T, p *Plane, k xlbSvcKey) xlbSvcVal {
	t.Helper()
	var v xlbSvcVal
	if err := p.objs.XlbServices.Lookup(k, &v); err != nil {
		t.Fatalf("service: %v", err)
	}
	return v
}

// refsGen is the plane's refs generation.
func refsGen(p *Plane) uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return uint16(p.tbls.refs)
}
