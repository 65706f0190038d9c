// Package nsenter runs code inside a network namespace. It is the one place
// xlb switches a thread's namespace: the data planes (sysctls, probes,
// attaching programs by ifindex), the test helpers and the benchmarks all
// go through Run.
package nsenter

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Run runs fn on an OS thread of its own inside the network namespace ns
// (the caller's own namespace when ns is not open) and returns its error.
// Sockets and netlink handles fn creates stay in ns for their whole life.
// fn must not start goroutines that expect to run in ns.
//
// Why a thread of its own: a namespace belongs to a thread, and Go moves
// goroutines between threads. fn runs on a new goroutine locked to its
// thread; the thread goes back to the caller's namespace afterwards, and
// if that fails it is not unlocked, so the runtime throws it away with the
// goroutine instead of reusing it elsewhere.
func Run(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", ns, err)
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
