package e2e

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// haNode is an xlb daemon in one LB namespace of an HA topology, with a
// BGP speaker peering with the router.
type haNode struct {
	t       *testing.T
	lb      *testutil.LBNode
	bin     string
	state   string
	logFile string
	bgpConf string
	args    []string
	noBGP   bool // no --bgp-config (the VRRP baseline)
	daemon  *exec.Cmd
	waited  chan struct{}
}

// haKey is the HA nodes' API key: their APIs listen beyond loopback (xlb
// diff reads the other node's), where the daemon refuses a short key.
const haKey = "ha-test-key-0123456789abcdef"

const haBGPConfig = `router-id: %s
as: %d
hold-time: 3s
drain-wait: 1500ms
%speers:
  - {address: %s, as: %d}
announce: {communities: ["65001:100"]}
farms:
  chk: {withdraw-when-down: true, med: 5}
`

func newHANode(t *testing.T, topo *testutil.HATopology, lb *testutil.LBNode, args ...string) *haNode {
	return newHANodeBin(t, topo, lb, xlbBinary(t), args...)
}

// newHANodeBin is newHANode with another daemon binary (xlb-kube-daemon).
func newHANodeBin(t *testing.T, topo *testutil.HATopology, lb *testutil.LBNode, bin string, args ...string) *haNode {
	return newHANodeWith(t, topo, lb, bin, false, args...)
}

func newHANodeWith(t *testing.T, topo *testutil.HATopology, lb *testutil.LBNode, bin string, noBGP bool, args ...string) *haNode {
	dir := t.TempDir()
	n := &haNode{t: t, lb: lb, bin: bin, noBGP: noBGP, state: filepath.Join(dir, "state"),
		logFile: filepath.Join(dir, "daemon.log"), bgpConf: filepath.Join(dir, "bgp.yaml"), args: args}
	nh6 := ""
	if lb.IPv6.IsValid() {
		nh6 = "next-hop-ipv6: " + lb.IPv6.String() + "\n"
	}
	conf := fmt.Sprintf(haBGPConfig, lb.IPv4, testutil.LBAS, nh6, topo.RouterLB4, testutil.RouterAS)
	if err := os.WriteFile(n.bgpConf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.kill()
		if t.Failed() {
			log, _ := os.ReadFile(n.logFile)
			t.Logf("%s daemon log:\n%s", lb.Name, log)
		}
	})
	n.start()
	return n
}

