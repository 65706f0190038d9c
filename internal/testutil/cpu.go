package testutil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// PathCPU returns the CPU time, in ns, of the calling thread plus every
// ksoftirqd thread. Over veth a packet's whole path — the sender's syscall
// and every namespace's receive — runs on the sending thread (softirq in
// its context) or, when the backlog is deferred, in ksoftirqd; so the
// difference of two readings around a send (with the goroutine locked to
// its OS thread) is that path's CPU.
//
// It reads CPU clocks (clock_gettime: the scheduler's runtime brought up
// to date at the call, exact to the ns). /proc/<pid>/schedstat would not
// do: it shows the runtime as of the thread's last tick or switch, up to
// 4 ms stale at HZ=250 (400 ns per packet of a 10,000-packet chunk) while
// the thread runs.
func PathCPU(tb testing.TB) int64 {
	tb.Helper()
	total := cpuClock(tb, unix.CLOCK_THREAD_CPUTIME_ID)
	for _, pid := range ksoftirqds(tb) {
		total += cpuClock(tb, processCPUClock(pid))
	}
	return total
}

var (
	ksoftirqdOnce sync.Once
	ksoftirqdPids []int
	ksoftirqdErr  error
)

// ksoftirqds returns the pids of the ksoftirqd threads (found once).
func ksoftirqds(tb testing.TB) []int {
	ksoftirqdOnce.Do(func() {
		dirs, err := filepath.Glob("/proc/[0-9]*/comm")
		if err != nil {
			ksoftirqdErr = err
			return
		}
		for _, comm := range dirs {
			name, err := os.ReadFile(comm)
			if err != nil || !strings.HasPrefix(string(name), "ksoftirqd/") {
				continue
			}
			pid, err := strconv.Atoi(filepath.Base(filepath.Dir(comm)))
			if err != nil {
				ksoftirqdErr = err
				return
			}
			ksoftirqdPids = append(ksoftirqdPids, pid)
		}
	})
	if ksoftirqdErr != nil {
		tb.Fatalf("find ksoftirqd threads: %v", ksoftirqdErr)
	}
	return ksoftirqdPids
}

// processCPUClock is the clock id of process pid's CPU time
// (MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of linux/posix-timers.h; a
// thread clock works only within one's own process, and a ksoftirqd
// thread is a process of its own).
func processCPUClock(pid int) int32 {
	const cpuclockSched = 2
	return int32(^pid<<3 | cpuclockSched)
}

func cpuClock(tb testing.TB, clock int32) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		tb.Fatalf("clock_gettime(%d): %v", clock, err)
	}
	return ts.Nano()
}
