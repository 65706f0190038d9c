package ebpf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestFixturesIPv6 runs IPv6 packets through the program: dnat and snat,
// TCP and UDP, both directions, checksums, hop limit; and what it must pass
// untouched.
func TestFixturesIPv6(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	a := netip.MustParseAddr
	client6, vip6a, vip6b := a("fd00:100::2"), a("fd00:99::1"), a("fd00:99::2")
	lbBack6 := a("fd00:200::1")
	be6 := []netip.Addr{a("fd00:200::11"), a("fd00:200::12"), a("fd00:200::13")}
	mk := func(name string, vip netip.Addr, port uint16, proto model.Protocol, mode model.Mode, bePort uint16) *model.Farm {
		f := model.NewFarm(name)
		f.Family = model.FamilyIPv6
		f.VirtualAddr = vip
		f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
		f.Protocol, f.Mode, f.Scheduler = proto, mode, model.SchedRR
		for i, b := range be6 {
			be := model.NewBackend(fmt.Sprintf("b%d", i+1))
			be.Addr, be.Port = b, bePort
			f.Backends = append(f.Backends, be)
		}
		if err := f.Validate(); err != nil {
			t.Fatal(err)
		}
		if err := check(&f); err != nil {
			t.Fatal(err)
		}
		return &f
	}
	farms := []*model.Farm{
		mk("web6", vip6a, 80, model.ProtoTCP, model.ModeDNAT, 8080),
		mk("dns6", vip6a, 53, model.ProtoUDP, model.ModeDNAT, 5353),
		mk("snat6", vip6b, 80, model.ProtoTCP, model.ModeSNAT, 0),
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	tcp := func(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags uint8) pktSpec {
		return pktSpec{src: src, dst: dst, sport: sport, dport: dport, proto: protoTCP, tcpFlags: flags}
	}
	fromBack := func(s pktSpec, mac int) pktSpec {
		s.srcMAC, s.dstMAC = macBackend(mac), macBack
		return s
	}
	for _, c := range []struct {
		desc    string
		in      pktSpec
		verdict uint32
		want    *want
	}{
		{"new TCP flow, dnat", tcp(client6, 40000, vip6a, 80, tcpSYN), verdictRedirect,
			&want{src: client6, sport: 40000, dst: be6[0], dport: 8080, dstMAC: macBackend(0), ttl: 63}},
		{"reply", fromBack(tcp(be6[0], 8080, client6, 40000, tcpSYN|tcpACK), 0), verdictRedirect,
			&want{src: vip6a, sport: 80, dst: client6, dport: 40000, dstMAC: macClient, ttl: 63}},
		{"established", tcp(client6, 40000, vip6a, 80, tcpACK), verdictRedirect,
			&want{src: client6, sport: 40000, dst: be6[0], dport: 8080, dstMAC: macBackend(0), ttl: 63}},
		{"UDP, dnat", pktSpec{src: client6, sport: 5000, dst: vip6a, dport: 53, proto: protoUDP, payload: []byte("q")}, verdictRedirect,
			&want{src: client6, sport: 5000, dst: be6[0], dport: 5353, dstMAC: macBackend(0), ttl: 63}},
		{"UDP reply", fromBack(pktSpec{src: be6[0], sport: 5353, dst: client6, dport: 5000, proto: protoUDP, payload: []byte("a")}, 0), verdictRedirect,
			&want{src: vip6a, sport: 53, dst: client6, dport: 5000, dstMAC: macClient, ttl: 63}},
		{"snat", tcp(client6, 41000, vip6b, 80, tcpSYN), verdictRedirect,
			&want{src: lbBack6, sport: 41000, dst: be6[0], dport: 80, dstMAC: macBackend(0), ttl: 63}},
		{"snat reply", fromBack(tcp(be6[0], 80, lbBack6, 41000, tcpSYN|tcpACK), 0), verdictRedirect,
			&want{src: vip6b, sport: 80, dst: client6, dport: 41000, dstMAC: macClient, ttl: 63}},
		{"hop limit 1: rewritten, to the stack", pktSpec{src: client6, sport: 40001, dst: vip6a, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, ttl: 1}, verdictPass,
			&want{src: client6, sport: 40001, dst: be6[1], dport: 8080, dstMAC: macLB, ttl: 1}},
		{"not a VIP", tcp(client6, 40002, a("fd00:99::77"), 80, tcpSYN), verdictNext, nil},
		{"fragment header", pktSpec{src: client6, sport: 5001, dst: vip6a, dport: 53, proto: protoUDP, nextHdr: 44, payload: []byte("frag")}, verdictNext, nil},
		{"hop-by-hop options header", pktSpec{src: client6, sport: 5002, dst: vip6a, dport: 53, proto: protoUDP, nextHdr: 0, payload: []byte("hbh")}, verdictNext, nil},
	} {
		in := c.in.build()
		if c.desc == "hop-by-hop options header" {
			in[14+6] = 0 // next header 0: build() treats 0 as "none"
		}
		verdict, out := runProg(t, ns, prog, in)
		if verdict != c.verdict {
			st, _ := p.Stats()
			t.Errorf("%s: verdict %d, want %d (stats %v)", c.desc, verdict, c.verdict, st)
			continue
		}
		if c.want == nil {
			if !bytes.Equal(out, in) {
				t.Errorf("%s: packet changed", c.desc)
			}
			continue
		}
		got, err := parse(out)
		if err != nil {
			t.Errorf("%s: %v", c.desc, err)
			continue
		}
		w := c.want
		if got.src != w.src || got.dst != w.dst || got.sport != w.sport || got.dport != w.dport || got.ttl != w.ttl || !bytes.Equal(got.dstMAC, w.dstMAC) {
			t.Errorf("%s: got [%s]:%d -> [%s]:%d hop %d mac %s, want [%s]:%d -> [%s]:%d hop %d mac %s", c.desc,
				got.src, got.sport, got.dst, got.dport, got.ttl, got.dstMAC, w.src, w.sport, w.dst, w.dport, w.ttl, w.dstMAC)
		}
	}
}

// TestTrafficIPv6: real TCP and UDP over IPv6 through the LB, dnat and snat.
func TestTrafficIPv6(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3, IPv6: true})
	for i, b := range topo.Backends {
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv6, 8080), fmt.Sprintf("be%d", i))
		testutil.StartUDPServer(t, b.NS, netip.AddrPortFrom(b.IPv6, 8053), fmt.Sprintf("be%d", i))
	}
	p := newPlane(t, topo.LB.NS, mountBPFFS(t), nil, 16384)
	mk := func(name string, vip netip.Addr, port uint16, proto model.Protocol, mode model.Mode, bePort uint16) *model.Farm {
		f := model.NewFarm(name)
		f.Family = model.FamilyIPv6
		f.VirtualAddr = vip
		f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
		f.Protocol, f.Mode, f.Scheduler = proto, mode, model.SchedRR
		for i, b := range topo.Backends {
			be := model.NewBackend(fmt.Sprintf("b%d", i+1))
			be.Addr, be.Port = b.IPv6, bePort
			f.Backends = append(f.Backends, be)
		}
		if err := f.Validate(); err != nil {
			t.Fatal(err)
		}
		if err := check(&f); err != nil {
			t.Fatal(err)
		}
		return &f
	}
	tcpDNAT := netip.AddrPortFrom(testutil.VIP6(1), 80)
	tcpSNAT := netip.AddrPortFrom(testutil.VIP6(2), 80)
	udpDNAT := netip.AddrPortFrom(testutil.VIP6(3), 53)
	udpClosed := netip.AddrPortFrom(testutil.VIP6(4), 53)
	farms := []*model.Farm{
		mk("tcp-dnat", tcpDNAT.Addr(), 80, model.ProtoTCP, model.ModeDNAT, 8080),
		mk("tcp-snat", tcpSNAT.Addr(), 80, model.ProtoTCP, model.ModeSNAT, 8080),
		mk("udp-dnat", udpDNAT.Addr(), 53, model.ProtoUDP, model.ModeDNAT, 8053),
		mk("udp-closed", udpClosed.Addr(), 53, model.ProtoUDP, model.ModeSNAT, 8099),
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	const n = 12
	counts := ask(t, n, func() (string, error) { return testutil.AskTCP(topo.Client.NS, tcpDNAT) }, topo.Client.IPv6)
	checkSpread(t, counts, n, 3)
	counts = ask(t, n, func() (string, error) { return testutil.AskTCP(topo.Client.NS, tcpSNAT) }, topo.LBBack6)
	checkSpread(t, counts, n, 3)
	counts = ask(t, n, func() (string, error) { return testutil.AskUDP(topo.Client.NS, udpDNAT) }, topo.Client.IPv6)
	checkSpread(t, counts, n, 3)
	// ICMPv6 port unreachable from a backend reaches the client translated.
	err := testutil.Do(topo.Client.NS, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(udpClosed))
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 64))
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		st, _ := p.Stats()
		t.Errorf("UDP to a VIP whose backends have no server: %v, want connection refused (counters %v)", err, st)
	}
}

