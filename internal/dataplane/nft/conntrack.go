package nft

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/nsenter"
)

// The nft data plane keeps no connection table of its own: it relies on
// the kernel's conntrack, one entry per connection (both directions), and
// --conn-table-size sizes that:
//
//	net.netfilter.nf_conntrack_max      = N            (entries; new connections past it are dropped)
//	net.netfilter.nf_conntrack_buckets  = N rounded up (hash buckets; one per entry, the kernel's own
//	                                      to 512           default ratio, so chains average two tuples)
//
// Both are global: the kernel lets only the initial network namespace
// write them (nf_conntrack_max is read-only in every other namespace, and
// there it shows the global value), so a daemon in another namespace cannot
// honour the flag and refuses to start rather than ignore it.

// Conntrack sysctls.
const (
	sysctlCtMax     = "net/netfilter/nf_conntrack_max"
	sysctlCtBuckets = "net/netfilter/nf_conntrack_buckets"
	// bucketRound: the kernel allocates buckets in whole pages of 8-byte
	// heads (nf_ct_alloc_hashtable) and rounds the count up to that.
	bucketRound = 512
)

// ConntrackLimits are the kernel conntrack sizes for a connection table.
type ConntrackLimits struct {
	Max     int // net.netfilter.nf_conntrack_max
	Buckets int // net.netfilter.nf_conntrack_buckets
}

// ConntrackFor returns the limits for a table of n connections.
func ConntrackFor(n int) ConntrackLimits {
	return ConntrackLimits{Max: n, Buckets: (n + bucketRound - 1) / bucketRound * bucketRound}
}

// SysctlError says which sysctl could not be set and why.
type SysctlError struct {
	Name  string // dotted, e.g. net.netfilter.nf_conntrack_max
	Value int
	Err   error
}

func (e *SysctlError) Error() string {
	why := e.Err.Error()
	if errors.Is(e.Err, os.ErrPermission) {
		why = "it is read-only in this network namespace: the kernel lets only the initial (host) network namespace set it, for every namespace; run the daemon there, or leave --conn-table-size out and size conntrack on the host"
	}
	if errors.Is(e.Err, os.ErrNotExist) {
		why = "the sysctl does not exist (is nf_conntrack loaded?)"
	}
	return fmt.Sprintf("--conn-table-size: set %s to %d: %s", e.Name, e.Value, why)
}

func (e *SysctlError) Unwrap() error { return e.Err }

// SetConntrack sets the conntrack limits in the network namespace ns (the
// current one when ns is not open). Both sysctls are opened for writing
// before either is written, so a namespace where they are read-only is
// left as it was. A value already in place is not rewritten (writing
// nf_conntrack_buckets rehashes every entry).
func SetConntrack(ns netns.NsHandle, l ConntrackLimits) error {
	return nsenter.Run(ns, func() error { return setConntrack(l) })
}

func setConntrack(l ConntrackLimits) error {
	type sysctl struct {
		path string
		v    int
		f    *os.File
	}
	all := []*sysctl{{path: sysctlCtMax, v: l.Max}, {path: sysctlCtBuckets, v: l.Buckets}}
	defer func() {
		for _, s := range all {
			if s.f != nil {
				s.f.Close()
			}
		}
	}()
	for _, s := range all {
		cur, err := os.ReadFile("/proc/sys/" + s.path)
		if err == nil && strings.TrimSpace(string(cur)) == strconv.Itoa(s.v) {
			continue
		}
		f, err := os.OpenFile("/proc/sys/"+s.path, os.O_WRONLY, 0)
		if err != nil {
			return &SysctlError{Name: strings.ReplaceAll(s.path, "/", "."), Value: s.v, Err: err}
		}
		s.f = f
	}
	for _, s := range all {
		if s.f == nil {
			continue
		}
		if _, err := s.f.WriteString(strconv.Itoa(s.v)); err != nil {
			return &SysctlError{Name: strings.ReplaceAll(s.path, "/", "."), Value: s.v, Err: err}
		}
	}
	return nil
}
