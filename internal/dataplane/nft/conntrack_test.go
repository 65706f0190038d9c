package nft

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/testutil"
)

func TestConntrackFor(t *testing.T) {
	for _, c := range []struct{ n, max, buckets int }{
		{1, 1, 512}, {512, 512, 512}, {1000, 1000, 1024}, {131072, 131072, 131072}, {100000, 100000, 100352},
	} {
		if got := ConntrackFor(c.n); got.Max != c.max || got.Buckets != c.buckets {
			t.Errorf("ConntrackFor(%d) = %+v, want max %d buckets %d", c.n, got, c.max, c.buckets)
		}
	}
}

// TestConntrackRefusedOutsideInitNS: in a network namespace of its own
// (never the host's: this test must not write host sysctls, and the
// kernel makes both read-only there anyway) setting other values is
// refused with an error naming the sysctl, the value and why, and nothing
// changes; asking for the values in force is fine.
func TestConntrackRefusedOutsideInitNS(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	name, ns := testutil.NewNetNS(t)
	var host, mine unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(ns), &mine); err != nil {
		t.Fatal(err)
	}
	if host.Ino == mine.Ino {
		t.Fatal("the test namespace is the host's: refusing to go on")
	}
	newPlane(t, ns) // NAT chains: nf_conntrack is loaded
	read := func(s string) int {
		out := testutil.Run(t, name, "cat", "/proc/sys/"+s)
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("%s: %q", s, out)
		}
		return n
	}
	max0, buckets0 := read(sysctlCtMax), read(sysctlCtBuckets)
	want := ConntrackFor(max0 + 1000)
	err := SetConntrack(ns, want)
	var se *SysctlError
	if !errors.As(err, &se) || !errors.Is(err, os.ErrPermission) {
		t.Fatalf("SetConntrack in a namespace = %v, want a permission SysctlError", err)
	}
	for _, w := range []string{"--conn-table-size", "net.netfilter.nf_conntrack_max", strconv.Itoa(want.Max), "read-only in this network namespace", "initial (host) network namespace"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if m, b := read(sysctlCtMax), read(sysctlCtBuckets); m != max0 || b != buckets0 {
		t.Errorf("refused: max %d -> %d, buckets %d -> %d", max0, m, buckets0, b)
	}
	// nf_conntrack_buckets is global too.
	err = SetConntrack(ns, ConntrackLimits{Max: max0, Buckets: buckets0 + bucketRound})
	if !errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), "net.netfilter.nf_conntrack_buckets") {
		t.Errorf("buckets only: %v, want a permission error naming net.netfilter.nf_conntrack_buckets", err)
	}
	if err := SetConntrack(ns, ConntrackLimits{Max: max0, Buckets: buckets0}); err != nil {
		t.Errorf("the values in force: %v", err)
	}
}