// TestTrafficChecksums: TCP and UDP, dnat and snat, IPv4 and IPv6, in two
// setups. "transmit": every next hop takes plain bpf_redirect and transmit
// checksum offload is off on every LB interface, so the kernel completes
// the checksums the program leaves (the offloaded seed or the full sum)
// before the packets leave, and backends and client verify them. "peer":
// next hops take bpf_redirect_peer where they can (the client's veth), which
// has no transmit at the LB, so the senders (client, backends) send full
// checksums (offload off there), which the program updates and the
// receivers verify.
func TestTrafficChecksums(t *testing.T) {
	for _, peer := range []bool{false, true} {
		name := "transmit"
		if peer {
			name = "peer"
		}
		t.Run(name, func(t *testing.T) { testTrafficChecksums(t, peer) })
	}
}

func testTrafficChecksums(t *testing.T, peer bool) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 2, IPv6: true})
	for i, b := range topo.Backends {
		for _, a := range []netip.Addr{b.IPv4, b.IPv6} {
			testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(a, 8080), fmt.Sprintf("be%d", i))
			testutil.StartUDPServer(t, b.NS, netip.AddrPortFrom(a, 8053), fmt.Sprintf("be%d", i))
		}
	}
	links, err := netInterfaces(topo.LB.NS)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		setTxChecksum(t, topo.LB.NS, l, false)
	}
	if peer {
		for _, h := range append([]testutil.Host{topo.Client}, topo.Backends...) {
			setTxChecksum(t, h.NS, h.Link, false)
		}
	}
	p, err := New(context.Background(), testLogger(t), Options{NetNS: topo.LB.NS, PinPath: mountBPFFS(t),
		ConnTableSize: 16384, noPeerRedirect: !peer})
	if err != nil {
		t.Fatalf("new ebpf plane: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	var farms []*model.Farm
	type target struct {
		vip   netip.AddrPort
		udp   bool
		saw   netip.Addr
		label string
	}
	var targets []target
	n := 0
	for _, v6 := range []bool{false, true} {
		for _, mode := range []model.Mode{model.ModeDNAT, model.ModeSNAT} {
			for _, proto := range []model.Protocol{model.ProtoTCP, model.ProtoUDP} {
				n++
				f := model.NewFarm(fmt.Sprintf("f%d", n))
				vip := testutil.VIP4(50 + n)
				bePort := uint16(8080)
				if proto == model.ProtoUDP {
					bePort = 8053
				}
				saw := topo.Client.IPv4
				if mode == model.ModeSNAT {
					saw = topo.LBBack4
				}
				if v6 {
					f.Family = model.FamilyIPv6
					vip = testutil.VIP6(50 + n)
					saw = topo.Client.IPv6
					if mode == model.ModeSNAT {
						saw = topo.LBBack6
					}
				}
				f.VirtualAddr = vip
				f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
				f.Protocol, f.Mode, f.Scheduler = proto, mode, model.SchedRR
				for i, b := range topo.Backends {
					be := model.NewBackend(fmt.Sprintf("b%d", i))
					be.Addr, be.Port = b.Addr(v6), bePort
					f.Backends = append(f.Backends, be)
				}
				if err := f.Validate(); err != nil {
					t.Fatal(err)
				}
				if err := check(&f); err != nil {
					t.Fatal(err)
				}
				farms = append(farms, &f)
				targets = append(targets, target{netip.AddrPortFrom(vip, 80), proto == model.ProtoUDP, saw,
					fmt.Sprintf("%s %s v6=%v", mode, proto, v6)})
			}
		}
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		for i := range 4 {
			var reply string
			var err error
			if tg.udp {
				reply, err = testutil.AskUDP(topo.Client.NS, tg.vip)
			} else {
				reply, err = testutil.AskTCP(topo.Client.NS, tg.vip)
			}
			if err != nil {
				st, _ := p.Stats()
				t.Fatalf("%s: request %d: %v (counters %v)", tg.label, i, err, st)
			}
			if _, from, err := testutil.ParseReply(reply); err != nil || from.Addr() != tg.saw {
				t.Fatalf("%s: reply %q (%v), want one seen from %s", tg.label, reply, err, tg.saw)
			}
		}
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if peer == (st["fib_peer"] == 0) {
		t.Errorf("fib_peer %d with peer redirect %v", st["fib_peer"], peer)
	}
}

// netInterfaces lists the interfaces of ns but loopback.
func netInterfaces(ns netns.NsHandle) ([]string, error) {
	var out []string
	err := testutil.Do(ns, func() error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			if i.Flags&net.FlagLoopback == 0 {
				out = append(out, i.Name)
			}
		}
		return err
	})
	return out, err
}

