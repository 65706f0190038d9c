package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
)

// perfShares classifies the samples of a `perf record -g -p <daemon>`
// profile by whose work they are, from each sample's call chain:
//
//	user      the daemon's own code (Go: the monitor, the runtime)
//	backends  kernel work of the backends' namespaces, run in the daemon's
//	          context because a veth hands a packet to its peer on the
//	          sender's CPU: a backend receiving a SYN (and sending its
//	          SYN-ACK) or a RST, a connection's other segments; it exists
//	          only because the backends share this machine. A packet taken
//	          off the backlog and not received through the LB's bridge
//	          (br_handle_frame) is a backend's: every backend namespace's
//	          eth0 is a plain veth, the LB reaches them through br0.
//	bridge    the LB's bridge (br0, with br_netfilter and the conntrack it
//	          runs) forwarding the SYNs out and the answers in: a property
//	          of this test topology, not there on a physical interface
//	lbRecv    the rest of the LB's kernel receiving the backends' answers
//	          (the half-open receive program at br0's tcx ingress, with its
//	          helpers; on the raw socket's engine IP and TCP: the RST
//	          answering a half-open check's SYN-ACK, the raw copy)
//	lbKernel  the rest of the kernel's work for the daemon: system calls
//	          (sending the SYNs, connect, close), scheduling, timers
//
// It returns each class's share of the samples and their number.
func perfShares(file string) (map[string]float64, int, error) {
	cmd := exec.Command("perf", "script", "-i", file, "-F", "ip,sym,dso")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("perf script: %w", err)
	}
	counts := map[string]int{}
	total := 0
	var frames []string
	flush := func() {
		if len(frames) == 0 {
			return
		}
		total++
		counts[perfClass(frames)]++
		frames = frames[:0]
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			flush()
			continue
		}
		frames = append(frames, line)
	}
	flush()
	if err := cmd.Wait(); err != nil {
		return nil, 0, fmt.Errorf("perf script: %w", err)
	}
	shares := map[string]float64{}
	for k, n := range counts {
		shares[k] = float64(n) / float64(max(total, 1))
	}
	return shares, total, nil
}

// perfClass is the class of one sample by its frames, innermost first.
func perfClass(frames []string) string {
	sym := func(f string) string {
		// "ffffffff81e68983 process_backlog ([kernel.kallsyms])"
		if fs := strings.Fields(f); len(fs) >= 2 {
			return fs[1]
		}
		return ""
	}
	// A BPF program's frames are the kernel's (their dso is the program).
	if !strings.Contains(frames[0], "[kernel.kallsyms]") && !strings.HasPrefix(sym(frames[0]), "bpf_prog_") {
		return "user"
	}
	backlog, bridge, tcx, ip, brfn, send := false, false, false, false, false, false
	for _, f := range frames {
		switch s := sym(f); {
		case s == "process_backlog":
			backlog = true
		case s == "br_handle_frame":
			bridge = true
		case strings.HasPrefix(s, "bpf_prog_") || s == "tcx_run" || strings.HasPrefix(s, "sch_handle_ingress"):
			tcx = true
		case s == "ip_rcv" || s == "ip_rcv_finish" || s == "ip_local_deliver" || s == "ip_list_rcv":
			ip = true
		case strings.HasPrefix(s, "br_"):
			brfn = true
		case s == "__sys_sendmmsg" || s == "__sys_sendto" || s == "__sys_sendmsg":
			send = true
		}
	}
	switch {
	case backlog && bridge && (tcx || ip):
		return "lbRecv"
	case backlog && bridge:
		// Through the bridge, not yet in the receive program or the
		// LB's IP stack: its forwarding, br_netfilter and the
		// conntrack it runs.
		return "bridge"
	case backlog:
		return "backends"
	case send && brfn:
		return "bridge"
	}
	return "lbKernel"
}
