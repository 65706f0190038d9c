package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// topology is one client -> lb -> 3 backends set of namespaces, named
// <prefix>-<n>-<role>, with an HTTP server in every backend.
type topology struct {
	prefix string
	ns     []string    // created namespaces, deleted by close
	procs  []*exec.Cmd // background processes, killed by close
}

var topoCounter atomic.Int64

func newTopology(ctx context.Context, o options) (t *topology, err error) {
	t = &topology{prefix: fmt.Sprintf("%s-%d", o.prefix, topoCounter.Add(1))}
	defer func() {
		if err != nil {
			t.close()
			t = nil
		}
	}()
	steps := [][]string{}
	add := func(args ...string) { steps = append(steps, args) }
	for _, role := range []string{"client", "lb", "be1", "be2", "be3"} {
		if err := exec.CommandContext(ctx, "ip", "netns", "add", t.name(role)).Run(); err != nil {
			return nil, fmt.Errorf("create namespace %s: %w", t.name(role), err)
		}
		t.ns = append(t.ns, t.name(role))
		add("-n", t.name(role), "link", "set", "lo", "up")
	}
	c, lb := t.name("client"), t.name("lb")
	add("link", "add", "eth0", "netns", c, "type", "veth", "peer", "name", "eth0", "netns", lb)
	add("-n", c, "addr", "add", clientIP+"/24", "dev", "eth0")
	add("-n", c, "link", "set", "eth0", "up")
	add("-n", c, "route", "add", "default", "via", lbClient)
	add("-n", lb, "addr", "add", lbClient+"/24", "dev", "eth0")
	add("-n", lb, "link", "set", "eth0", "up")
	add("-n", lb, "link", "add", "br0", "type", "bridge")
	add("-n", lb, "addr", "add", lbBack+"/24", "dev", "br0")
	add("-n", lb, "link", "set", "br0", "up")
	for i, ip := range backends {
		be := t.name(fmt.Sprintf("be%d", i+1))
		peer := fmt.Sprintf("veth%d", i+1)
		add("link", "add", "eth0", "netns", be, "type", "veth", "peer", "name", peer, "netns", lb)
		add("-n", lb, "link", "set", peer, "master", "br0", "up")
		add("-n", be, "addr", "add", ip+"/24", "dev", "eth0")
		add("-n", be, "link", "set", "eth0", "up")
		add("-n", be, "route", "add", "default", "via", lbBack)
	}
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, "ip", s...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %w: %s", strings.Join(s, " "), err, out)
		}
	}
	// Forwarding in the LB only. The client may open many short connections
	// (load "close"): a wide port range and reuse of TIME_WAIT ports keep it
	// from running out of source ports in a run.
	for ns, kv := range map[string][]string{
		lb: {"net.ipv4.ip_forward=1"},
		c:  {"net.ipv4.ip_local_port_range=1024 65000", "net.ipv4.tcp_tw_reuse=1"},
	} {
		for _, s := range kv {
			if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sysctl", "-qw", s).CombinedOutput(); err != nil {
				return nil, fmt.Errorf("sysctl %s in %s: %w: %s", s, ns, err, out)
			}
		}
	}
	if slicesContains(o.loads, "udp") {
		for i := range backends {
			be := t.name(fmt.Sprintf("be%d", i+1))
			cmd := exec.CommandContext(ctx, "ip", "netns", "exec", be, "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(sinkRules)
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("udp sink in %s: %w: %s", be, err, out)
			}
		}
	}
	for i, ip := range backends {
		name := fmt.Sprintf("backend-%d", i+1)
		if _, err := t.start(fmt.Sprintf("be%d", i+1), nil, o.echo, "-name", name, "-listen", ip+":8080"); err != nil {
			return nil, err
		}
	}
	// Wait until every backend listens (curl from the lb namespace).
	for _, ip := range backends {
		ok := false
		for range 50 {
			if exec.CommandContext(ctx, "ip", "netns", "exec", lb, "curl", "-s", "--max-time", "1", "-o", "/dev/null", "http://"+ip+":8080/").Run() == nil {
				ok = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !ok {
			return nil, fmt.Errorf("backend %s:8080 did not start", ip)
		}
	}
	return t, nil
}

func (t *topology) name(role string) string { return t.prefix + "-" + role }

// start runs a background process in namespace role.
func (t *topology) start(role string, env []string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", t.name(role)}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = nil
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", args[0], role, err)
	}
	t.procs = append(t.procs, cmd)
	return cmd, nil
}

// run runs a command in namespace role and returns its error with output.
func (t *topology) run(ctx context.Context, role string, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.name(role)}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// output runs a command in namespace role and returns its stdout.
func (t *topology) output(ctx context.Context, role string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.name(role)}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// close kills the processes it started, then anything else left in its
// namespaces, and deletes the namespaces (which removes their links, rules,
// conntrack entries and attached programs with them).
func (t *topology) close() {
	for _, p := range t.procs {
		if p.Process != nil {
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL) // its process group
			_ = p.Wait()
		}
	}
	t.procs = nil
	for _, ns := range t.ns {
		if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
			for _, pid := range strings.Fields(string(out)) {
				if n, err := parsePid(pid); err == nil {
					_ = syscall.Kill(n, syscall.SIGKILL)
				}
			}
		}
	}
	for _, ns := range t.ns {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "datapath: delete namespace %s: %v: %s\n", ns, err, out)
		}
	}
	t.ns = nil
}

func parsePid(s string) (int, error) {
	var n int
	_, err := fmt.Sscan(s, &n)
	return n, err
}
