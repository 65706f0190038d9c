package ebpf

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestRejectFixtures: a new flow (TCP SYN, UDP datagram) to a farm without
// a serving backend, IPv4 and IPv6, comes back out of the interface it came
// in on as an ICMP (ICMPv6) destination unreachable / port unreachable from
// the VIP to the client, MACs swapped, with valid checksums, quoting the
// packet's IP header and its UDP header (8 bytes) or its TCP header without
// options (20). An IPv4 packet with options is dropped instead.
func TestRejectFixtures(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	p := newPlane(t, ns, mountBPFFS(t), []string{"front"}, 4096)
	a := netip.MustParseAddr
	client6, vip6 := a("fd00:100::2"), a("fd00:99::3")
	var farms []*model.Farm
	for _, c := range []struct {
		name  string
		vip   netip.Addr
		proto model.Protocol
	}{{"tcp4", vip3, model.ProtoTCP}, {"udp4", vip3, model.ProtoUDP}, {"tcp6", vip6, model.ProtoTCP}, {"udp6", vip6, model.ProtoUDP}} {
		f := model.NewFarm(c.name)
		f.Family = model.FamilyIPv4
		if c.vip.Is6() {
			f.Family = model.FamilyIPv6
		}
		f.VirtualAddr = c.vip
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		f.Protocol, f.Mode = c.proto, model.ModeDNAT
		if err := check(&f); err != nil {
			t.Fatal(err)
		}
		farms = append(farms, &f)
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	prog := p.objs.XlbIngress
	for _, c := range []struct {
		desc string
		in   pktSpec
	}{
		{"tcp4 syn", pktSpec{src: client, sport: 40000, dst: vip3, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}},
		{"udp4", pktSpec{src: client, sport: 5000, dst: vip3, dport: 80, proto: protoUDP, payload: []byte("hello, anyone?")}},
		{"tcp6 syn", pktSpec{src: client6, sport: 40000, dst: vip6, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}},
		{"udp6", pktSpec{src: client6, sport: 5000, dst: vip6, dport: 80, proto: protoUDP, payload: []byte("x")}},
	} {
		in := c.in.build()
		verdict, out := runProg(t, ns, prog, in)
		if verdict != verdictRedirect {
			t.Errorf("%s: verdict %d, want redirect", c.desc, verdict)
			continue
		}
		if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || !bytes.Equal(out[12:14], in[12:14]) {
			t.Errorf("%s: Ethernet header %x, want the input's %x with the MACs swapped", c.desc, out[:14], in[:14])
		}
		v6 := c.in.src.Is6()
		ipLen, typ, code, proto := 20, byte(3), byte(3), byte(1)
		if v6 {
			ipLen, typ, code, proto = 40, 1, 4, 58
		}
		quote := ipLen + 8 // UDP header
		if c.in.proto == protoTCP {
			quote = ipLen + 20 // TCP header without options
		}
		if len(out) != 14+ipLen+8+quote {
			t.Errorf("%s: %d bytes, want %d", c.desc, len(out), 14+ipLen+8+quote)
			continue
		}
		ip, icmp := out[14:14+ipLen], out[14+ipLen:]
		var src, dst netip.Addr
		if v6 {
			src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
			if ip[0]>>4 != 6 || ip[6] != proto || ip[7] != 64 || int(binary.BigEndian.Uint16(ip[4:])) != len(icmp) {
				t.Errorf("%s: IPv6 header %x", c.desc, ip)
			}
		} else {
			src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
			if ip[0] != 0x45 || ip[9] != proto || ip[8] != 64 || int(binary.BigEndian.Uint16(ip[2:])) != ipLen+len(icmp) {
				t.Errorf("%s: IPv4 header %x", c.desc, ip)
			}
			if csumFold(csumAdd(0, ip)) != 0 {
				t.Errorf("%s: bad IPv4 header checksum in %x", c.desc, ip)
			}
		}
		if src != c.in.dst || dst != c.in.src {
			t.Errorf("%s: %s -> %s, want %s -> %s", c.desc, src, dst, c.in.dst, c.in.src)
		}
		if icmp[0] != typ || icmp[1] != code {
			t.Errorf("%s: ICMP type %d code %d, want %d %d", c.desc, icmp[0], icmp[1], typ, code)
		}
		var sum uint32
		if v6 {
			sum = csumAdd(sum, ip[8:40])
			sum += uint32(len(icmp)) + 58
		}
		if csumFold(csumAdd(sum, icmp)) != 0 {
			t.Errorf("%s: bad ICMP checksum in %x", c.desc, icmp)
		}
		if !bytes.Equal(icmp[8:], in[14:14+quote]) {
			t.Errorf("%s: quote %x, want the packet's first %d bytes %x", c.desc, icmp[8:], quote, in[14:14+quote])
		}
	}
	opts := pktSpec{src: client, sport: 40001, dst: vip3, dport: 80, proto: protoTCP, tcpFlags: tcpSYN, ipOptions: []byte{1, 1, 1, 0}}.build()
	if verdict, _ := runProg(t, ns, prog, opts); verdict != verdictDrop {
		t.Errorf("IPv4 with options: verdict %d, want drop", verdict)
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st["no_backend"] != 5 {
		t.Errorf("no_backend counter %d, want 5", st["no_backend"])
	}
}
