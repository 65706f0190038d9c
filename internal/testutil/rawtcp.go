package testutil

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TCP flags for SendTCPSegment.
const (
	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPAck = 0x10
)

// SendTCPSegment sends one bare IPv4 TCP segment (20-byte header, no
// payload) with the given flags from src to dst through a raw socket in
// ns. It is for probing how the LB treats odd segments (e.g. SYN+FIN,
// which conntrack calls invalid); the kernel adds the IP header.
func SendTCPSegment(ns netns.NsHandle, src, dst netip.AddrPort, flags uint8, seq uint32) error {
	if !src.Addr().Is4() || !dst.Addr().Is4() {
		return errors.New("send tcp segment: IPv4 only")
	}
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], src.Port())
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], seq)
	seg[12] = 5 << 4
	seg[13] = flags
	binary.BigEndian.PutUint16(seg[14:], 65535)
	binary.BigEndian.PutUint16(seg[16:], tcpChecksum(src.Addr(), dst.Addr(), seg))
	return Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: src.Addr().As4()}); err != nil {
			return fmt.Errorf("bind raw socket to %s: %w", src.Addr(), err)
		}
		return unix.Sendto(fd, seg, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()})
	})
}

func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	s, d := src.As4(), dst.As4()
	add(s[:])
	add(d[:])
	add([]byte{0, unix.IPPROTO_TCP, 0, byte(len(seg))})
	add(seg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// TCPListener receives copies of the IPv4 TCP segments arriving in a
// namespace (a raw socket), to see answers to SendTCPSegment.
type TCPListener struct{ fd int }

// ListenTCPSegments opens a TCPListener in ns; Close it when done.
func ListenTCPSegments(ns netns.NsHandle) (*TCPListener, error) {
	var fd int
	err := Do(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("raw socket: %w", err)
	}
	return &TCPListener{fd: fd}, nil
}

// Close closes the listener.
func (l *TCPListener) Close() error { return unix.Close(l.fd) }

// Wait waits at most timeout for a segment from `from` to local port
// toPort and returns its flags.
func (l *TCPListener) Wait(from netip.AddrPort, toPort uint16, timeout time.Duration) (uint8, bool) {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return 0, false
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(l.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return 0, false
		}
		n, _, err := unix.Recvfrom(l.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return 0, false
		}
		if n < 20 {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		if n < ihl+14 {
			continue
		}
		src, _ := netip.AddrFromSlice(buf[12:16])
		tcp := buf[ihl:n]
		sport, dport := binary.BigEndian.Uint16(tcp[0:]), binary.BigEndian.Uint16(tcp[2:])
		if src == from.Addr() && sport == from.Port() && dport == toPort {
			return tcp[13], true
		}
	}
}
