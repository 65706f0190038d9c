package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/xlb-lb/xlb/bench/internal/topo"
)

// With -steer the CPU part measures the LB's own CPU. A veth hands a
// packet to its peer on the sending CPU, so without it the daemon's time
// holds the backends' kernel work (receiving the SYN, answering, taking
// the RST) and the bridge's forwarding of their answers, which this test
// topology adds and a physical interface would not. So: the daemon runs
// on CPU 0 only (taskset, in newEnv), and RPS on the veths that receive
// from the bridge (each backend's eth0) and from the backends (the LB
// namespace's veth1-3, the bridge's ports) queues that receive work to
// the other CPUs. The LB's own receive of the answers then runs there
// too, in its BPF programs (the tcx program taking the SYN-ACKs, and on
// the eBPF plane the data plane's program): their run time is counted
// from the kernel's BPF statistics (run_time_ns in the fdinfo of the
// daemon's program descriptors) and added to the daemon's CPU. Only
// devices inside the bench's namespaces are touched.

// steerRPS sets rps_cpus of the receiving veths to every CPU but CPU 0.
func steerRPS(ctx context.Context, t *topo.Topology) error {
	n := runtime.NumCPU()
	if n < 2 {
		return fmt.Errorf("-steer needs 2 CPUs or more, this machine has %d", n)
	}
	mask := strconv.FormatUint(((1<<n)-1)&^1, 16)
	set := func(ns, dev string) error {
		path := "/sys/class/net/" + dev + "/queues/rx-0/rps_cpus"
		// `ip netns exec` mounts the namespace's own /sys.
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sh", "-c", "echo "+mask+" > "+path).CombinedOutput()
		if err != nil {
			return fmt.Errorf("rps on %s in %s: %w: %s", dev, ns, err, out)
		}
		return nil
	}
	for i := range len(topo.Backends) {
		if err := set(t.Name(fmt.Sprintf("be%d", i+1)), "eth0"); err != nil {
			return err
		}
		if err := set(t.Name("lb"), fmt.Sprintf("veth%d", i+1)); err != nil {
			return err
		}
	}
	return nil
}

// bpfStats turns the kernel's BPF run-time statistics on and returns what
// restores the setting found.
func bpfStats(ctx context.Context) (func(), error) {
	const path = "/proc/sys/kernel/bpf_stats_enabled"
	old, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bpf statistics: %w", err)
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("bpf statistics: %w", err)
	}
	return func() { os.WriteFile(path, old, 0o644) }, nil
}

// bpfRunTime sums the run time of the BPF programs process pid holds open
// (each program once).
func bpfRunTime(pid int) time.Duration {
	if !*steer {
		return 0
	}
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	seen := map[string]bool{}
	var total time.Duration
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var id string
		var ns int64
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch k {
			case "prog_id":
				id = v
			case "run_time_ns":
				ns, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		f.Close()
		if id != "" && !seen[id] {
			seen[id] = true
			total += time.Duration(ns)
		}
	}
	return total
}
