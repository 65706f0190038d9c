package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestBGPFlap: a BGP session that flaps touches nothing but routes. One
// xlb node behind BIRD carries held connections; the router disables and
// re-enables the session three times, then the session dies of silence
// (BGP's packets dropped until both hold timers expire) and comes back.
// Each time the route goes and returns; the daemon is the same process,
// its kernel objects are the same objects (nft's handles and rules, not
// re-made), and every held connection still echoes afterwards.
func TestBGPFlap(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewHATopology(t, testutil.HAOptions{LBs: 1, Backends: 1})
	bird := topo.StartBIRD(t, testutil.BIRDOptions{Peers: 1})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bird protocols:\n%s", bird.Show("protocols"))
		}
	})
	b := topo.Backends[0]
	testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), "backend-1")
	n := newHANode(t, topo, topo.LBs[0])
	vip := testutil.VIP4(1)
	n.mustCLI("farm", "add", "web", "--vip", vip.String(), "--ports", "80", "--proto", "tcp", "--mode", "snat", "--sched", "maglev")
	n.mustCLI("backend", "add", "web", "be1", "--ip", b.IPv4.String(), "--port", "8080")
	topo.WaitNextHops(t, vip, 1, 15*time.Second)

	var held []net.Conn
	for range 10 {
		c, err := testutil.DialTCP(topo.Client.NS, netip.AddrPortFrom(vip, 80), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := testutil.ReadLine(c, 3*time.Second); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	echo := func(when string, timeout time.Duration) {
		t.Helper()
		for i, c := range held {
			msg := fmt.Sprintf("%s %d", when, i)
			c.SetWriteDeadline(time.Now().Add(timeout))
			if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
				t.Fatalf("%s: held connection %d: %v", when, i, err)
			}
			if line, err := testutil.ReadLine(c, timeout); err != nil || line != msg {
				t.Fatalf("%s: held connection %d: %q, %v", when, i, line, err)
			}
		}
	}
	echo("before", 3*time.Second)
	// The kernel objects, with their handles (-a; objects made again get
	// new ones) and without counters (-s).
	ruleset := func() string { return testutil.Run(t, n.lb.Name, "nft", "-a", "-s", "list", "ruleset") }
	before, pid := ruleset(), n.daemon.Process.Pid

	for i := range 3 {
		if _, err := bird.Ctl("disable", "lb0"); err != nil {
			t.Fatal(err)
		}
		topo.WaitNextHops(t, vip, 0, 10*time.Second)
		if _, err := bird.Ctl("enable", "lb0"); err != nil {
			t.Fatal(err)
		}
		d := topo.WaitNextHops(t, vip, 1, 20*time.Second)
		t.Logf("flap %d: route back %v after the session was enabled", i+1, d)
	}
	// Silence: the session dies of its hold timers on both sides.
	testutil.Run(t, n.lb.Name, "nft", "add", "table", "inet", "xlbt_bgpcut")
	testutil.Run(t, n.lb.Name, "nft", "add", "chain", "inet", "xlbt_bgpcut", "in", "{ type filter hook input priority -300; tcp sport 179 drop; tcp dport 179 drop; }")
	testutil.Run(t, n.lb.Name, "nft", "add", "chain", "inet", "xlbt_bgpcut", "out", "{ type filter hook output priority -300; tcp sport 179 drop; tcp dport 179 drop; }")
	topo.WaitNextHops(t, vip, 0, 15*time.Second)
	waitFor(t, "the node's session down", 15*time.Second, func() bool {
		out, err := n.cli("bgp")
		return err == nil && !strings.Contains(out, "established")
	})
	testutil.Run(t, n.lb.Name, "nft", "delete", "table", "inet", "xlbt_bgpcut")
	topo.WaitNextHops(t, vip, 1, 30*time.Second)

	if n.daemon.Process.Pid != pid {
		t.Fatal("the daemon was restarted")
	}
	select {
	case <-n.waited:
		t.Fatal("the daemon exited on a BGP flap")
	default:
	}
	if after := ruleset(); after != before {
		t.Fatalf("the data plane changed on BGP flaps:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	echo("after", 10*time.Second)
}
