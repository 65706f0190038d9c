package nft

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestFurtherAddresses: a farm with nftlb's further addresses serves each
// of them through its one chain, as nftlb does: a tcp address of its own, a
// second tcp address on another port and a udp one; round robin is the
// farm's, whatever address a client used. Removing an address stops it
// being served; the plane refuses what it cannot serve.
func TestFurtherAddresses(t *testing.T) {
	e := newEnv(t, 2, false)
	t.Parallel()
	e.startServers(t, 8080)
	own, second, third := testutil.VIP4(1), testutil.VIP4(2), testutil.VIP4(3)
	prev := map[string]*model.Farm{}
	f := e.farm("multi", own, 80, model.ProtoTCP, 8080)
	f.Addresses = []model.Address{
		{Name: "second", Family: model.FamilyIPv4, Addr: second, Ports: []model.PortRange{{First: 443, Last: 443}}, Protocol: model.ProtoTCP},
		{Name: "third", Family: model.FamilyIPv4, Addr: third, Ports: []model.PortRange{{First: 53, Last: 53}}, Protocol: model.ProtoUDP},
	}
	e.put(t, prev, f)
	var seq []string
	for range 2 {
		n, _ := e.askTCP(t, netip.AddrPortFrom(own, 80))
		seq = append(seq, n)
		n, _ = e.askTCP(t, netip.AddrPortFrom(second, 443))
		seq = append(seq, n)
		n, _ = e.askUDP(t, netip.AddrPortFrom(third, 53))
		seq = append(seq, n)
	}
	// One rr counter for the farm: b0, b1, b0, ... across the addresses.
	if got := strings.Join(seq, " "); got != "b0 b1 b0 b1 b0 b1" {
		t.Errorf("answers over the three addresses: %s, want b0 b1 b0 b1 b0 b1 (the farm's one round robin)", got)
	}
	if out := e.nft(t, "list", "ruleset"); strings.Count(out, "goto "+chainName("multi")) < 3 {
		t.Errorf("every address should go to the farm's chain:\n%s", out)
	}

	g := f.Clone()
	g.Addresses = g.Addresses[1:]
	e.put(t, prev, g)
	if c, err := testutil.DialTCP(e.Client.NS, netip.AddrPortFrom(second, 443), 700*time.Millisecond); err == nil {
		c.Close()
		t.Errorf("a removed address is still served")
	}
	if n, _ := e.askUDP(t, netip.AddrPortFrom(third, 53)); n != "b0" && n != "b1" {
		t.Errorf("the remaining further address answered by %q", n)
	}

	for _, c := range []struct {
		change func(*model.Farm)
		want   string
	}{
		{func(f *model.Farm) { f.Mode = model.ModeDSR }, "modes snat, dnat and local"},
		{func(f *model.Farm) { f.Addresses[0].Addr = netip.MustParseAddr("fd00::3") }, "farm's family"},
		{func(f *model.Farm) { f.Helper = model.HelperFTP }, "its helper ftp"},
	} {
		h := g.Clone()
		c.change(&h)
		if err := e.p.Check(&h); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("check: %v, want an error saying %q", err, c.want)
		}
	}
	e.del(t, prev, "multi")
}
