package ebpf

import (
	"bytes"
	"context"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestDSRMidstream: a dsr flow the routers move to this node in the middle
// of a connection (its first packet here is a plain ACK) is taken up: sent
// to the backend a SYN of the same tuple is sent to (Maglev: the one the
// other node picked), tracked as established. Other modes, and segments
// that are neither a SYN nor a plain ACK, pass to the stack as before.
func TestDSRMidstream(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	vip4 := netip.MustParseAddr("10.99.0.4")
	dsr := farm(t, "dsr", vip4.String(), 80, model.ProtoTCP, model.ModeDSR, model.SchedMaglev,
		"10.200.0.11:0", "10.200.0.12:0", "10.200.0.13:0")
	dnat := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedMaglev,
		"10.200.0.11:8080", "10.200.0.12:8080")
	if err := p.Reconcile(context.Background(), []*model.Farm{dsr, dnat}); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	send := func(sport uint16, flags uint8, payload string) (uint32, parsedPkt) {
		t.Helper()
		verdict, out := runProg(t, ns, prog, pktSpec{src: client, sport: sport, dst: vip4, dport: 80, proto: protoTCP,
			tcpFlags: flags, payload: []byte(payload)}.build())
		got, _ := parse(out)
		return verdict, got
	}
	const flows = 24
	used := map[string]bool{}
	for i := range flows {
		sport := uint16(45000 + i)
		verdict, mid := send(sport, tcpACK, "data")
		if verdict != verdictRedirect {
			t.Fatalf("flow %d: mid-stream ACK verdict %d, want redirect", i, verdict)
		}
		if mid.src != client || mid.sport != sport || mid.dst != vip4 || mid.dport != 80 || mid.ttl != 63 {
			t.Errorf("flow %d: mid-stream ACK left as %s:%d -> %s:%d TTL %d", i, mid.src, mid.sport, mid.dst, mid.dport, mid.ttl)
		}
		fwd := ctKey(client, sport, vip4, 80, protoTCP)
		if f, r := ctState(t, p, fwd); f != int(ctStateEST) || r != -1 {
			t.Errorf("flow %d: entry states %d/%d, want established and no reply entry", i, f, r)
		}
		// The next packet follows the entry; then the same tuple opened
		// anew with a SYN is scheduled as a new flow: the same backend.
		if verdict, next := send(sport, tcpACK, "more"); verdict != verdictRedirect || !bytes.Equal(next.dstMAC, mid.dstMAC) {
			t.Errorf("flow %d: second ACK verdict %d to %s, want %s", i, verdict, next.dstMAC, mid.dstMAC)
		}
		if err := p.objs.XlbCt.Delete(fwd); err != nil {
			t.Fatal(err)
		}
		verdict, syn := send(sport, tcpSYN, "")
		if verdict != verdictRedirect || !bytes.Equal(syn.dstMAC, mid.dstMAC) {
			t.Errorf("flow %d: SYN verdict %d to %s, the mid-stream ACK went to %s", i, verdict, syn.dstMAC, mid.dstMAC)
		}
		used[mid.dstMAC.String()] = true
	}
	if len(used) < 2 {
		t.Errorf("%d flows all went to one backend (%v): the test shows nothing about the pick", flows, used)
	}
	// Neither a RST nor a SYN-ACK opens a dsr flow; a mid-stream ACK to a
	// dnat farm passes to the stack (its translation is the first node's,
	// which only connection sync carries).
	for _, c := range []struct {
		desc string
		pkt  pktSpec
	}{
		{"dsr RST", pktSpec{src: client, sport: 46000, dst: vip4, dport: 80, proto: protoTCP, tcpFlags: 0x04 | tcpACK}},
		{"dsr SYN-ACK", pktSpec{src: client, sport: 46001, dst: vip4, dport: 80, proto: protoTCP, tcpFlags: tcpSYN | tcpACK}},
		{"dnat ACK", pktSpec{src: client, sport: 46002, dst: netip.MustParseAddr("10.99.0.1"), dport: 80, proto: protoTCP, tcpFlags: tcpACK}},
	} {
		in := c.pkt.build()
		if verdict, out := runProg(t, ns, prog, in); verdict != verdictNext || !bytes.Equal(out, in) {
			t.Errorf("%s without an entry: verdict %d, changed %v; want it passed untouched", c.desc, verdict, !bytes.Equal(out, in))
		}
	}
}
