package ebpf

import (
	"context"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// runProgIf runs the tcx program on pkt as if it came in on interface
// ifindex (struct __sk_buff's ifindex: the test run's device; its
// ingress_ifindex stays 0, so the program takes ifindex).
func runProgIf(tb testing.TB, ns netns.NsHandle, prog *ebpf.Program, pkt []byte, ifindex int) uint32 {
	tb.Helper()
	var ret uint32
	var ctx [11]uint32 // len, pkt_type, mark, queue_mapping, protocol, vlan_*, priority, ingress_ifindex, ifindex
	ctx[10] = uint32(ifindex)
	err := testutil.Do(ns, func() error {
		opts := ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256), Context: ctx}
		var err error
		ret, err = prog.Run(&opts)
		return err
	})
	if err != nil {
		tb.Fatalf("BPF_PROG_TEST_RUN on ifindex %d: %v", ifindex, err)
	}
	return ret
}

// TestIfaceTable: an iface table as a farm's blacklist drops packets that
// came in on a listed interface and passes the others; the names follow
// the namespace's interfaces: an interface renamed to a listed name is
// matched from then on (the link watch rewrites the hash), and renamed
// away it no longer is; the counters are the names'. Before, the farm
// was refused ("cannot match interface names").
func TestIfaceTable(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front", "back"}, 4096)
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	index := func(name string) int {
		t.Helper()
		l, err := nh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	// An interface the program is not attached to, to rename.
	if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "x0"}, PeerName: "x0-p"}); err != nil {
		t.Fatal(err)
	}
	front, back, x0 := index("front"), index("back"), index("x0")

	farms := fixtureFarms(t)
	web := farms[0].Clone()
	web.Policies = []model.PolicyRef{{Name: "ifs"}}
	ifs := model.NewTable("ifs", model.TableIface)
	ifs.Verdict, ifs.ID, ifs.Slot = model.ListDeny, 1, 1
	for _, name := range []string{"front", "late0"} {
		e, err := ifs.ParseEntry(model.EntryInput{Key: name}, 0)
		if err != nil {
			t.Fatal(err)
		}
		ifs.PutEntry(e)
	}
	if err := p.Check(&web); err != nil {
		t.Fatalf("check farm with an iface policy: %v", err)
	}
	d := created(&ifs)
	d.Farms = []plan.FarmChange{{New: &web}}
	applyTables(t, p, d)
	farms[0] = &web
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	// A new client port each packet: a flow that passed is not checked
	// again until the policy generation moves on.
	sport := uint16(41000)
	syn := func() []byte {
		sport++
		return pktSpec{src: client, dst: vip1, sport: sport, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build()
	}
	expect := func(desc string, ifindex int, want uint32) {
		t.Helper()
		if v := runProgIf(t, ns, p.objs.XlbIngress, syn(), ifindex); v != want {
			t.Errorf("%s (ifindex %d): verdict %d, want %d", desc, ifindex, v, want)
		}
	}
	expect("in on front (listed)", front, verdictDrop)
	expect("in on back", back, verdictRedirect)
	expect("in on x0 (late0 listed, absent)", x0, verdictRedirect)

	// x0 renamed late0: matched once the watch has rewritten the hash.
	if err := nh.LinkSetName(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: x0}}, "late0"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "late0 matched", func() bool { return runProgIf(t, ns, p.objs.XlbIngress, syn(), x0) == verdictDrop })
	// And renamed away, no longer.
	if err := nh.LinkSetName(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: x0}}, "x1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "x1 not matched", func() bool { return runProgIf(t, ns, p.objs.XlbIngress, syn(), x0) == verdictRedirect })
	expect("in on front, still", front, verdictDrop)

	// A flow that passed in on x1 is cut off when x1 is renamed into
	// the list (the generation moves on), as nft's per-packet check does.
	flow := syn()
	if v := runProgIf(t, ns, p.objs.XlbIngress, flow, x0); v != verdictRedirect {
		t.Fatalf("a flow in on x1: verdict %d, want redirect", v)
	}
	if err := nh.LinkSetName(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: x0}}, "late0"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the flow's next packet dropped", func() bool { return runProgIf(t, ns, p.objs.XlbIngress, flow, x0) == verdictDrop })

	cs, err := p.TableCounters(context.Background(), &ifs)
	if err != nil {
		t.Fatal(err)
	}
	if c := cs[model.TableKey("front")]; c.Packets != 2 {
		t.Errorf("front's counters: %+v, want 2 packets", c)
	}
	if c := cs[model.TableKey("late0")]; c.Packets == 0 || len(cs) != 2 {
		t.Errorf("counters %v, want front's and late0's (counted since its last rename)", cs)
	}
}
