// Package testutil holds helpers for privileged tests that run real traffic
// through the kernel: network namespaces, a client -> LB -> backends topology,
// small TCP/UDP/HTTP servers and clients that live inside namespaces.
//
// Every helper creates its objects in network namespaces of its own and
// removes them in tb.Cleanup; nothing touches the host's network.
//
// # Privileged tests
//
// Call RequireRoot first. It skips the test without root, unless the
// environment sets XLB_PRIVILEGED_TESTS=1 (CI does), in which case it fails:
// a privileged test never skips silently in CI.
//
// # Topology addressing
//
// NewTopology builds:
//
//	client ns                 lb ns                                 backend ns (one per backend)
//	eth0 10.100.0.2/24  <-->  eth0 10.100.0.1/24
//	     fd00:100::2/64       fd00:100::1/64
//	                          br0  10.200.0.1/24   <-- bridge -->   eth0 10.200.0.11/24, .12, .13, ...
//	                               fd00:200::1/64                        fd00:200::11/64, ::12, ...
//
// The client's and every backend's default routes (IPv4 and IPv6) point at the
// LB, so virtual addresses anywhere off-link reach the LB, and in dnat mode the
// backends' replies return through it. Use addresses from VIPNet4 (10.99.0.0/24)
// and VIPNet6 (fd00:99::/64) as virtual addresses. Forwarding is on in the LB
// namespace only. IPv6 duplicate address detection is off everywhere, so IPv6
// addresses work at once.
package testutil

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/nsenter"
)

// PrivilegedEnv is the environment variable that makes privileged tests
// mandatory: with it set to 1, RequireRoot fails instead of skipping.
const PrivilegedEnv = "XLB_PRIVILEGED_TESTS"

// RequireRoot skips the test when not running as root, or fails it when
// XLB_PRIVILEGED_TESTS=1 says privileged tests must run.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(PrivilegedEnv) == "1" {
		tb.Fatalf("test needs root and %s=1 says privileged tests must run", PrivilegedEnv)
	}
	tb.Skip("test needs root (set " + PrivilegedEnv + "=1 to make this a failure)")
}

var nsCounter atomic.Uint64

// uniqueName returns a namespace name unique across the test processes
// running at the same time (the pid) and within this one (a counter).
func uniqueName(role string) string {
	return fmt.Sprintf("xlbt-%d-%d-%s", os.Getpid(), nsCounter.Add(1), role)
}

// NewNetNS creates a uniquely named network namespace with its loopback up
// and IPv6 DAD off, and removes it in tb.Cleanup. The handle is an open fd
// of the namespace; it is closed in tb.Cleanup too.
func NewNetNS(tb testing.TB) (name string, handle netns.NsHandle) {
	tb.Helper()
	name, handle, err := newNetNS("ns")
	if err != nil {
		tb.Fatalf("create network namespace: %v", err)
	}
	tb.Cleanup(func() { deleteNetNS(tb, name, handle) })
	return name, handle
}

func newNetNS(role string) (string, netns.NsHandle, error) {
	reapOnce.Do(reapStale)
	if err := netnsDirOnce(); err != nil {
		return "", netns.None(), err
	}
	name := uniqueName(role)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return "", netns.None(), fmt.Errorf("get current namespace: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if err != nil {
		// NewNamed may have switched the thread before failing.
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		}
		return "", netns.None(), fmt.Errorf("create namespace %s: %w", name, err)
	}
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: Go ends it with this goroutine, so no
		// other goroutine ever runs in the wrong namespace.
		return "", netns.None(), fmt.Errorf("restore namespace: %w", err)
	}
	runtime.UnlockOSThread()

	err = Do(h, func() error {
		for _, p := range []string{
			"/proc/sys/net/ipv6/conf/all/accept_dad",
			"/proc/sys/net/ipv6/conf/default/accept_dad",
		} {
			if err := os.WriteFile(p, []byte("0"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = withHandle(h, func(nh *netlink.Handle) error {
			lo, err := nh.LinkByName("lo")
			if err != nil {
				return err
			}
			return nh.LinkSetUp(lo)
		})
	}
	if err != nil {
		h.Close()
		_ = netns.DeleteNamed(name)
		return "", netns.None(), fmt.Errorf("set up namespace %s: %w", name, err)
	}
	return name, h, nil
}

var reapOnce sync.Once

// netnsDirOnce makes /run/netns a shared mount point of its own, once per
// process, before the process names a namespace there, as ip(8) does
// before its first. Without it, the first `ip netns add` on the machine
// (a test's, or another package's test process running at the same time)
// bind-mounts /run/netns onto itself recursively, copying the namespaces
// other processes had named there: each then has a second, hidden mount,
// and its removal fails with EBUSY (a CI run on a fresh machine:
// "delete network namespace ...: device or resource busy"). A lock file
// keeps two test processes from both binding it.
var netnsDirOnce = sync.OnceValue(func() error {
	const dir = "/run/netns"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile("/run/xlb-netns-dir.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close() // and with it the lock
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	// Making it shared works only on a mount point (ip(8)'s test too).
	err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		if err = unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount point: %w", dir, err)
	}
	return nil
})

// reapStale removes the namespaces a test process that is gone left
// behind (killed by a timeout or SIGKILL, its cleanups never ran): names
// uniqueName made for a pid that no longer runs. A pid the system has
// since reused keeps its namespaces until that process ends; a namespace
// still held by a process (a daemon a test started) lives on, unnamed,
// until it ends.
func reapStale() {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		var pid, n int
		var role string
		if _, err := fmt.Sscanf(e.Name(), "xlbt-%d-%d-%s", &pid, &n, &role); err != nil || pid == os.Getpid() || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = netns.DeleteNamed(e.Name())
		}
	}
}

func deleteNetNS(tb testing.TB, name string, h netns.NsHandle) {
	h.Close()
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		tb.Errorf("delete network namespace %s: %v", name, err)
	}
}

// Do runs fn inside the namespace ns (nsenter.Run). Sockets created by fn
// stay in ns for their whole life. fn must not start goroutines that
// expect to run in ns.
func Do(ns netns.NsHandle, fn func() error) error { return nsenter.Run(ns, fn) }

// withHandle runs fn with a netlink handle bound to ns.
func withHandle(ns netns.NsHandle, fn func(*netlink.Handle) error) error {
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", ns, err)
	}
	defer nh.Close()
	return fn(nh)
}

// WriteSysctl writes value to the sysctl at path (e.g.
// "net/ipv4/ip_forward") inside ns. /proc/sys/net is per namespace, so this
// reads the right namespace only because the file is opened from a thread
// inside it.
func WriteSysctl(ns netns.NsHandle, path, value string) error {
	return Do(ns, func() error {
		return os.WriteFile("/proc/sys/"+path, []byte(value), 0o644)
	})
}
