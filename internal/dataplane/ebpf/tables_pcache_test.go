package ebpf

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// runProgCPU0 is runProg on CPU 0: the program's per-CPU copies of farms'
// policies (xlb_tbl_pcache) are then the same from one run to the next, so
// a stale copy would show.
func runProgCPU0(tb testing.TB, ns netns.NsHandle, prog *ebpf.Program, pkt []byte) uint32 {
	tb.Helper()
	var ret uint32
	err := testutil.Do(ns, func() error {
		var old, one unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			return err
		}
		one.Set(0)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return err
		}
		defer unix.SchedSetaffinity(0, &old) //nolint:errcheck // the thread is the nsenter's own
		var err error
		ret, err = prog.Run(&ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256)})
		return err
	})
	if err != nil {
		tb.Fatalf("BPF_PROG_TEST_RUN on CPU 0: %v", err)
	}
	return ret
}

// TestTablePolicyCacheStateless: a stateless farm's packets find their
// farm's policies through a per-CPU copy (tbl_key_refs), which must never
// answer stale: a farm given a policy drops a denied client at its very
// next packet, a client added to the farm's deny list is dropped at its
// next packet, a detached policy stops dropping at once, and a copy made
// under generation 1 before the generation wrapped is not trusted under
// the generation 1 after it (the copies are cleared: clearPolicyCache).
// All runs on CPU 0, whose copies are the ones the earlier runs made.
func TestTablePolicyCacheStateless(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	farms := fixtureFarms(t)
	stl := farm(t, "stl", "10.99.0.5", 53, model.ProtoUDP, model.ModeStlsDNAT, model.SchedRR, "10.200.0.11:5353")
	farms = append(farms, stl)
	// web has the deny list (holding client), so policies are looked up
	// for every packet; stl has none yet.
	web := farms[0].Clone()
	web.Policies = []model.PolicyRef{{Name: "bl"}}
	bl := addrTable(t, "bl", model.ListDeny, 1, 1, client.String())
	d := created(bl)
	d.Farms = []plan.FarmChange{{New: &web}}
	applyTables(t, p, d)
	farms[0] = &web
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("10.99.0.5")
	pkt := func(src netip.Addr) []byte {
		return pktSpec{src: src, dst: vip, sport: 43000, dport: 53, proto: protoUDP, payload: []byte("x")}.build()
	}
	want := func(what string, src netip.Addr, drop bool) {
		t.Helper()
		for i := range 2 { // the first fills the copy, the second reads it
			v := runProgCPU0(t, ns, p.objs.XlbIngress, pkt(src))
			if (v == verdictDrop) != drop {
				t.Errorf("%s: packet %d from %s: verdict %d, drop %v", what, i, src, v, drop)
			}
		}
	}
	setPolicies := func(from *model.Farm, names ...string) *model.Farm {
		nf := from.Clone()
		nf.Policies = nil
		for _, n := range names {
			nf.Policies = append(nf.Policies, model.PolicyRef{Name: n})
		}
		applyTables(t, p, plan.TableDiff{Farms: []plan.FarmChange{{Old: from, New: &nf}}})
		return &nf
	}
	want("stl without policies", client, false)
	cur := setPolicies(stl, "bl")
	want("stl given the deny list", client, true)
	want("stl given the deny list, another client", other, false)
	// other added to the list: dropped at its next packet.
	nb := bl.Clone()
	e, _ := nb.ParseEntry(model.EntryInput{Key: other.String()}, 0)
	nb.PutEntry(e)
	applyTables(t, p, plan.TableDiff{Tables: []plan.TableChange{{Old: bl, New: &nb}},
		Slots: []plan.SlotChange{{Slot: 1, Old: bl, New: &nb, Put: []model.TableEntry{e}}}})
	want("client added to the list", other, true)
	cur = setPolicies(cur)
	want("policy detached", client, false)
	// Across a wrap: a copy "stl has no policies" made at generation 1
	// after one wrap must not answer at generation 1 after the next, when
	// stl has the deny list.
	wrap := func(d plan.TableDiff) {
		t.Helper()
		p.mu.Lock()
		p.tbls.gen = tblGenMax
		p.mu.Unlock()
		applyTables(t, p, d)
		if p.tbls.gen != 1 {
			t.Fatalf("generation %d after a wrap, want 1", p.tbls.gen)
		}
	}
	wrap(plan.TableDiff{})
	want("no policies, generation 1", client, false)
	nf := cur.Clone()
	nf.Policies = []model.PolicyRef{{Name: "bl"}}
	wrap(plan.TableDiff{Farms: []plan.FarmChange{{Old: cur, New: &nf}}})
	want("the deny list given at generation 1 after the next wrap", client, true)
}