// icmp6Error builds an ICMPv6 error (type, code) from src to dst quoting
// the IPv6 packet quoted (its first 48 bytes: header and ports).
func icmp6Error(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, typ, code uint8, quoted []byte) []byte {
	q := quoted[14:]
	if len(q) > 48 {
		q = q[:48]
	}
	icmp := make([]byte, 8, 8+len(q))
	icmp[0], icmp[1] = typ, code
	if typ == 2 {
		binary.BigEndian.PutUint32(icmp[4:], 1280) // MTU
	}
	icmp = append(icmp, q...)
	binary.BigEndian.PutUint16(icmp[2:], l4Csum(src, dst, 58, icmp))
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(icmp)))
	ip[6], ip[7] = 58, 64
	copy(ip[8:], src.AsSlice())
	copy(ip[24:], dst.AsSlice())
	out := append([]byte{}, dstMAC...)
	out = append(out, srcMAC...)
	out = append(out, 0x86, 0xdd)
	out = append(out, ip...)
	return append(out, icmp...)
}

func parseICMP6(b []byte) (parsedICMP, error) {
	var p parsedICMP
	if len(b) < 14+40+8+44 || b[14+6] != 58 {
		return p, fmt.Errorf("not an ICMPv6 packet")
	}
	ip := b[14:]
	p.dstMAC = net.HardwareAddr(b[0:6])
	p.ttl = ip[7]
	p.src, p.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	plen := int(binary.BigEndian.Uint16(ip[4:]))
	if l4Csum(p.src, p.dst, 58, ip[40:40+plen]) != 0 {
		return p, fmt.Errorf("bad ICMPv6 checksum")
	}
	q := ip[48:]
	p.qsrc, p.qdst = netip.AddrFrom16([16]byte(q[8:24])), netip.AddrFrom16([16]byte(q[24:40]))
	p.qsport, p.qdpt = binary.BigEndian.Uint16(q[40:]), binary.BigEndian.Uint16(q[42:])
	return p, nil
}

