package ebpf

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Hand-built packets for BPF_PROG_TEST_RUN fixtures: Ethernet + IPv4
// (options allowed) + TCP or UDP, with correct checksums.

const (
	protoTCP = 6
	protoUDP = 17

	tcpSYN = 0x02
	tcpACK = 0x10
)

type pktSpec struct {
	srcMAC, dstMAC net.HardwareAddr
	src, dst       netip.Addr
	sport, dport   uint16
	proto          uint8
	tcpFlags       uint8
	ttl            uint8 // 0: 64
	tos            uint8 // IPv4 TOS, IPv6 traffic class (DSCP << 2 | ECN)
	ipOptions      []byte
	fragOff        uint16 // raw flags+offset field (0x2000 = MF)
	payload        []byte
	udpNoCsum      bool
	nextHdr        uint8 // IPv6: next header to write instead of proto (e.g. 44, a fragment header)
}

var (
	macClient = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	macLB     = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
)

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func l4Csum(src, dst netip.Addr, proto uint8, l4 []byte) uint16 {
	var sum uint32
	sum = csumAdd(sum, src.AsSlice())
	sum = csumAdd(sum, dst.AsSlice())
	sum += uint32(proto) + uint32(len(l4))
	sum = csumAdd(sum, l4)
	return csumFold(sum)
}

func (s pktSpec) build() []byte {
	if s.srcMAC == nil {
		s.srcMAC = macClient
	}
	if s.dstMAC == nil {
		s.dstMAC = macLB
	}
	if s.ttl == 0 {
		s.ttl = 64
	}
	var l4 []byte
	if s.proto == protoTCP {
		l4 = make([]byte, 20, 20+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.sport)
		binary.BigEndian.PutUint16(l4[2:], s.dport)
		binary.BigEndian.PutUint32(l4[4:], 1000)
		l4[12] = 5 << 4
		l4[13] = s.tcpFlags
		binary.BigEndian.PutUint16(l4[14:], 65535)
	} else {
		l4 = make([]byte, 8, 8+len(s.payload))
		binary.BigEndian.PutUint16(l4[0:], s.sport)
		binary.BigEndian.PutUint16(l4[2:], s.dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(s.payload)))
	}
	l4 = append(l4, s.payload...)
	if s.proto == protoTCP {
		binary.BigEndian.PutUint16(l4[16:], l4Csum(s.src, s.dst, s.proto, l4))
	} else if !s.udpNoCsum {
		binary.BigEndian.PutUint16(l4[6:], l4Csum(s.src, s.dst, s.proto, l4))
	}
	if s.src.Is6() {
		ip := make([]byte, 40)
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(s.tos)<<20|0x12345) // a flow label to keep
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6] = s.proto
		if s.nextHdr != 0 {
			ip[6] = s.nextHdr
		}
		ip[7] = s.ttl
		copy(ip[8:], s.src.AsSlice())
		copy(ip[24:], s.dst.AsSlice())
		out := make([]byte, 0, 14+len(ip)+len(l4))
		out = append(out, s.dstMAC...)
		out = append(out, s.srcMAC...)
		out = append(out, 0x86, 0xdd)
		out = append(out, ip...)
		return append(out, l4...)
	}
	ihl := 20 + len(s.ipOptions)
	ip := make([]byte, ihl)
	ip[0] = 0x40 | byte(ihl/4)
	ip[1] = s.tos
	binary.BigEndian.PutUint16(ip[2:], uint16(ihl+len(l4)))
	binary.BigEndian.PutUint16(ip[4:], 0x1234)
	binary.BigEndian.PutUint16(ip[6:], s.fragOff)
	ip[8] = s.ttl
	ip[9] = s.proto
	src, dst := s.src.As4(), s.dst.As4()
	copy(ip[12:], src[:])
	copy(ip[16:], dst[:])
	copy(ip[20:], s.ipOptions)
	binary.BigEndian.PutUint16(ip[10:], csumFold(csumAdd(0, ip)))
	out := make([]byte, 0, 14+len(ip)+len(l4))
	out = append(out, s.dstMAC...)
	out = append(out, s.srcMAC...)
	out = append(out, 0x08, 0x00)
	out = append(out, ip...)
	return append(out, l4...)
}

// parsedPkt is what a fixture checks in an output packet.
type parsedPkt struct {
	srcMAC, dstMAC net.HardwareAddr
	src, dst       netip.Addr
	sport, dport   uint16
	ttl            uint8
	tos            uint8  // IPv4 TOS, IPv6 traffic class
	flow           uint32 // IPv6 flow label
	ihl            int
	l4Csum         uint16
}

