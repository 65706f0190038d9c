package ebpf

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestMalformedPackets feeds the program thousands of damaged packets
// (truncated anywhere, header bytes flipped) derived from valid ones of
// every kind it handles, and checks properties that must hold for any
// input: the verdict is one of the four the program returns, the packet
// never grows or shrinks, and a packet the program declines (TCX_NEXT) is
// handed on exactly as it came.
func TestMalformedPackets(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 65536)
	farms := fixtureFarms(t)
	v6 := model.NewFarm("web6")
	v6.Family = model.FamilyIPv6
	v6.VirtualAddr = netip.MustParseAddr("fd00:99::1")
	v6.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
	be := model.NewBackend("b1")
	be.Addr, be.Port = netip.MustParseAddr("fd00:200::11"), 8080
	v6.Backends = []model.Backend{be}
	if err := v6.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(context.Background(), append(farms, &v6)); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	a := netip.MustParseAddr
	_, toBackend := runProg(t, ns, prog, pktSpec{src: client, sport: 48000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
	_, toBackend6 := runProg(t, ns, prog, pktSpec{src: a("fd00:100::2"), sport: 48001, dst: a("fd00:99::1"), dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
	bases := [][]byte{
		pktSpec{src: client, sport: 48002, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, payload: []byte("hello")}.build(),
		pktSpec{src: client, sport: 48000, dst: vip1, dport: 80, proto: protoTCP, tcpFlags: tcpACK, ipOptions: []byte{1, 1, 1, 0}}.build(),
		pktSpec{src: client, sport: 48003, dst: vip1, dport: 53, proto: protoUDP, payload: []byte("query")}.build(),
		pktSpec{src: be1, sport: 8080, dst: client, dport: 48000, proto: protoTCP, tcpFlags: tcpACK, srcMAC: macBackend(0), dstMAC: macBack}.build(),
		pktSpec{src: a("fd00:100::2"), sport: 48004, dst: a("fd00:99::1"), dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build(),
		icmpError(macBackend(0), macBack, a("10.200.0.254"), client, 3, 4, toBackend),
		icmp6Error(macBackend(0), macBack, a("fd00:200::fe"), a("fd00:100::2"), 2, 0, toBackend6),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	valid := map[uint32]bool{verdictNext: true, verdictPass: true, verdictDrop: true, verdictRedirect: true}
	runs, refused := 0, 0
	for i := range 6000 {
		base := bases[i%len(bases)]
		in := append([]byte(nil), base...)
		if rng.IntN(2) == 0 {
			in = in[:14+rng.IntN(len(in)-14+1)]
		}
		for range 1 + rng.IntN(3) {
			off := 12 + rng.IntN(min(len(in), 14+40+8+48)-12)
			in[off] ^= byte(1 + rng.IntN(255))
		}
		out := make([]byte, len(in)+256)
		var ret uint32
		err := testutil.Do(ns, func() error {
			opts := ebpf.RunOptions{Data: in, DataOut: out}
			var err error
			ret, err = prog.Run(&opts)
			out = opts.DataOut
			return err
		})
		if err != nil {
			refused++ // the kernel refuses some frames (e.g. IPv4 shorter than its header)
			continue
		}
		runs++
		v := ret
		if !valid[v] {
			t.Fatalf("packet %d: verdict %d\n%x", i, v, in)
		}
		if len(out) != len(in) {
			t.Fatalf("packet %d: length %d -> %d", i, len(in), len(out))
		}
		if v == verdictNext && !bytes.Equal(out, in) {
			t.Fatalf("packet %d: declined but changed\n in %x\nout %x", i, in, out)
		}
	}
	st, _ := p.Stats()
	t.Logf("%d packets run (%d refused by the kernel); counters %v", runs, refused, st)
	if runs < 4000 {
		t.Errorf("only %d of 6000 packets ran", runs)
	}
}
