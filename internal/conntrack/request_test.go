package conntrack

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// TestRequestEncoding: the hand encoder (request.go) writes the very bytes
// ti-mo/netfilter's attribute encoder wrote for each kind of request (new
// with NAT bindings, update, delete; IPv4 and IPv6; dnat and snat; TCP in
// several states, UDP, a mark).
func TestRequestEncoding(t *testing.T) {
	conns := []dataplane.SyncConn{
		{Proto: unix.IPPROTO_TCP, Client: netip.MustParseAddrPort("10.100.0.2:40000"), VIP: netip.MustParseAddrPort("10.99.0.1:80"),
			Backend: netip.MustParseAddrPort("10.200.0.11:8080"), Reply: netip.MustParseAddrPort("10.100.0.2:40000"), Timeout: 300, TCPState: tcpEstablished},
		{Proto: unix.IPPROTO_TCP, Client: netip.MustParseAddrPort("10.100.0.2:40001"), VIP: netip.MustParseAddrPort("10.99.0.1:80"),
			Backend: netip.MustParseAddrPort("10.200.0.11:8080"), Reply: netip.MustParseAddrPort("10.200.0.2:61000"), TCPState: 1, Mark: 7},
		{Proto: unix.IPPROTO_UDP, Client: netip.MustParseAddrPort("[fd00:100::2]:5000"), VIP: netip.MustParseAddrPort("[fd00:99::1]:53"),
			Backend: netip.MustParseAddrPort("[fd00:200::11]:5353"), Reply: netip.MustParseAddrPort("[fd00:200::2]:5000"), Timeout: 30},
		{Proto: unix.IPPROTO_TCP, Client: netip.MustParseAddrPort("[fd00:100::2]:40002"), VIP: netip.MustParseAddrPort("[fd00:99::1]:443"),
			Backend: netip.MustParseAddrPort("[fd00:99::1]:443"), Reply: netip.MustParseAddrPort("[fd00:100::2]:40002"), Timeout: 10, TCPState: 8},
	}
	for i, c := range conns {
		for _, k := range []struct {
			typ   uint8
			flags netlink.HeaderFlags
		}{{msgNew, netlink.Create | netlink.Excl}, {msgNew, 0}, {msgDelete, 0}} {
			want, err := libRequest(c, k.typ, k.flags)
			if err != nil {
				t.Fatal(err)
			}
			// Built after something else in the buffer, as InstallConns does.
			got := appendRequest([]byte("prefix"), c, k.typ, uint16(k.flags))[6:]
			if !bytes.Equal(got, want) {
				t.Errorf("conn %d, type %d, flags %d:\n got %x\nwant %x", i, k.typ, uint16(k.flags), got, want)
			}
		}
	}
}

// BenchmarkRequest is the encoding alone (no kernel).
func BenchmarkRequest(b *testing.B) {
	c := dataplane.SyncConn{Proto: unix.IPPROTO_TCP, Client: netip.MustParseAddrPort("10.100.0.2:40001"), VIP: netip.MustParseAddrPort("10.99.0.1:80"),
		Backend: netip.MustParseAddrPort("10.200.0.11:8080"), Reply: netip.MustParseAddrPort("10.200.0.2:61000"), Timeout: 300, TCPState: tcpEstablished}
	var buf []byte
	for b.Loop() {
		buf = appendRequest(buf[:0], c, msgNew, unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	}
}

// libRequest is request built with ti-mo/netfilter's attribute encoder,
// as xlb built them before: the reference request.go's encoder is held to.
func libRequest(c dataplane.SyncConn, typ uint8, flags netlink.HeaderFlags) ([]byte, error) {
	attrs := []netfilter.Attribute{libTuple(ctaTupleOrig, c.Proto, c.Client, c.VIP)}
	if typ == msgNew {
		// The reply tuple as it stands before translation; the NAT
		// bindings below turn it into the translated one.
		attrs = append(attrs, libTuple(ctaTupleReply, c.Proto, c.VIP, c.Client))
		if flags&netlink.Create != 0 {
			if c.Backend != c.VIP {
				attrs = append(attrs, libNatRange(ctaNatDst, c.Backend))
			}
			if c.Reply != c.Client {
				attrs = append(attrs, libNatRange(ctaNatSrc, c.Reply))
			}
		}
		timeout := c.Timeout
		if timeout == 0 {
			timeout = 120
		}
		attrs = append(attrs, libU32(ctaTimeout, timeout))
		if c.Mark != 0 {
			attrs = append(attrs, libU32(ctaMark, c.Mark))
		}
		if c.Proto == unix.IPPROTO_TCP && c.TCPState != 0 {
			attrs = append(attrs, netfilter.Attribute{Type: ctaProtoinfo, Nested: true, Children: []netfilter.Attribute{
				{Type: ctaProtoinfoTCP, Nested: true, Children: []netfilter.Attribute{
					{Type: ctaProtoinfoTCPState, Data: []byte{c.TCPState}},
				}},
			}})
		}
		if c.Proto != unix.IPPROTO_TCP || c.TCPState >= tcpEstablished {
			attrs = append(attrs, libU32(ctaStatus, statusSeenReply|statusAssured|statusConfirmed))
		}
	}
	fam := netfilter.ProtoIPv4
	if c.Client.Addr().Is6() {
		fam = netfilter.ProtoIPv6
	}
	req, err := netfilter.MarshalNetlink(netfilter.Header{
		SubsystemID: netfilter.NFSubsysCTNetlink,
		MessageType: netfilter.MessageType(typ),
		Family:      fam,
		Flags:       netlink.Request | netlink.Acknowledge | flags,
	}, attrs)
	if err != nil {
		return nil, err
	}
	req.Header.Length = uint32(unix.NLMSG_HDRLEN + len(req.Data))
	return req.MarshalBinary()
}

func libU32(t uint16, v uint32) netfilter.Attribute {
	a := netfilter.Attribute{Type: t}
	a.PutUint32(v)
	return a
}

func libU16(t uint16, v uint16) netfilter.Attribute {
	a := netfilter.Attribute{Type: t}
	a.PutUint16(v)
	return a
}

func libTuple(t uint16, proto uint8, src, dst netip.AddrPort) netfilter.Attribute {
	ipSrc, ipDst := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if src.Addr().Is6() {
		ipSrc, ipDst = ctaIPv6Src, ctaIPv6Dst
	}
	return netfilter.Attribute{Type: t, Nested: true, Children: []netfilter.Attribute{
		{Type: ctaTupleIP, Nested: true, Children: []netfilter.Attribute{
			{Type: ipSrc, Data: src.Addr().AsSlice()},
			{Type: ipDst, Data: dst.Addr().AsSlice()},
		}},
		{Type: ctaTupleProto, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaProtoNum, Data: []byte{proto}},
			libU16(ctaProtoSrc, src.Port()),
			libU16(ctaProtoDst, dst.Port()),
		}},
	}}
}

func libNatRange(t uint16, to netip.AddrPort) netfilter.Attribute {
	minT, maxT := uint16(ctaNatV4MinIP), uint16(ctaNatV4MaxIP)
	if to.Addr().Is6() {
		minT, maxT = ctaNatV6MinIP, ctaNatV6MaxIP
	}
	return netfilter.Attribute{Type: t, Nested: true, Children: []netfilter.Attribute{
		{Type: minT, Data: to.Addr().AsSlice()},
		{Type: maxT, Data: to.Addr().AsSlice()},
		{Type: ctaNatProto, Nested: true, Children: []netfilter.Attribute{
			libU16(ctaPortMin, to.Port()),
			libU16(ctaPortMax, to.Port()),
		}},
	}}
}
