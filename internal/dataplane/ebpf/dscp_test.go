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

// dscpTable is an addr table without verdict, valtype dscp, holding
// entries "key value".
func dscpTable(tb testing.TB, name string, id uint16, slot uint32, entries ...[2]string) *model.Table {
	tb.Helper()
	t := addrTable(tb, name, model.ListNone, id, slot)
	t.Values = model.ValDSCP
	for _, kv := range entries {
		e, err := t.ParseEntry(model.EntryInput{Key: kv[0], Value: kv[1], ValueSet: true}, 0)
		if err != nil {
			tb.Fatal(err)
		}
		t.PutEntry(e)
	}
	return t
}

// TestDSCPFixtures: a dscp table's most specific entry gives the client's
// packets its DSCP, every packet of the flow (the SYN, and later ACKs
// through the conntrack entry), their ECN bits kept and the IPv4 header
// checksum valid (parse checks it); the backend's replies keep their own
// traffic class; a client only a wider entry holds gets that entry's, a
// client no entry holds keeps its own. IPv6 (snat, UDP): the traffic class
// across the header's first two bytes, the flow label kept. A stlsdnat
// farm's packets get it from their own policy check, and the XDP program's
// forwarding of a dsr flow writes it too. Without the program's rewrite
// every packet leaves with the traffic class it came with (the test fails).
func TestDSCPFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	c6 := netip.MustParseAddr("fd00:100::2")
	vip6, be6, lb6 := netip.MustParseAddr("fd00:99::1"), netip.MustParseAddr("fd00:200::11"), netip.MustParseAddr("fd00:200::1")
	ds := dscpTable(t, "ds", 1, 1,
		[2]string{client.String(), "46"}, [2]string{"10.100.0.0/16", "10"},
		[2]string{"10.100.0.64/26", "0"}, // 0: the DSCP is left as it is
		[2]string{c6.String(), "46"})
	pol := []model.PolicyRef{{Name: "ds"}}
	web := farm(t, "web", vip1.String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080")
	web6 := farm(t, "web6", vip6.String(), 80, model.ProtoUDP, model.ModeSNAT, model.SchedRR, "[fd00:200::11]:8080")
	stl := farm(t, "stl", "10.99.0.5", 80, model.ProtoTCP, model.ModeDNAT, model.SchedMaglev, "10.200.0.11:8080")
	stl.Mode = model.ModeStlsDNAT
	dsr := farm(t, "dsr", "10.99.0.4", 80, model.ProtoTCP, model.ModeDSR, model.SchedRR, "10.200.0.11:0")
	farms := []*model.Farm{web, web6, stl, dsr}
	d := created(ds)
	for _, f := range farms {
		f.Policies = pol
		if err := check(f); err != nil {
			t.Fatal(err)
		}
		if err := checkTableUse(f, ds); err != nil {
			t.Fatal(err)
		}
		d.Farms = append(d.Farms, plan.FarmChange{New: f})
	}
	applyTables(t, p, d)
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	ing := p.objs.XlbIngress
	const ef = 46 << 2
	for _, c := range []struct {
		desc    string
		in      pktSpec
		tos     uint8
		verdict uint32
	}{
		{"SYN of the table's client, ECT(1)", pktSpec{src: client, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, tos: 0x01}, ef | 0x01, verdictRedirect},
		{"its ACK, through the flow's entry, CE", pktSpec{src: client, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK, tos: 0x03}, ef | 0x03, verdictRedirect},
		{"its ACK, with a DSCP of its own", pktSpec{src: client, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK, tos: 0x20 | 0x02}, ef | 0x02, verdictRedirect},
		{"the backend's reply keeps its own", pktSpec{src: be1, sport: 8080, dst: client, dport: 40000, proto: protoTCP, tcpFlags: tcpSYN | tcpACK, srcMAC: macBackend(0), dstMAC: macBack, tos: 0x04 | 0x01}, 0x04 | 0x01, verdictRedirect},
		{"a client of the /16 entry only", pktSpec{src: netip.MustParseAddr("10.100.1.2"), sport: 40001, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, tos: 0x02}, 10<<2 | 0x02, verdictRedirect},
		{"a client of the /26 entry with 0", pktSpec{src: netip.MustParseAddr("10.100.0.70"), sport: 40002, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, tos: 0x28}, 0x28, verdictRedirect},
		{"a client in no entry", pktSpec{src: netip.MustParseAddr("10.101.0.2"), sport: 40003, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, tos: 0x28 | 0x01}, 0x28 | 0x01, verdictRedirect},
		{"IPv6 UDP of the table's client", pktSpec{src: c6, sport: 5000, dst: vip6, dport: 80, proto: protoUDP, payload: []byte("q"), tos: 0x03}, ef | 0x03, verdictRedirect},
		{"IPv6 UDP again", pktSpec{src: c6, sport: 5000, dst: vip6, dport: 80, proto: protoUDP, payload: []byte("q"), tos: 0xfc | 0x01}, ef | 0x01, verdictRedirect},
		{"IPv6 UDP reply keeps its own", pktSpec{src: be6, sport: 8080, dst: lb6, dport: 5000, proto: protoUDP, payload: []byte("a"), srcMAC: macBackend(0), dstMAC: macBack, tos: 0x11}, 0x11, verdictRedirect},
		{"stlsdnat, the table's client", pktSpec{src: client, sport: 40010, dst: netip.MustParseAddr("10.99.0.5"), dport: 80, proto: protoTCP, tcpFlags: tcpSYN, tos: 0x02}, ef | 0x02, verdictRedirect},
		{"stlsdnat, a later segment", pktSpec{src: client, sport: 40010, dst: netip.MustParseAddr("10.99.0.5"), dport: 80, proto: protoTCP, tcpFlags: tcpACK, tos: 0x01}, ef | 0x01, verdictRedirect},
		{"stlsdnat, a client in no entry", pktSpec{src: netip.MustParseAddr("10.101.0.2"), sport: 40011, dst: netip.MustParseAddr("10.99.0.5"), dport: 80, proto: protoTCP, tcpFlags: tcpSYN, tos: 0x01}, 0x01, verdictRedirect},
	} {
		verdict, out := runProg(t, ns, ing, c.in.build())
		if verdict != c.verdict {
			t.Errorf("%s: verdict %d, want %d", c.desc, verdict, c.verdict)
			continue
		}
		got, err := parse(out)
		if err != nil {
			t.Errorf("%s: %v", c.desc, err)
			continue
		}
		if got.tos != c.tos {
			t.Errorf("%s: traffic class %#02x (DSCP %d, ECN %d), want %#02x (DSCP %d, ECN %d)", c.desc,
				got.tos, got.tos>>2, got.tos&3, c.tos, c.tos>>2, c.tos&3)
		}
		if c.in.src.Is6() && got.flow != 0x12345 {
			t.Errorf("%s: flow label %#x, want 0x12345 kept", c.desc, got.flow)
		}
	}

	// dsr: the XDP program forwards the established flow's segments.
	back := uint32(linkAttrs(t, ns, "back").Index)
	if err := p.objs.XlbXdpTx.Update(back, uint32(1), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	vip4 := netip.MustParseAddr("10.99.0.4")
	syn := pktSpec{src: client, sport: 45000, dst: vip4, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}
	ack := pktSpec{src: client, sport: 45000, dst: vip4, dport: 80, proto: protoTCP, tcpFlags: tcpACK, tos: 0x01}
	for _, s := range []pktSpec{syn, ack} { // the handshake's ACK (a change of state) is tcx's
		if v, _ := runProg(t, ns, ing, s.build()); v != verdictRedirect {
			t.Fatalf("dsr: tcx verdict %d, want redirect", v)
		}
	}
	v, out := runProg(t, ns, p.objs.XlbXdp, ack.build())
	if v != xdpRedirect {
		t.Fatalf("dsr: XDP verdict %d, want redirect", v)
	}
	if got, err := parse(out); err != nil || got.tos != ef|0x01 {
		t.Errorf("dsr in XDP: traffic class %#02x (%v), want %#02x", got.tos, err, ef|0x01)
	}
}