// TestICMPv6ErrorFixtures: ICMPv6 errors about NATed packets are
// translated (checksum over the pseudo header included); neighbour
// discovery passes untouched.
func TestICMPv6ErrorFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	a := netip.MustParseAddr
	client6, vip6, lbBack6, be6, router6 := a("fd00:100::2"), a("fd00:99::1"), a("fd00:200::1"), a("fd00:200::11"), a("fd00:200::fe")
	mk := func(name string, vip netip.Addr, mode model.Mode, port uint16) *model.Farm {
		f := model.NewFarm(name)
		f.Family, f.VirtualAddr = model.FamilyIPv6, vip
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		f.Protocol, f.Mode, f.Scheduler = model.ProtoTCP, mode, model.SchedRR
		be := model.NewBackend("b1")
		be.Addr, be.Port = be6, port
		f.Backends = []model.Backend{be}
		if err := f.Validate(); err != nil {
			t.Fatal(err)
		}
		return &f
	}
	vip6b := a("fd00:99::2")
	if err := p.Reconcile(context.Background(), []*model.Farm{mk("d", vip6, model.ModeDNAT, 8080), mk("s", vip6b, model.ModeSNAT, 0)}); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	_, toBackend := runProg(t, ns, prog, pktSpec{src: client6, sport: 45000, dst: vip6, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
	_, toBackendSnat := runProg(t, ns, prog, pktSpec{src: client6, sport: 45001, dst: vip6b, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
	for _, c := range []struct {
		desc           string
		in             []byte
		src, dst       netip.Addr
		qsrc, qdst     netip.Addr
		qsport, qdport uint16
	}{
		{"dnat: packet too big from a router", icmp6Error(macBackend(0), macBack, router6, client6, 2, 0, toBackend),
			router6, client6, client6, vip6, 45000, 80},
		{"dnat: port unreachable from the backend comes from the VIP", icmp6Error(macBackend(0), macBack, be6, client6, 1, 4, toBackend),
			vip6, client6, client6, vip6, 45000, 80},
		{"snat: time exceeded to the LB goes to the client", icmp6Error(macBackend(0), macBack, router6, lbBack6, 3, 0, toBackendSnat),
			router6, client6, client6, vip6b, 45001, 80},
	} {
		verdict, out := runProg(t, ns, prog, c.in)
		if verdict != verdictRedirect {
			t.Errorf("%s: verdict %d", c.desc, verdict)
			continue
		}
		got, err := parseICMP6(out)
		if err != nil {
			t.Errorf("%s: %v", c.desc, err)
			continue
		}
		if got.src != c.src || got.dst != c.dst || got.qsrc != c.qsrc || got.qdst != c.qdst || got.qsport != c.qsport || got.qdpt != c.qdport {
			t.Errorf("%s: got %s -> %s quoting [%s]:%d -> [%s]:%d", c.desc, got.src, got.dst, got.qsrc, got.qsport, got.qdst, got.qdpt)
		}
		if got.ttl != 63 || !bytes.Equal(got.dstMAC, macClient) {
			t.Errorf("%s: hop limit %d, destination MAC %s", c.desc, got.ttl, got.dstMAC)
		}
	}
	// Neighbour solicitation (type 135) and echo request pass untouched.
	for _, typ := range []uint8{135, 128} {
		in := icmp6Error(macClient, macFront, client6, vip6, typ, 0, toBackend)
		if verdict, out := runProg(t, ns, prog, in); verdict != verdictNext || !bytes.Equal(out, in) {
			t.Errorf("ICMPv6 type %d: verdict %d, changed %v", typ, verdict, !bytes.Equal(out, in))
		}
	}
}
