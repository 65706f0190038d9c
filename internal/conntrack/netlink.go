package conntrack

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// nlSocket is a raw NETLINK_NETFILTER socket that sends a batch of
// requests in one write and reads back one acknowledgement for it, and the
// failures. (The netlink libraries send one request and wait for its
// answer: on a busy machine that is a scheduler round trip, tens of
// microseconds, per connection installed.)
type nlSocket struct {
	fd   int
	seq  uint32
	buf  []byte          // what is read
	out  []byte          // what is written
	acks map[uint32]bool // exec's
}

// nlSockets keeps sockets' room (not their descriptors) between calls:
// 64 KiB read and up to 64 KiB written for each batch installed was most
// of the garbage of the nft plane's sync (BenchmarkSyncNftPerConn).
var nlSockets = sync.Pool{New: func() any {
	return &nlSocket{buf: make([]byte, 1<<16), out: make([]byte, 0, 64<<10), acks: map[uint32]bool{}}
}}

// openNetlink opens a socket in the calling thread's namespace; close
// it when done. It binds the first free port id of ids (the kernel
// picks one when none is free, or none is given).
func openNetlink(ids ...uint32) (*nlSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("open ctnetlink socket: %w", err)
	}
	bound := false
	for _, id := range ids {
		if unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: id}) == nil {
			bound = true
			break
		}
	}
	if !bound {
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("bind ctnetlink socket: %w", err)
		}
	}
	// Acknowledgements of errors without the request echoed back, and
	// room for a whole batch of them.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	s := nlSockets.Get().(*nlSocket)
	s.fd = fd
	return s, nil
}

func (s *nlSocket) close() {
	unix.Close(s.fd)
	s.fd = -1
	nlSockets.Put(s)
}

// exec sends the requests (each a whole netlink message) and returns each
// one's errno (0: done). Many requests go in one write, and only the last
// of a write asks for an acknowledgement: the kernel answers a request
// without NLM_F_ACK only when it fails, and answers a write's requests in
// order, so once the last one's acknowledgement is in, every failure of
// that write has arrived before it (one message back per write, not one
// per connection). errs (as long as reqs) gets each one's errno.
func (s *nlSocket) exec(reqs [][]byte, errs []unix.Errno) error {
	clear(errs)
	first := s.seq + 1
	// acks: the sequence numbers whose acknowledgement ends a write.
	acks := s.acks
	clear(acks)
	// Up to 64 KiB a write: the kernel takes a write's messages one by
	// one, as if each had come alone.
	out := s.out[:0]
	defer func() { s.out = out[:0] }()
	last := -1 // offset in out of the last message
	flush := func() error {
		if len(out) == 0 {
			return nil
		}
		flags := binary.NativeEndian.Uint16(out[last+6 : last+8])
		binary.NativeEndian.PutUint16(out[last+6:last+8], flags|unix.NLM_F_ACK)
		acks[binary.NativeEndian.Uint32(out[last+8:last+12])] = true
		err := unix.Sendto(s.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		out, last = out[:0], -1
		return err
	}
	for _, r := range reqs {
		s.seq++
		binary.NativeEndian.PutUint32(r[8:12], s.seq)
		flags := binary.NativeEndian.Uint16(r[6:8])
		binary.NativeEndian.PutUint16(r[6:8], flags&^unix.NLM_F_ACK)
		if len(out)+len(r) > 64<<10 {
			if err := flush(); err != nil {
				return fmt.Errorf("send to ctnetlink: %w", err)
			}
		}
		last = len(out)
		out = append(out, r...)
	}
	if err := flush(); err != nil {
		return fmt.Errorf("send to ctnetlink: %w", err)
	}
	for len(acks) > 0 {
		n, _, err := unix.Recvfrom(s.fd, s.buf, 0)
		if err != nil {
			return fmt.Errorf("receive from ctnetlink: %w", err)
		}
		b := s.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return fmt.Errorf("receive from ctnetlink: message of %d bytes in %d", l, len(b))
			}
			typ := binary.NativeEndian.Uint16(b[4:6])
			seq := binary.NativeEndian.Uint32(b[8:12])
			if typ == unix.NLMSG_ERROR && l >= unix.NLMSG_HDRLEN+4 && seq >= first && seq < first+uint32(len(reqs)) {
				code := int32(binary.NativeEndian.Uint32(b[16:20]))
				errs[seq-first] = unix.Errno(-code)
				delete(acks, seq)
			}
			b = b[(l+3)&^3:]
		}
	}
	return nil
}
