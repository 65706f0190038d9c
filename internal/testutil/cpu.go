package testutil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// PathCPU returns the CPU time, in ns, of the calling thread plus every
// ksoftirqd thread, from schedstat (exact, not sampled by ticks). Over veth
// a packet's whole path — the sender's syscall and every namespace's
// receive — runs on the sending thread (softirq in its context) or, when
// the backlog is deferred, in ksoftirqd; so the difference of two readings
// around a send (with the thread locked to its OS thread) is that path's
// CPU.
func PathCPU(tb testing.TB) int64 {
	tb.Helper()
	total := schedstat(tb, "/proc/thread-self/schedstat")
	dirs, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		tb.Fatal(err)
	}
	for _, comm := range dirs {
		name, err := os.ReadFile(comm)
		if err != nil || !strings.HasPrefix(string(name), "ksoftirqd/") {
			continue
		}
		total += schedstat(tb, filepath.Join(filepath.Dir(comm), "schedstat"))
	}
	return total
}

func schedstat(tb testing.TB, path string) int64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		tb.Fatalf("%s: empty", path)
	}
	v, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	return v
}
