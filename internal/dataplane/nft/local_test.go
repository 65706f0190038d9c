package nft

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestModeLocal: a farm of mode local forwards nothing: the LB's own
// socket on the VIP answers, not the backends, while the farm's limits
// (est-connlimit per client) still apply. The same farm in mode snat sends
// the connections to the backends.
func TestModeLocal(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	e.LB.AddAddr(t, netip.PrefixFrom(vip, 32))
	testutil.StartTCPServer(t, e.LB.NS, netip.AddrPortFrom(vip, 80), "lb")
	prev := map[string]*model.Farm{}
	f := e.farm("own", vip, 80, model.ProtoTCP, 8080)
	e.put(t, prev, f)
	to := netip.AddrPortFrom(vip, 80)
	if name, _ := e.askTCP(t, to); name != "b0" {
		t.Fatalf("mode snat: answered by %q, want the backend b0", name)
	}
	f.Mode = model.ModeLocal
	f.EstConnLimit = 1
	e.put(t, prev, f)
	out := e.nft(t, "list", "chain", "inet", "xlb", chainName("own"))
	if !strings.Contains(out, "ct count over 1") || !strings.Contains(out, "counter packets 0 bytes 0 accept") || strings.Contains(out, "dnat") {
		t.Errorf("local farm chain:\n%s", out)
	}
	c, err := testutil.DialTCP(e.Client.NS, to, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line, err := testutil.ReadLine(c, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if name, _, _ := testutil.ParseReply(line); name != "lb" {
		t.Fatalf("mode local: answered by %q, want the LB itself", line)
	}
	if c2, err := testutil.DialTCP(e.Client.NS, to, 700*time.Millisecond); err == nil {
		c2.Close()
		t.Errorf("mode local, est-connlimit 1: a second connection was accepted")
	}
	c.Close()
	// Log is refused: it is written where local packets never pass.
	g := f.Clone()
	g.Log = model.LogInput
	if err := e.p.Check(&g); err == nil || !strings.Contains(err.Error(), `"mode"`) {
		t.Errorf("local farm with log: %v, want a refusal", err)
	}
	e.del(t, prev, "own")
}
