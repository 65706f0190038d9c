package nft

import (
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The drift watch (watch.go) must tell xlb's own transactions from
// others'. The kernel sends each transaction's notifications, and the
// NEWGEN message that ends it, with the netlink port id of the socket
// that sent the batch in the header. So every socket this package can
// commit through (dialNFT) records its port id here, and a transaction
// sent from one of them is xlb's own.
//
// Why not the process id the NEWGEN message also carries: the kernel
// puts there the id of the sending *thread* in the initial pid namespace,
// which a process in a container of its own (kube-proxy's usual Pod) has
// no way to map to its own threads.
//
// Port ids are unique among the open sockets of a network namespace; a
// closed socket's id may be reused by another process's socket, which
// the kernel gives the process id first: a foreign commit is taken for
// xlb's own only if its socket got a closed xlb socket's id from the
// kernel's pool of negative ids. So the id of a socket that is closed
// (releasePort) is forgotten a while later, once the watch has surely
// read its last transaction's events.
var owned = struct {
	sync.Mutex
	ports   map[uint32]bool
	retired map[uint32]time.Time
}{ports: map[uint32]bool{}, retired: map[uint32]time.Time{}}

// retireAfter is how long the id of a closed socket stays xlb's.
const retireAfter = time.Minute

// recordPort is a socket option of dialNFT: it records the socket's port
// id as xlb's own.
func recordPort(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var port uint32
	var serr error
	err = rc.Control(func(fd uintptr) {
		sa, err := unix.Getsockname(int(fd))
		if err != nil {
			serr = err
			return
		}
		if nl, ok := sa.(*unix.SockaddrNetlink); ok {
			port = nl.Pid
		}
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	owned.Lock()
	defer owned.Unlock()
	owned.ports[port] = true
	delete(owned.retired, port)
	now := time.Now()
	for p, at := range owned.retired {
		if now.Sub(at) > retireAfter {
			delete(owned.ports, p)
			delete(owned.retired, p)
		}
	}
	return nil
}

// releasePort is called when a socket recordPort saw is closed.
func releasePort(c *netlink.Conn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if sa, err := unix.Getsockname(int(fd)); err == nil {
			if nl, ok := sa.(*unix.SockaddrNetlink); ok {
				owned.Lock()
				owned.retired[nl.Pid] = time.Now()
				owned.Unlock()
			}
		}
	})
}

// ownPort reports whether port is the port id of a socket of xlb's.
func ownPort(port uint32) bool {
	owned.Lock()
	defer owned.Unlock()
	return owned.ports[port]
}
