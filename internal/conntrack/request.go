package conntrack

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// The ctnetlink requests of connection sync, encoded by hand into one
// reused buffer: building them with a general attribute encoder (a tree of
// attributes, a slice for each) cost more than the kernel's own work, most
// of a synchronised connection's 10 us (perf; BenchmarkInstallConns).
// TestRequestEncoding holds this encoder to ti-mo/netfilter's, byte for
// byte.

// ctnetlink message types and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	msgNew    = 0 // IPCTNL_MSG_CT_NEW
	msgDelete = 2 // IPCTNL_MSG_CT_DELETE

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaProtoinfo  = 4
	ctaNatSrc     = 6
	ctaTimeout    = 7
	ctaMark       = 8
	ctaNatDst     = 13

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4
	ctaProtoNum   = 1
	ctaProtoSrc   = 2
	ctaProtoDst   = 3

	ctaNatV4MinIP = 1
	ctaNatV4MaxIP = 2
	ctaNatProto   = 3
	ctaNatV6MinIP = 4
	ctaNatV6MaxIP = 5
	ctaPortMin    = 1
	ctaPortMax    = 2

	ctaProtoinfoTCP      = 1
	ctaProtoinfoTCPState = 1

	statusSeenReply = 1 << 1
	statusAssured   = 1 << 2
	// The kernel marks a new entry confirmed before it applies CTA_STATUS
	// and refuses (EBUSY) a status that would clear that bit.
	statusConfirmed = 1 << 3

	nfnlSubsysCTNetlink = 1 // NFNL_SUBSYS_CTNETLINK
	nlaNested           = 0x8000
)

// appendRequest appends the ctnetlink request of c to dst: typ msgNew
// (with flags netlink Create|Excl to create it with its NAT bindings, 0
// to update it) or msgDelete. Its sequence number is set when it is sent
// (nlSocket.exec).
func appendRequest(dst []byte, c dataplane.SyncConn, typ uint8, flags uint16) []byte {
	start := len(dst)
	fam := byte(unix.AF_INET)
	if c.Client.Addr().Is6() {
		fam = unix.AF_INET6
	}
	// nlmsghdr (length filled in below), then nfgenmsg.
	dst = binary.NativeEndian.AppendUint32(dst, 0)
	dst = binary.NativeEndian.AppendUint16(dst, nfnlSubsysCTNetlink<<8|uint16(typ))
	dst = binary.NativeEndian.AppendUint16(dst, unix.NLM_F_REQUEST|unix.NLM_F_ACK|flags)
	dst = binary.NativeEndian.AppendUint32(dst, 0) // seq
	dst = binary.NativeEndian.AppendUint32(dst, 0) // pid
	dst = append(dst, fam, 0, 0, 0)                // family, version, resource id
	dst = appendTuple(dst, ctaTupleOrig, c.Proto, c.Client, c.VIP)
	if typ == msgNew {
		// The reply tuple as it stands before translation; the NAT
		// bindings below turn it into the translated one.
		dst = appendTuple(dst, ctaTupleReply, c.Proto, c.VIP, c.Client)
		if flags&unix.NLM_F_CREATE != 0 {
			if c.Backend != c.VIP {
				dst = appendNatRange(dst, ctaNatDst, c.Backend)
			}
			if c.Reply != c.Client {
				dst = appendNatRange(dst, ctaNatSrc, c.Reply)
			}
		}
		timeout := c.Timeout
		if timeout == 0 {
			timeout = 120
		}
		dst = appendU32(dst, ctaTimeout, timeout)
		if c.Mark != 0 {
			dst = appendU32(dst, ctaMark, c.Mark)
		}
		if c.Proto == unix.IPPROTO_TCP && c.TCPState != 0 {
			p := beginNested(&dst, ctaProtoinfo)
			t := beginNested(&dst, ctaProtoinfoTCP)
			dst = appendAttr(dst, ctaProtoinfoTCPState, c.TCPState)
			endNested(dst, t)
			endNested(dst, p)
		}
		if c.Proto != unix.IPPROTO_TCP || c.TCPState >= tcpEstablished {
			dst = appendU32(dst, ctaStatus, statusSeenReply|statusAssured|statusConfirmed)
		}
	}
	binary.NativeEndian.PutUint32(dst[start:], uint32(len(dst)-start))
	return dst
}

// appendAttr appends attribute t with payload b, padded to 4 bytes.
func appendAttr(dst []byte, t uint16, b ...byte) []byte {
	dst = binary.NativeEndian.AppendUint16(dst, uint16(unix.NLA_HDRLEN+len(b)))
	dst = binary.NativeEndian.AppendUint16(dst, t)
	dst = append(dst, b...)
	for i := len(b); i%4 != 0; i++ {
		dst = append(dst, 0)
	}
	return dst
}

// appendU32 and appendU16 append network-order integers, as ctnetlink
// takes them.
func appendU32(dst []byte, t uint16, v uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return appendAttr(dst, t, b[:]...)
}

func appendU16(dst []byte, t uint16, v uint16) []byte {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return appendAttr(dst, t, b[:]...)
}

// beginNested opens nested attribute t; endNested writes its length.
func beginNested(dst *[]byte, t uint16) int {
	at := len(*dst)
	*dst = binary.NativeEndian.AppendUint16(*dst, 0)
	*dst = binary.NativeEndian.AppendUint16(*dst, t|nlaNested)
	return at
}

func endNested(dst []byte, at int) {
	binary.NativeEndian.PutUint16(dst[at:], uint16(len(dst)-at))
}

func appendAddr(dst []byte, t uint16, a netip.Addr) []byte {
	if a.Is4() {
		b := a.As4()
		return appendAttr(dst, t, b[:]...)
	}
	b := a.As16()
	return appendAttr(dst, t, b[:]...)
}

func appendTuple(dst []byte, t uint16, proto uint8, src, dst2 netip.AddrPort) []byte {
	ipSrc, ipDst := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if src.Addr().Is6() {
		ipSrc, ipDst = ctaIPv6Src, ctaIPv6Dst
	}
	tu := beginNested(&dst, t)
	ip := beginNested(&dst, ctaTupleIP)
	dst = appendAddr(dst, ipSrc, src.Addr())
	dst = appendAddr(dst, ipDst, dst2.Addr())
	endNested(dst, ip)
	pr := beginNested(&dst, ctaTupleProto)
	dst = appendAttr(dst, ctaProtoNum, proto)
	dst = appendU16(dst, ctaProtoSrc, src.Port())
	dst = appendU16(dst, ctaProtoDst, dst2.Port())
	endNested(dst, pr)
	endNested(dst, tu)
	return dst
}

func appendNatRange(dst []byte, t uint16, to netip.AddrPort) []byte {
	minT, maxT := uint16(ctaNatV4MinIP), uint16(ctaNatV4MaxIP)
	if to.Addr().Is6() {
		minT, maxT = ctaNatV6MinIP, ctaNatV6MaxIP
	}
	n := beginNested(&dst, t)
	dst = appendAddr(dst, minT, to.Addr())
	dst = appendAddr(dst, maxT, to.Addr())
	p := beginNested(&dst, ctaNatProto)
	dst = appendU16(dst, ctaPortMin, to.Port())
	dst = appendU16(dst, ctaPortMax, to.Port())
	endNested(dst, p)
	endNested(dst, n)
	return dst
}
