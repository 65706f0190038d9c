package conntrack

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// nlSocket is a raw NETLINK_NETFILTER socket that sends a batch of
// requests in one write and reads their acknowledgements together. (The
// netlink libraries send one request and wait for its answer: on a busy
// machine that is a scheduler round trip, tens of microseconds, per
// connection installed.)
type nlSocket struct {
	fd  int
	seq uint32
	buf []byte
}

func openNetlink() (*nlSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("open ctnetlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind ctnetlink socket: %w", err)
	}
	// Acknowledgements of errors without the request echoed back, and
	// room for a whole batch of them.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	return &nlSocket{fd: fd, buf: make([]byte, 1<<16)}, nil
}

func (s *nlSocket) close() { unix.Close(s.fd) }

// exec sends the requests (each a whole netlink message asking for an
// acknowledgement) and returns each one's errno (0: done).
func (s *nlSocket) exec(reqs [][]byte) ([]unix.Errno, error) {
	errs := make([]unix.Errno, len(reqs))
	first := s.seq + 1
	// Up to 64 KiB a write: the kernel takes a write's messages one by
	// one, as if each had come alone.
	var out []byte
	flush := func() error {
		if len(out) == 0 {
			return nil
		}
		err := unix.Sendto(s.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		out = out[:0]
		return err
	}
	for _, r := range reqs {
		s.seq++
		binary.NativeEndian.PutUint32(r[8:12], s.seq)
		if len(out)+len(r) > 64<<10 {
			if err := flush(); err != nil {
				return nil, fmt.Errorf("send to ctnetlink: %w", err)
			}
		}
		out = append(out, r...)
	}
	if err := flush(); err != nil {
		return nil, fmt.Errorf("send to ctnetlink: %w", err)
	}
	for got := 0; got < len(reqs); {
		n, _, err := unix.Recvfrom(s.fd, s.buf, 0)
		if err != nil {
			return nil, fmt.Errorf("receive from ctnetlink: %w", err)
		}
		b := s.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return nil, fmt.Errorf("receive from ctnetlink: message of %d bytes in %d", l, len(b))
			}
			typ := binary.NativeEndian.Uint16(b[4:6])
			seq := binary.NativeEndian.Uint32(b[8:12])
			if typ == unix.NLMSG_ERROR && l >= unix.NLMSG_HDRLEN+4 && seq >= first && seq < first+uint32(len(reqs)) {
				code := int32(binary.NativeEndian.Uint32(b[16:20]))
				errs[seq-first] = unix.Errno(-code)
				got++
			}
			b = b[(l+3)&^3:]
		}
	}
	return errs, nil
}
