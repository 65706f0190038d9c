package conntrack

import (
	"fmt"
	"math/bits"
	"math/rand/v2"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// A node installs its peers' connections into its own conntrack, and the
// kernel sends the events of those changes to every listener, its own
// watch too, which read and decoded each one only to find it in fromPeers
// and drop it: a second event read per synchronised connection on the
// receiving node. The kernel stamps an event with the netlink port id of
// the socket whose request made it (nlmsg_pid; 0 for the kernel's own
// traffic and timeouts), so the watch socket carries a filter that drops
// the events of the syncer's own install sockets before they are queued.
// The install sockets bind port ids of one block of 16 chosen at random
// per syncer (ids 0x40000000-0x7ffffff0: above any process id the kernel
// hands out first, below the negative ids it hands out next); an install
// that finds all 16 taken (16 at once) binds any id, and its events are
// dropped by fromPeers, as before. conntrackd filters its events in the
// kernel the same way (nfct_filter), by addresses.

// ownIDs is how many port ids a syncer's block holds.
const ownIDs = 16

// installIDs are the port ids for the syncer's install sockets, the
// block's first being its base.
func (s *Syncer) installIDs() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		base := 0x40000000 | rand.Uint32()&0x3ffffff0
		for i := range uint32(ownIDs) {
			s.ids = append(s.ids, base|i)
		}
	}
	return s.ids
}

// ownFilter is the watch socket's filter: a datagram (one event) whose
// nlmsg_pid is in the block of base is dropped. A socket filter loads
// words in network byte order; nlmsg_pid is in the host's (little
// endian), so the block's low four bits are the loaded word's bits 24-27.
func ownFilter(base uint32) ([]bpf.RawInstruction, error) {
	swapped := bits.ReverseBytes32(base)
	return bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 12, Size: 4}, // struct nlmsghdr's nlmsg_pid
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: ^uint32(0x0f000000)},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: swapped, SkipTrue: 1},
		bpf.RetConstant{Val: 0xffffffff}, // keep the whole datagram
		bpf.RetConstant{Val: 0},          // drop
	})
}

// attachOwnFilter attaches ownFilter(base) to socket fd.
func attachOwnFilter(fd int, base uint32) error {
	prog, err := ownFilter(base)
	if err != nil {
		return fmt.Errorf("conntrack events: assemble filter: %w", err)
	}
	f := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		f[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}); err != nil {
		return fmt.Errorf("conntrack events: attach filter: %w", err)
	}
	return nil
}
