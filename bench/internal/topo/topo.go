// Package topo builds the benchmarks' topology of network namespaces, the
// layout of internal/testutil's NewTopology, for programs rather than tests:
//
//	client ns 10.100.0.2 -> lb ns 10.100.0.1 | br0 10.200.0.1 -> backends 10.200.0.11-13
//
// with an HTTP server (xlb-echo) in every backend. Namespaces are named
// <prefix>-<n>-<role>; Close kills what runs in them and deletes them.
package topo

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

// Addresses of the topology.
const (
	ClientIP = "10.100.0.2"
	LBClient = "10.100.0.1" // the lb's address towards the client
	LBBack   = "10.200.0.1" // the lb's address towards the backends
	VIP      = "10.99.0.1"  // held by no interface; the client routes it to the lb
)

// Backends are the backends' first addresses; backend i is namespace
// "be<i+1>".
var Backends = []string{"10.200.0.11", "10.200.0.12", "10.200.0.13"}

// Options of New.
type Options struct {
	Prefix string // namespace name prefix, e.g. xlbb-<pid>
	Echo   string // xlb-echo binary, absolute path
	// ExtraAddrs adds that many more backend addresses, 10.200.0.100 and
	// up, spread round robin over the 3 backend namespaces (ExtraAddr(k));
	// the servers then listen on every address.
	ExtraAddrs int
}

// ExtraAddr is the k-th extra backend address (see Options.ExtraAddrs).
func ExtraAddr(k int) string { return fmt.Sprintf("10.200.0.%d", 100+k) }

// Topology is one client -> lb -> 3 backends set of namespaces.
type Topology struct {
	prefix string
	ns     []string    // created namespaces, deleted by close
	procs  []*exec.Cmd // background processes, killed by close
	// Servers are the backends' xlb-echo processes, backend i at [i]
	// (`ip netns exec` execs it: the pid is the server's).
	Servers []*exec.Cmd
}

var topoCounter atomic.Int64

// New builds a topology and starts the backends' servers.
func New(ctx context.Context, o Options) (t *Topology, err error) {
	if o.ExtraAddrs > 100 {
		return nil, fmt.Errorf("at most 100 extra addresses")
	}
	t = &Topology{prefix: fmt.Sprintf("%s-%d", o.Prefix, topoCounter.Add(1))}
	defer func() {
		if err != nil {
			t.Close()
			t = nil
		}
	}()
	steps := [][]string{}
	add := func(args ...string) { steps = append(steps, args) }
	for _, role := range []string{"client", "lb", "be1", "be2", "be3"} {
		if err := exec.CommandContext(ctx, "ip", "netns", "add", t.Name(role)).Run(); err != nil {
			return nil, fmt.Errorf("create namespace %s: %w", t.Name(role), err)
		}
		t.ns = append(t.ns, t.Name(role))
		add("-n", t.Name(role), "link", "set", "lo", "up")
	}
	c, lb := t.Name("client"), t.Name("lb")
	add("link", "add", "eth0", "netns", c, "type", "veth", "peer", "name", "eth0", "netns", lb)
	add("-n", c, "addr", "add", ClientIP+"/24", "dev", "eth0")
	add("-n", c, "link", "set", "eth0", "up")
	add("-n", c, "route", "add", "default", "via", LBClient)
	add("-n", lb, "addr", "add", LBClient+"/24", "dev", "eth0")
	add("-n", lb, "link", "set", "eth0", "up")
	add("-n", lb, "link", "add", "br0", "type", "bridge")
	add("-n", lb, "addr", "add", LBBack+"/24", "dev", "br0")
	add("-n", lb, "link", "set", "br0", "up")
	for i, ip := range Backends {
		be := t.Name(fmt.Sprintf("be%d", i+1))
		peer := fmt.Sprintf("veth%d", i+1)
		add("link", "add", "eth0", "netns", be, "type", "veth", "peer", "name", peer, "netns", lb)
		add("-n", lb, "link", "set", peer, "master", "br0", "up")
		add("-n", be, "addr", "add", ip+"/24", "dev", "eth0")
		add("-n", be, "link", "set", "eth0", "up")
		add("-n", be, "route", "add", "default", "via", LBBack)
	}
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, "ip", s...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %w: %s", strings.Join(s, " "), err, out)
		}
	}
	for k := range o.ExtraAddrs {
		be := t.Name(fmt.Sprintf("be%d", k%len(Backends)+1))
		if out, err := exec.CommandContext(ctx, "ip", "-n", be, "addr", "add", ExtraAddr(k)+"/24", "dev", "eth0").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("add %s in %s: %w: %s", ExtraAddr(k), be, err, out)
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
	for i, ip := range Backends {
		name := fmt.Sprintf("backend-%d", i+1)
		listen := ip + ":8080"
		if o.ExtraAddrs > 0 {
			listen = ":8080"
		}
		srv, err := t.Start(fmt.Sprintf("be%d", i+1), nil, o.Echo, "-name", name, "-listen", listen)
		if err != nil {
			return nil, err
		}
		t.Servers = append(t.Servers, srv)
	}
	// Wait until every backend listens (curl from the lb namespace).
	for _, ip := range Backends {
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

// Name is the namespace name of role (client, lb, be1, ...).
func (t *Topology) Name(role string) string { return t.prefix + "-" + role }

// Start runs a background process in namespace role, in a process group of
// its own; Close kills it.
func (t *Topology) Start(role string, env []string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", t.Name(role)}, args...)...)
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

// RunInput runs a command in namespace role with stdin from in.
func (t *Topology) RunInput(ctx context.Context, role, in string, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.Name(role)}, args...)...)
	cmd.Stdin = strings.NewReader(in)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Run runs a command in namespace role and returns its error with output.
func (t *Topology) Run(ctx context.Context, role string, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.Name(role)}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Output runs a command in namespace role and returns its stdout.
func (t *Topology) Output(ctx context.Context, role string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.Name(role)}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Close kills the processes it started, then anything else left in its
// namespaces, and deletes the namespaces (which removes their links, rules,
// conntrack entries and attached programs with them).
func (t *Topology) Close() {
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
			fmt.Fprintf(os.Stderr, "topo: delete namespace %s: %v: %s\n", ns, err, out)
		}
	}
	t.ns = nil
}

func parsePid(s string) (int, error) {
	var n int
	_, err := fmt.Sscan(s, &n)
	return n, err
}
