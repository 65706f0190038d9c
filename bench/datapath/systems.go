package main

import (
	"context"
	"fmt"
	"github.com/xlb-lb/xlb/bench/internal/topo"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// system is one way of reaching the backends: set up in a fresh topology's
// lb namespace, torn down before the topology is deleted.
type system struct {
	name, desc string
	o          options
	proc       int    // pid of the balancer's process, for its CPU time (0: none)
	tmp        string // state directory or config file directory
}

func newSystem(name string, o options) *system {
	desc := map[string]string{
		"direct":          "no balancer: client to backend 10.200.0.11:8080 only (one backend serves all, the others idle), routed through the lb namespace",
		"xlb-nft":         "xlb daemon, nft data plane, farm rr over 3 backends, mode snat (driven with the xlb CLI)",
		"xlb-nft-dnat":    "xlb daemon, nft data plane, farm rr over 3 backends, mode dnat (the same NAT work as the nft and iptables baselines)",
		"xlb-nft-dnat-1t": "xlb-nft-dnat with --nft-tables 1: a new connection passes one table's NAT chains instead of the default 32 tables' (the price of sharding)",
		"xlb-ebpf":        "xlb daemon, eBPF data plane (tcx ingress on every lb interface; pins on a bpffs private to the daemon, gone with it), farm rr over 3 backends, mode snat",
		"nft":             "plain nftables: one prerouting rule, dnat to numgen inc mod 3 map",
		"iptables":        "iptables DNAT, -m statistic --mode nth (" + o.iptables + ")",
		"haproxy":         "HAProxy (Debian package) mode tcp, balance roundrobin, default threads",
	}[name]
	return &system{name: name, desc: desc, o: o}
}

// url is what wrk and the check request.
func (s *system) url() string {
	if s.name == "direct" {
		return "http://" + topo.Backends[0] + ":8080/"
	}
	return "http://" + topo.VIP + "/"
}

func (s *system) setup(ctx context.Context, t *topo.Topology) error {
	switch s.name {
	case "direct":
		return nil
	case "xlb-nft", "xlb-nft-dnat", "xlb-nft-dnat-1t", "xlb-ebpf":
		return s.setupXLB(ctx, t)
	case "nft":
		return s.setupNft(ctx, t)
	case "iptables":
		return s.setupIptables(ctx, t)
	case "haproxy":
		return s.setupHAProxy(ctx, t)
	}
	return fmt.Errorf("unknown system %q", s.name)
}

func (s *system) teardown(*topo.Topology) {
	// The namespaces' deletion removes rules, tables and programs; only the
	// temporary files are ours to remove.
	if s.tmp != "" {
		os.RemoveAll(s.tmp)
		s.tmp = ""
	}
	s.proc = 0
}

// setupXLB starts the real daemon in the lb namespace and creates the farm
// with the CLI, as a user would.
func (s *system) setupXLB(ctx context.Context, t *topo.Topology) error {
	var err error
	if s.tmp, err = os.MkdirTemp("", "xlb-datapath-"); err != nil {
		return err
	}
	plane, mode := "nft", "snat"
	args := []string{"daemon", "--listen", apiAddr, "--state-dir", s.tmp, "--log-level", "warn"}
	switch s.name {
	case "xlb-nft-dnat":
		mode = "dnat"
	case "xlb-nft-dnat-1t":
		mode = "dnat"
		args = append(args, "--nft-tables", "1")
	case "xlb-ebpf":
		plane = "ebpf"
	}
	env := []string{"XLB_KEY=" + apiKey, "XLB_API=http://" + apiAddr}
	cmd, err := t.Start("lb", env, append([]string{s.o.xlb}, append(args, "--dataplane", plane)...)...)
	if err != nil {
		return err
	}
	s.proc = cmd.Process.Pid
	cli := func(args ...string) error {
		c := append([]string{"env", "XLB_KEY=" + apiKey, "XLB_API=http://" + apiAddr, s.o.xlb}, args...)
		return t.Run(ctx, "lb", c...)
	}
	ready := false
	for range 100 {
		if cli("farm", "list") == nil {
			ready = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !ready {
		return fmt.Errorf("xlb daemon (--dataplane %s) did not become ready", plane)
	}
	if err := cli("farm", "add", "bench", "--vip", topo.VIP, "--ports", "80", "--proto", "tcp", "--mode", mode, "--sched", "rr"); err != nil {
		return err
	}
	for i, ip := range topo.Backends {
		if err := cli("backend", "add", "bench", fmt.Sprintf("be%d", i+1), "--ip", ip, "--port", "8080"); err != nil {
			return err
		}
	}
	if !slicesContains(s.o.loads, "udp") {
		return nil
	}
	if err := cli("farm", "add", "bench-udp", "--vip", topo.VIP, "--ports", fmt.Sprint(udpPort), "--proto", "udp", "--mode", mode, "--sched", "rr"); err != nil {
		return err
	}
	for i, ip := range topo.Backends {
		if err := cli("backend", "add", "bench-udp", fmt.Sprintf("be%d", i+1), "--ip", ip, "--port", fmt.Sprint(udpPort)); err != nil {
			return err
		}
	}
	return nil
}

// setupNft loads the simplest nftables balancer: one rule, a numgen map.
func (s *system) setupNft(ctx context.Context, t *topo.Topology) error {
	var m, mu []string
	for i, ip := range topo.Backends {
		m = append(m, fmt.Sprintf("%d : %s . 8080", i, ip))
		mu = append(mu, fmt.Sprintf("%d : %s . %d", i, ip, udpPort))
	}
	ruleset := fmt.Sprintf(`table ip bench {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %s tcp dport 80 dnat ip addr . port to numgen inc mod %d map { %s }
		ip daddr %s udp dport %d dnat ip addr . port to numgen inc mod %d map { %s }
	}
}
`, topo.VIP, len(topo.Backends), strings.Join(m, ", "), topo.VIP, udpPort, len(topo.Backends), strings.Join(mu, ", "))
	var err error
	if s.tmp, err = os.MkdirTemp("", "xlb-datapath-"); err != nil {
		return err
	}
	f := filepath.Join(s.tmp, "bench.nft")
	if err := os.WriteFile(f, []byte(ruleset), 0o644); err != nil {
		return err
	}
	return t.Run(ctx, "lb", "nft", "-f", f)
}

// setupIptables is the classic iptables balancer: rule k of n takes every
// (n-k)-th new connection, the last one takes the rest.
func (s *system) setupIptables(ctx context.Context, t *topo.Topology) error {
	n := len(topo.Backends)
	for _, svc := range []struct {
		proto       string
		port, bport int
	}{{"tcp", 80, 8080}, {"udp", udpPort, udpPort}} {
		for i, ip := range topo.Backends {
			args := []string{s.o.iptables, "-w", "-t", "nat", "-A", "PREROUTING", "-d", topo.VIP, "-p", svc.proto, "--dport", fmt.Sprint(svc.port)}
			if i < n-1 {
				args = append(args, "-m", "statistic", "--mode", "nth", "--every", fmt.Sprint(n-i), "--packet", "0")
			}
			args = append(args, "-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", ip, svc.bport))
			if err := t.Run(ctx, "lb", args...); err != nil {
				return err
			}
		}
	}
	return nil
}

// setupHAProxy runs HAProxy in the foreground, in TCP mode, on the VIP
// (added to the lb namespace's loopback: a proxy terminates connections).
func (s *system) setupHAProxy(ctx context.Context, t *topo.Topology) error {
	if err := t.Run(ctx, "lb", "ip", "addr", "add", topo.VIP+"/32", "dev", "lo"); err != nil {
		return err
	}
	var servers strings.Builder
	for i, ip := range topo.Backends {
		fmt.Fprintf(&servers, "\tserver be%d %s:8080\n", i+1, ip)
	}
	cfg := fmt.Sprintf(`global
	maxconn 4096
defaults
	mode tcp
	timeout connect 2s
	timeout client 30s
	timeout server 30s
frontend bench
	bind %s:80
	default_backend backends
backend backends
	balance roundrobin
%s`, topo.VIP, servers.String())
	var err error
	if s.tmp, err = os.MkdirTemp("", "xlb-datapath-"); err != nil {
		return err
	}
	f := filepath.Join(s.tmp, "haproxy.cfg")
	if err := os.WriteFile(f, []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := t.Run(ctx, "lb", "haproxy", "-c", "-q", "-f", f); err != nil {
		return fmt.Errorf("haproxy config: %w", err)
	}
	cmd, err := t.Start("lb", nil, "haproxy", "-db", "-q", "-f", f)
	if err != nil {
		return err
	}
	s.proc = cmd.Process.Pid
	return nil
}