func (n *haNode) start() {
	n.t.Helper()
	logf, err := os.OpenFile(n.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	defer logf.Close()
	argv := []string{"netns", "exec", n.lb.Name, n.bin, "daemon", "--listen", "0.0.0.0:5555", "--state-dir", n.state}
	if !n.noBGP {
		argv = append(argv, "--bgp-config", n.bgpConf)
	}
	cmd := exec.Command("ip", append(argv, n.args...)...)
	cmd.Env = append(os.Environ(), "XLB_KEY="+haKey)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.daemon, n.waited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(n.waited) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := n.cli("farm", "list"); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.t.Fatalf("%s: daemon did not answer within 10s", n.lb.Name)
}

func (n *haNode) kill() {
	if n.daemon == nil {
		return
	}
	n.daemon.Process.Signal(syscall.SIGKILL)
	<-n.waited
	n.daemon = nil
}

func (n *haNode) cli(args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.lb.Name, n.bin}, args...)...)
	cmd.Env = append(os.Environ(), "XLB_KEY="+haKey, "XLB_API=http://127.0.0.1:5555")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: xlb %s: %v: %s", n.lb.Name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func (n *haNode) mustCLI(args ...string) string {
	n.t.Helper()
	out, err := n.cli(args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// TestBGPECMP: two xlb nodes announce the same VIPs to BIRD, which spreads
// flows over both with ECMP; the same state goes to both with xlb restore
// and xlb diff checks it; a VIP whose farm asks is withdrawn while no
// backend serves; kill -9 makes the router withdraw the node at once (its
// sessions close), a restart re-adds it; a graceful stop withdraws before
// it closes the session; a router restart leaves the data plane alone.
func TestBGPECMP(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewHATopology(t, testutil.HAOptions{LBs: 2, Backends: 2, IPv6: true})
	bird := topo.StartBIRD(t, testutil.BIRDOptions{Peers: 2})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bird protocols:\n%s\nroutes:\n%s", bird.Show("protocols"), bird.Show("route", "all"))
		}
	})
	for i, b := range topo.Backends {
		testutil.StartTCPServer(t, b.NS, netip.MustParseAddrPort("[::]:8080"), fmt.Sprintf("backend-%d", i+1))
	}
	nodes := []*haNode{newHANode(t, topo, topo.LBs[0]), newHANode(t, topo, topo.LBs[1])}
	vip4, vip6, vipChk := testutil.VIP4(1), testutil.VIP6(1), testutil.VIP4(2)

	// Sessions come up; nothing is announced without farms.
	for _, n := range nodes {
		waitFor(t, n.lb.Name+" BGP session established", 15*time.Second, func() bool {
			out, err := n.cli("bgp")
			return err == nil && strings.Contains(out, "established")
		})
	}
	if nhs, _ := topo.RouteNextHops(vip4); len(nhs) != 0 {
		t.Fatalf("router has a route to %s before any farm: %v", vip4, nhs)
	}

	// The state is made on node 0 and restored on node 1, as an
	// operator's tooling would; xlb diff says they are the same.
	n0 := nodes[0]
	n0.mustCLI("farm", "add", "web", "--vip", vip4.String(), "--ports", "80", "--proto", "tcp", "--mode", "snat", "--sched", "rr")
	n0.mustCLI("farm", "add", "web6", "--family", "ipv6", "--vip", vip6.String(), "--ports", "80", "--proto", "tcp", "--mode", "snat", "--sched", "rr")
	for i, b := range topo.Backends {
		n0.mustCLI("backend", "add", "web", fmt.Sprintf("be%d", i+1), "--ip", b.IPv4.String(), "--port", "8080")
		n0.mustCLI("backend", "add", "web6", fmt.Sprintf("be%d", i+1), "--ip", b.IPv6.String(), "--port", "8080")
	}
	// chk's backend port has no server: its check fails, so its VIP
	// (withdraw-when-down) is never announced until a server appears.
	n0.mustCLI("farm", "add", "chk", "--vip", vipChk.String(), "--ports", "80", "--proto", "tcp", "--mode", "snat", "--sched", "rr")
	n0.mustCLI("backend", "add", "chk", "be1", "--ip", topo.Backends[0].IPv4.String(), "--port", "9090")
	n0.mustCLI("farm", "set", "chk", "--check", "tcp", "--inter", "200ms", "--timeout", "100ms", "--fall", "1", "--rise", "1")
	saved := filepath.Join(t.TempDir(), "state.json")
	n0.mustCLI("save", "-f", saved)
	nodes[1].mustCLI("restore", "-f", saved)
	if out := n0.mustCLI("diff", "http://"+nodes[1].lb.IPv4.String()+":5555"); !strings.Contains(out, "same state") {
		t.Fatalf("diff of equal states: %s", out)
	}

	// ECMP: both nodes' next hops in the router's route, both carry flows.
	topo.WaitNextHops(t, vip4, 2, 10*time.Second)
	topo.WaitNextHops(t, vip6, 2, 10*time.Second)
	if r := bird.Show("route", "all", vip4.String()+"/32"); !strings.Contains(r, "(65001,100)") {
		t.Fatalf("route without the community 65001:100:\n%s", r)
	}
	if nhs, _ := topo.RouteNextHops(vipChk); len(nhs) != 0 {
		t.Fatalf("chk (no backend serving) announced: %v", nhs)
	}
	bgpOut := n0.mustCLI("bgp")
	for _, w := range []string{"10.99.0.1/32", "fd00:99::1/128", "65001:100", "established"} {
		if !strings.Contains(bgpOut, w) {
			t.Fatalf("xlb bgp misses %q:\n%s", w, bgpOut)
		}
	}
	t.Logf("xlb bgp:\n%s", bgpOut)
	for _, vip := range []netip.Addr{vip4, vip6} {
		via := lbsUsed(t, topo, vip, 40)
		if len(via) != 2 {
			t.Fatalf("%s: 40 connections went through %v, want both LBs", vip, via)
		}
	}

	// withdraw-when-down: a server on chk's backend port brings its VIP
	// in (MED 5); stopping it takes the VIP out again.
	stopChk := startServer(t, topo.Backends[0], 9090)
	topo.WaitNextHops(t, vipChk, 2, 10*time.Second)
	stopChk()
	topo.WaitNextHops(t, vipChk, 0, 10*time.Second)

	// xlb diff finds a change made on one node only.
	n0.mustCLI("backend", "set", "web", "be2", "--weight", "3")
	out, err := n0.cli("diff", "http://"+nodes[1].lb.IPv4.String()+":5555")
	if err == nil || !strings.Contains(out, `! farm "web" backend "be2": weight: "3" here, "1" there`) {
		t.Fatalf("diff after a change on one node: err %v, out:\n%s", err, out)
	}
	n0.mustCLI("backend", "set", "web", "be2", "--weight", "1")

	// kill -9: the kernel closes the dead daemon's session, the router
	// withdraws the node at once; a restart re-adds it.
	n0.kill()
	d := topo.WaitNextHops(t, vip4, 1, 10*time.Second)
	t.Logf("kill -9 of lb0: router withdrew it after %v", d)
	if via := lbsUsed(t, topo, vip4, 20); len(via) != 1 || via[nodes[1].lb.Back4] == 0 {
		t.Fatalf("after lb0 died: connections through %v, want lb1 only", via)
	}
	n0.start()
	d = topo.WaitNextHops(t, vip4, 2, 15*time.Second)
	t.Logf("lb0 restarted: router re-added it after %v", d)

	// A router restart (sessions flap) touches no data plane: the
	// daemons run on, and routes come back.
	pids := []int{nodes[0].daemon.Process.Pid, nodes[1].daemon.Process.Pid}
	bird.Restart(t)
	topo.WaitNextHops(t, vip4, 2, 15*time.Second)
	for i, n := range nodes {
		if n.daemon.Process.Pid != pids[i] {
			t.Fatalf("%s daemon restarted", n.lb.Name)
		}
		select {
		case <-n.waited:
			t.Fatalf("%s daemon exited on a BGP flap", n.lb.Name)
		default:
		}
	}

	// Graceful stop: the route goes while the session is still up (drain).
	n1 := nodes[1]
	n1.daemon.Process.Signal(syscall.SIGTERM)
	topo.WaitNextHops(t, vip4, 1, 5*time.Second)
	if p := bird.Show("protocols", "lb1"); !strings.Contains(p, "Established") {
		t.Fatalf("route withdrawn but the session is gone already (no drain):\n%s", p)
	}
	select {
	case <-n1.waited:
	case <-time.After(10 * time.Second):
		t.Fatal("lb1 daemon did not stop within 10s of SIGTERM")
	}
	n1.daemon = nil
	waitFor(t, "lb1's session down after the drain", 5*time.Second, func() bool {
		return !strings.Contains(bird.Show("protocols", "lb1"), "Established")
	})
}

// lbsUsed opens n connections to vip:80 from the client and counts them
// by the LB that carried them (in snat mode the backend sees the LB's
// backend-side address).
func lbsUsed(t *testing.T, topo *testutil.HATopology, vip netip.Addr, n int) map[netip.Addr]int {
	t.Helper()
	via := map[netip.Addr]int{}
	for range n {
		reply, err := testutil.AskTCP(topo.Client.NS, netip.AddrPortFrom(vip, 80))
		if err != nil {
			t.Fatalf("connect to %s: %v (so far %v)", vip, err, via)
		}
		_, from, err := testutil.ParseReply(reply)
		if err != nil {
			t.Fatal(err)
		}
		via[from.Addr().Unmap()]++
	}
	return via
}

// startServer runs a TCP listener (that accepts and closes) on port of
// host and returns what stops it.
func startServer(t *testing.T, h testutil.Host, port uint16) func() {
	t.Helper()
	var ln net.Listener
	err := testutil.Do(h.NS, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(h.IPv4, port).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return func() { ln.Close() }
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
