package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestDSRThroughDaemon: a dsr farm made with the CLI (API, engine, nft
// plane) balances real connections, the backends seeing the client; a
// backend whose MAC cannot be found is refused with the field named, and
// neither the kernel nor the saved state changes.
func TestDSRThroughDaemon(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(6), 80)
	// The VIP's traffic arrives on the LB's client side; the backends
	// hold the VIP on lo and serve it.
	if out, err := testutil.RunErr(e.topo.LB.Name, "ip", "route", "add", vip.Addr().String()+"/32", "dev", e.topo.LB.Link); err != nil {
		t.Fatal(out, err)
	}
	for i, b := range e.topo.Backends {
		if out, err := testutil.RunErr(b.Name, "ip", "addr", "add", vip.Addr().String()+"/32", "dev", "lo"); err != nil {
			t.Fatal(out, err)
		}
		testutil.StartTCPServer(t, b.NS, vip, fmt.Sprintf("backend-%d", i+1))
	}
	e.mustCLI("farm", "add", "dsr", "--vip", vip.Addr().String(), "--ports", "80", "--proto", "tcp", "--mode", "dsr",
		"--sched", "hash", "--sched-param", "srcip srcport")
	for i, b := range e.topo.Backends {
		e.mustCLI("backend", "add", "dsr", fmt.Sprintf("be%d", i+1), "--ip", b.IPv4.String())
	}
	e.requireAllBackends(vip, 15)
	reply, err := testutil.AskTCP(e.topo.Client.NS, vip)
	if err != nil {
		t.Fatal(err)
	}
	if _, from, _ := testutil.ParseReply(reply); from.Addr() != e.topo.Client.IPv4 {
		t.Errorf("backend saw %s, want the client's %s", from, e.topo.Client.IPv4)
	}

	kernel := e.nftList()
	saved := e.mustCLI("dump")
	out, err := e.cli("backend", "add", "dsr", "ghost", "--ip", "10.200.0.99")
	if err == nil {
		t.Fatalf("backend without a MAC accepted:\n%s", out)
	}
	for _, w := range []string{`backend "ghost"`, "ether-addr", "10.200.0.99", "no neighbour entry"} {
		if !strings.Contains(out, w) {
			t.Errorf("error %q does not mention %q", strings.TrimSpace(out), w)
		}
	}
	// Counters aside: a late segment of the requests above (their
	// connections closing) may still pass the farm's rule meanwhile.
	if got := e.nftList(); withoutCounters(got) != withoutCounters(kernel) {
		t.Errorf("kernel changed by the refused backend:\n--- before\n%s\n--- after\n%s", kernel, got)
	}
	if got := e.mustCLI("dump"); got != saved {
		t.Errorf("saved state changed by the refused backend")
	}
	e.requireAllBackends(vip, 9)
}
