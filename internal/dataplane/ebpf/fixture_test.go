package ebpf

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

var (
	client = netip.MustParseAddr("10.100.0.2")
	vip1   = netip.MustParseAddr("10.99.0.1")
	vip2   = netip.MustParseAddr("10.99.0.2")
	vip3   = netip.MustParseAddr("10.99.0.3")
	lbBack = netip.MustParseAddr("10.200.0.1")
	be1    = netip.MustParseAddr("10.200.0.11")
	be2    = netip.MustParseAddr("10.200.0.12")
	other  = netip.MustParseAddr("10.100.0.77")
)

// runProg runs the program once on pkt inside ns and returns its verdict
// and output packet.
func runProg(tb testing.TB, ns netns.NsHandle, prog *ebpf.Program, pkt []byte) (uint32, []byte) {
	tb.Helper()
	var ret uint32
	out := make([]byte, len(pkt)+256)
	err := testutil.Do(ns, func() error {
		opts := ebpf.RunOptions{Data: pkt, DataOut: out}
		var err error
		ret, err = prog.Run(&opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		tb.Fatalf("BPF_PROG_TEST_RUN (%d bytes): %v", len(pkt), err)
	}
	return ret, out
}

// fixtureFarms are the farms every fixture runs against.
func fixtureFarms(tb testing.TB) []*model.Farm {
	web := farm(tb, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR,
		"10.200.0.11:8080", "10.200.0.12:8080", "10.200.0.13:8080")
	dns := farm(tb, "dns", "10.99.0.1", 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR,
		"10.200.0.12:5353")
	snat := farm(tb, "snat", "10.99.0.2", 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR,
		"10.200.0.11:0")
	empty := farm(tb, "empty", "10.99.0.3", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR,
		"10.200.0.11:80")
	empty.Backends[0].State = model.StateDown
	return []*model.Farm{web, dns, snat, empty}
}

type want struct {
	src, dst     netip.Addr
	sport, dport uint16
	dstMAC       net.HardwareAddr
	ttl          uint8
	udpCsumZero  bool
}

// TestFixtures runs packets through the program with BPF_PROG_TEST_RUN, in
// order (later fixtures rely on conntrack entries made by earlier ones).
func TestFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	if err := p.Reconcile(context.Background(), fixtureFarms(t)); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress

	syn := func(src netip.Addr, sport uint16, dst netip.Addr, dport uint16) pktSpec {
		return pktSpec{src: src, dst: dst, sport: sport, dport: dport, proto: protoTCP, tcpFlags: tcpSYN}
	}
	tests := []struct {
		desc      string
		in        []byte
		verdict   uint32
		unchanged bool  // output must equal input
		want      *want // fields of the output packet
	}{
		{
			desc:    "new TCP flow to VIP, dnat: first rr backend",
			in:      syn(client, 40000, vip1, 80).build(),
			verdict: verdictRedirect,
			want:    &want{src: client, sport: 40000, dst: be1, dport: 8080, dstMAC: macBackend(0), ttl: 63},
		},
		{
			desc:    "retransmitted SYN keeps its backend",
			in:      syn(client, 40000, vip1, 80).build(),
			verdict: verdictRedirect,
			want:    &want{src: client, sport: 40000, dst: be1, dport: 8080, dstMAC: macBackend(0), ttl: 63},
		},
		{
			desc:    "reply translation: backend SYN-ACK leaves as the VIP",
			in:      pktSpec{src: be1, sport: 8080, dst: client, dport: 40000, proto: protoTCP, tcpFlags: tcpSYN | tcpACK, srcMAC: macBackend(0), dstMAC: macBack}.build(),
			verdict: verdictRedirect,
			want:    &want{src: vip1, sport: 80, dst: client, dport: 40000, dstMAC: macClient, ttl: 63},
		},
		{
			desc:    "established flow: ACK with payload",
			in:      pktSpec{src: client, sport: 40000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK, payload: []byte("GET / HTTP/1.0\r\n\r\n")}.build(),
			verdict: verdictRedirect,
			want:    &want{src: client, sport: 40000, dst: be1, dport: 8080, dstMAC: macBackend(0), ttl: 63},
		},
		{
			desc:    "next new TCP flow goes to the second backend (rr)",
			in:      syn(client, 40001, vip1, 80).build(),
			verdict: verdictRedirect,
			want:    &want{src: client, sport: 40001, dst: be2, dport: 8080, dstMAC: macBackend(1), ttl: 63},
		},
		{
			desc:    "UDP to VIP, dnat",
			in:      pktSpec{src: client, sport: 5000, dst: vip1, dport: 53, proto: protoUDP, payload: []byte("query")}.build(),
			verdict: verdictRedirect,
			want:    &want{src: client, sport: 5000, dst: be2, dport: 5353, dstMAC: macBackend(1), ttl: 63},
		},
		{
			desc:    "UDP reply",
			in:      pktSpec{src: be2, sport: 5353, dst: client, dport: 5000, proto: protoUDP, payload: []byte("answer"), srcMAC: macBackend(1), dstMAC: macBack}.build(),
			verdict: verdictRedirect,
			want:    &want{src: vip1, sport: 53, dst: client, dport: 5000, dstMAC: macClient, ttl: 63},
		},
		{
			desc:    "UDP without checksum keeps checksum zero",
			in:      pktSpec{src: client, sport: 5001, dst: vip1, dport: 53, proto: protoUDP, payload: []byte("q"), udpNoCsum: true}.build(),
			verdict: verdictRedirect,
			want:    &want{src: client, sport: 5001, dst: be2, dport: 5353, dstMAC: macBackend(1), ttl: 63, udpCsumZero: true},
		},
		{
			desc:    "snat: source becomes the LB's backend-side address, backend port 0 keeps the VIP port",
			in:      syn(client, 41000, vip2, 80).build(),
			verdict: verdictRedirect,
			want:    &want{src: lbBack, sport: 41000, dst: be1, dport: 80, dstMAC: macBackend(0), ttl: 63},
		},
		{
			desc:    "snat reply goes back to the client from the VIP",
			in:      pktSpec{src: be1, sport: 80, dst: lbBack, dport: 41000, proto: protoTCP, tcpFlags: tcpSYN | tcpACK, srcMAC: macBackend(0), dstMAC: macBack}.build(),
			verdict: verdictRedirect,
			want:    &want{src: vip2, sport: 80, dst: client, dport: 41000, dstMAC: macClient, ttl: 63},
		},
		{
			desc:    "IPv4 with options (NOP NOP NOP EOL) is balanced, options kept",
			in:      pktSpec{src: client, sport: 40002, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, ipOptions: []byte{1, 1, 1, 0}}.build(),
			verdict: verdictRedirect,
			want:    &want{src: client, sport: 40002, dst: netip.MustParseAddr("10.200.0.13"), dport: 8080, dstMAC: macBackend(2), ttl: 63},
		},
		{
			desc:    "TTL 1: rewritten but handed to the stack (ICMP time exceeded)",
			in:      pktSpec{src: client, sport: 40003, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, ttl: 1}.build(),
			verdict: verdictPass,
			want:    &want{src: client, sport: 40003, dst: be1, dport: 8080, dstMAC: macLB, ttl: 1},
		},
		{desc: "non-VIP TCP passes untouched", in: syn(client, 40004, other, 80).build(), verdict: verdictNext, unchanged: true},
		{desc: "VIP, other port passes untouched", in: syn(client, 40005, vip1, 81).build(), verdict: verdictNext, unchanged: true},
		{
			desc:    "TCP ACK to VIP without conntrack passes (the stack resets it)",
			in:      pktSpec{src: client, sport: 40006, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK}.build(),
			verdict: verdictNext, unchanged: true,
		},
		{desc: "farm without active backends refuses new flows (TestRejectFixtures checks the message)", in: syn(client, 40007, vip3, 80).build(), verdict: verdictRedirect},
		{
			desc:    "first fragment (MF) passes untouched",
			in:      pktSpec{src: client, sport: 5002, dst: vip1, dport: 53, proto: protoUDP, fragOff: 0x2000, payload: []byte("frag")}.build(),
			verdict: verdictNext, unchanged: true,
		},
		{
			desc:    "later fragment passes untouched",
			in:      pktSpec{src: client, sport: 5002, dst: vip1, dport: 53, proto: protoUDP, fragOff: 0x0010, payload: []byte("frag")}.build(),
			verdict: verdictNext, unchanged: true,
		},
		// BPF_PROG_TEST_RUN refuses IPv4 frames shorter than Ethernet + 20
		// bytes, so a truncated IPv4 header can only be fed as another type.
		{desc: "short frame of a local ethertype", in: mutate(mutate(syn(client, 1, vip1, 80).build()[:15], 12, 0x88), 13, 0xb5), verdict: verdictNext, unchanged: true},
		{desc: "options longer than the packet (IHL 15, 20 bytes)", in: mutate(syn(client, 1, vip1, 80).build()[:14+20], 14, 0x4f), verdict: verdictNext, unchanged: true},
		{desc: "truncated TCP header", in: syn(client, 1, vip1, 80).build()[:14+20+19], verdict: verdictNext, unchanged: true},
		{desc: "truncated UDP header", in: pktSpec{src: client, sport: 1, dst: vip1, dport: 53, proto: protoUDP}.build()[:14+20+7], verdict: verdictNext, unchanged: true},
		{desc: "IHL below 5", in: mutate(syn(client, 1, vip1, 80).build(), 14, 0x44), verdict: verdictNext, unchanged: true},
		{desc: "IP version 6 in an IPv4 frame", in: mutate(syn(client, 1, vip1, 80).build(), 14, 0x65), verdict: verdictNext, unchanged: true},
		{desc: "total length below header length", in: mutate(syn(client, 1, vip1, 80).build(), 14+3, 10), verdict: verdictNext, unchanged: true},
		{desc: "IHL pointing past the packet", in: mutate(syn(client, 1, vip1, 80).build(), 14, 0x4f), verdict: verdictNext, unchanged: true},
		{desc: "ARP", in: mutate(mutate(syn(client, 1, vip1, 80).build(), 12, 0x08), 13, 0x06), verdict: verdictNext, unchanged: true},
		{desc: "ICMP to VIP", in: mutate(syn(client, 1, vip1, 80).build(), 14+9, 1), verdict: verdictNext, unchanged: true},
	}
	for _, tt := range tests {
		verdict, out := runProg(t, ns, prog, tt.in)
		if verdict != tt.verdict {
			st, _ := p.Stats()
			t.Errorf("%s: verdict %d, want %d (stats %v)", tt.desc, verdict, tt.verdict, st)
			continue
		}
		if tt.unchanged && !bytes.Equal(out, tt.in) {
			t.Errorf("%s: packet changed:\n in %x\nout %x", tt.desc, tt.in, out)
		}
		if tt.want == nil {
			continue
		}
		got, err := parse(out)
		if err != nil {
			t.Errorf("%s: output: %v (%x)", tt.desc, err, out)
			continue
		}
		w := tt.want
		if got.src != w.src || got.dst != w.dst || got.sport != w.sport || got.dport != w.dport {
			t.Errorf("%s: got %s:%d -> %s:%d, want %s:%d -> %s:%d", tt.desc,
				got.src, got.sport, got.dst, got.dport, w.src, w.sport, w.dst, w.dport)
		}
		if !bytes.Equal(got.dstMAC, w.dstMAC) {
			t.Errorf("%s: destination MAC %s, want %s", tt.desc, got.dstMAC, w.dstMAC)
		}
		if got.ttl != w.ttl {
			t.Errorf("%s: TTL %d, want %d", tt.desc, got.ttl, w.ttl)
		}
		if w.udpCsumZero && got.l4Csum != 0 {
			t.Errorf("%s: UDP checksum %#x, want 0", tt.desc, got.l4Csum)
		}
		if len(out) != len(tt.in) {
			t.Errorf("%s: length %d, want %d", tt.desc, len(out), len(tt.in))
		}
		if hdr := 14 + got.ihl; !bytes.Equal(out[14+20:hdr], tt.in[14+20:hdr]) {
			t.Errorf("%s: IPv4 options changed", tt.desc)
		}
	}
}

func mutate(b []byte, off int, v byte) []byte {
	b[off] = v
	return b
}