// parse parses an Ethernet/IPv4/TCP-or-UDP packet and verifies its
// checksums.
func parse(b []byte) (parsedPkt, error) {
	var p parsedPkt
	if len(b) >= 54 && binary.BigEndian.Uint16(b[12:]) == 0x86dd {
		return parse6(b)
	}
	if len(b) < 34 || binary.BigEndian.Uint16(b[12:]) != 0x0800 {
		return p, fmt.Errorf("not an IPv4 packet")
	}
	p.dstMAC, p.srcMAC = net.HardwareAddr(b[0:6]), net.HardwareAddr(b[6:12])
	ip := b[14:]
	p.ihl = int(ip[0]&0xf) * 4
	if csumFold(csumAdd(0, ip[:p.ihl])) != 0 {
		return p, fmt.Errorf("bad IPv4 header checksum")
	}
	p.ttl = ip[8]
	p.tos = ip[1]
	p.src = netip.AddrFrom4([4]byte(ip[12:16]))
	p.dst = netip.AddrFrom4([4]byte(ip[16:20]))
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	l4 := ip[p.ihl:tot]
	p.sport = binary.BigEndian.Uint16(l4[0:])
	p.dport = binary.BigEndian.Uint16(l4[2:])
	proto := ip[9]
	var off int
	switch proto {
	case protoTCP:
		off = 16
	case protoUDP:
		off = 6
	default:
		return p, fmt.Errorf("protocol %d", proto)
	}
	p.l4Csum = binary.BigEndian.Uint16(l4[off:])
	if proto == protoUDP && p.l4Csum == 0 {
		return p, nil
	}
	if l4Csum(p.src, p.dst, proto, l4) != 0 {
		return p, fmt.Errorf("bad %d checksum", proto)
	}
	return p, nil
}

// parse6 is parse for IPv6 (no extension headers): ttl is the hop limit.
func parse6(b []byte) (parsedPkt, error) {
	var p parsedPkt
	p.dstMAC, p.srcMAC = net.HardwareAddr(b[0:6]), net.HardwareAddr(b[6:12])
	ip := b[14:]
	p.ttl = ip[7]
	w := binary.BigEndian.Uint32(ip[0:])
	p.tos, p.flow = uint8(w>>20), w&0xfffff
	p.src = netip.AddrFrom16([16]byte(ip[8:24]))
	p.dst = netip.AddrFrom16([16]byte(ip[24:40]))
	plen := int(binary.BigEndian.Uint16(ip[4:]))
	if len(ip) < 40+plen {
		return p, fmt.Errorf("payload length %d beyond the packet", plen)
	}
	l4 := ip[40 : 40+plen]
	p.sport = binary.BigEndian.Uint16(l4[0:])
	p.dport = binary.BigEndian.Uint16(l4[2:])
	off := 16
	if ip[6] == protoUDP {
		off = 6
	} else if ip[6] != protoTCP {
		return p, fmt.Errorf("next header %d", ip[6])
	}
	p.l4Csum = binary.BigEndian.Uint16(l4[off:])
	if l4Csum(p.src, p.dst, ip[6], l4) != 0 {
		return p, fmt.Errorf("bad %d checksum", ip[6])
	}
	return p, nil
}

// icmpError builds an ICMP error (type, code) from src to dst quoting the
// first 28 bytes (IPv4 header + 8) of the packet quoted.
func icmpError(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, typ, code uint8, quoted []byte) []byte {
	q := quoted[14:]
	if len(q) > 28 {
		q = q[:28]
	}
	icmp := make([]byte, 8, 8+len(q))
	icmp[0], icmp[1] = typ, code
	if typ == 3 && code == 4 {
		binary.BigEndian.PutUint16(icmp[6:], 1400) // next-hop MTU
	}
	icmp = append(icmp, q...)
	binary.BigEndian.PutUint16(icmp[2:], csumFold(csumAdd(0, icmp)))
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(icmp)))
	ip[8] = 64
	ip[9] = 1
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], csumFold(csumAdd(0, ip)))
	out := append([]byte{}, dstMAC...)
	out = append(out, srcMAC...)
	out = append(out, 0x08, 0x00)
	out = append(out, ip...)
	return append(out, icmp...)
}

// parsedICMP is an ICMP error's outer and quoted tuple, checksums verified.
type parsedICMP struct {
	dstMAC       net.HardwareAddr
	src, dst     netip.Addr
	ttl          uint8
	qsrc, qdst   netip.Addr
	qsport, qdpt uint16
}

func parseICMP(b []byte) (parsedICMP, error) {
	var p parsedICMP
	if len(b) < 14+20+8+28 || b[14+9] != 1 {
		return p, fmt.Errorf("not an ICMP packet")
	}
	ip := b[14:]
	if csumFold(csumAdd(0, ip[:20])) != 0 {
		return p, fmt.Errorf("bad IPv4 header checksum")
	}
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if csumFold(csumAdd(0, ip[20:tot])) != 0 {
		return p, fmt.Errorf("bad ICMP checksum")
	}
	q := ip[28:]
	if csumFold(csumAdd(0, q[:20])) != 0 {
		return p, fmt.Errorf("bad quoted IPv4 header checksum")
	}
	p.dstMAC = net.HardwareAddr(b[0:6])
	p.ttl = ip[8]
	p.src, p.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	p.qsrc, p.qdst = netip.AddrFrom4([4]byte(q[12:16])), netip.AddrFrom4([4]byte(q[16:20]))
	p.qsport, p.qdpt = binary.BigEndian.Uint16(q[20:]), binary.BigEndian.Uint16(q[22:])
	return p, nil
}
