package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// The kernel's conntrack events, read from a raw NETLINK_NETFILTER socket
// in the new, update and destroy groups and decoded in place: a general
// netlink library peeked at each message, read it into a new buffer and
// built a tree of attributes for it, about 12 us of the sending node's CPU
// per synchronised connection (perf; BenchmarkEventsPerConn).

// ctnetlink multicast groups (enum nfnetlink_groups) and the attributes of
// an event besides those of a request (request.go).
const (
	groupCTNew     = 1 // NFNLGRP_CONNTRACK_NEW
	groupCTUpdate  = 2
	groupCTDestroy = 3

	nlaTypeMask = 0x3fff
)

// eventSocket is the event groups' socket.
type eventSocket struct {
	fd  int
	buf []byte
	// datagrams counts the datagrams read.
	datagrams atomic.Uint64
}

// dialWatch opens the event socket in the calling thread's namespace. A
// read waits at most batchWait, so the reader can flush a batch and see
// its context end. The kernel drops the events of changes made through
// the syncer's own install sockets before they are queued (ownFilter).
func (s *Syncer) dialWatch() (*eventSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack events: open ctnetlink socket: %w", err)
	}
	if err := attachOwnFilter(fd, s.installIDs()[0]); err != nil {
		unix.Close(fd)
		return nil, err
	}
	groups := uint32(1<<(groupCTNew-1) | 1<<(groupCTUpdate-1) | 1<<(groupCTDestroy-1))
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: groups}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("conntrack events: join groups: %w", err)
	}
	// A burst of new connections must not overflow the socket (ENOBUFS
	// loses events): 8 MiB holds tens of thousands of them.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	tv := unix.NsecToTimeval(batchWait.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("conntrack events: set receive timeout: %w", err)
	}
	return &eventSocket{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (w *eventSocket) close() { unix.Close(w.fd) }

// errTimeout: nothing arrived within batchWait.
var errTimeout = errors.New("no event")

// read returns the next datagram's messages (valid until the next read),
// errTimeout when none came in time, and an error naming ENOBUFS when the
// kernel dropped events for want of room.
func (w *eventSocket) read() ([]byte, error) {
	for {
		n, _, err := unix.Recvfrom(w.fd, w.buf, 0)
		switch {
		case err == nil:
			w.datagrams.Add(1)
			return w.buf[:n], nil
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EWOULDBLOCK):
			return nil, errTimeout
		case errors.Is(err, unix.EINTR):
			continue
		}
		return nil, fmt.Errorf("receive conntrack events: %w", err)
	}
}

// ctFlow is what sync reads of a conntrack entry.
type ctFlow struct {
	proto         uint8
	orig, reply   [2]netip.AddrPort // source, destination
	timeout, mark uint32
	tcpState      uint8
	hasTCPState   bool
	origOK, repOK bool
}

// forAttrs calls fn for each attribute in b (its type without the nested
// and byte-order flags).
func forAttrs(b []byte, fn func(typ uint16, v []byte)) {
	for len(b) >= unix.NLA_HDRLEN {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.NLA_HDRLEN || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask, b[unix.NLA_HDRLEN:l])
		b = b[min((l+3)&^3, len(b)):]
	}
}

// parseTuple reads a CTA_TUPLE_ORIG or _REPLY.
func parseTuple(b []byte, proto *uint8) (t [2]netip.AddrPort, ok bool) {
	var addrs [2]netip.Addr
	var ports [2]uint16
	var have int
	forAttrs(b, func(typ uint16, v []byte) {
		switch typ {
		case ctaTupleIP:
			forAttrs(v, func(typ uint16, v []byte) {
				switch {
				case (typ == ctaIPv4Src || typ == ctaIPv4Dst) && len(v) == 4:
					addrs[(typ-ctaIPv4Src)%2] = netip.AddrFrom4([4]byte(v))
					have++
				case (typ == ctaIPv6Src || typ == ctaIPv6Dst) && len(v) == 16:
					addrs[(typ-ctaIPv6Src)%2] = netip.AddrFrom16([16]byte(v)).Unmap()
					have++
				}
			})
		case ctaTupleProto:
			forAttrs(v, func(typ uint16, v []byte) {
				switch {
				case typ == ctaProtoNum && len(v) >= 1:
					*proto = v[0]
				case (typ == ctaProtoSrc || typ == ctaProtoDst) && len(v) >= 2:
					ports[typ-ctaProtoSrc] = binary.BigEndian.Uint16(v)
				}
			})
		}
	})
	return [2]netip.AddrPort{netip.AddrPortFrom(addrs[0], ports[0]), netip.AddrPortFrom(addrs[1], ports[1])}, have == 2
}

// parseFlow reads an event's attributes (after the nfgenmsg header).
func parseFlow(b []byte) ctFlow {
	var f ctFlow
	forAttrs(b, func(typ uint16, v []byte) {
		switch typ {
		case ctaTupleOrig:
			f.orig, f.origOK = parseTuple(v, &f.proto)
		case ctaTupleReply:
			var p uint8
			f.reply, f.repOK = parseTuple(v, &p)
		case ctaTimeout:
			if len(v) == 4 {
				f.timeout = binary.BigEndian.Uint32(v)
			}
		case ctaMark:
			if len(v) == 4 {
				f.mark = binary.BigEndian.Uint32(v)
			}
		case ctaProtoinfo:
			forAttrs(v, func(typ uint16, v []byte) {
				if typ != ctaProtoinfoTCP {
					return
				}
				forAttrs(v, func(typ uint16, v []byte) {
					if typ == ctaProtoinfoTCPState && len(v) >= 1 {
						f.tcpState, f.hasTCPState = v[0], true
					}
				})
			})
		}
	})
	return f
}

// eachEvent calls fn for each conntrack event message in a datagram: its
// kind and flow.
func eachEvent(b []byte, fn func(kind dataplane.ConnEventKind, f ctFlow)) {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		flags := binary.NativeEndian.Uint16(b[6:8])
		msg := b[unix.NLMSG_HDRLEN:l]
		b = b[min((l+3)&^3, len(b)):]
		if typ>>8 != nfnlSubsysCTNetlink || len(msg) < 4 {
			continue
		}
		var kind dataplane.ConnEventKind
		switch uint8(typ) {
		case msgNew:
			// New and update share the message type; the flags tell.
			kind = dataplane.ConnUpdate
			if flags&(unix.NLM_F_CREATE|unix.NLM_F_EXCL) != 0 {
				kind = dataplane.ConnNew
			}
		case msgDelete:
			kind = dataplane.ConnEnd
		default:
			continue
		}
		fn(kind, parseFlow(msg[4:]))
	}
}
