package nft

import (
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

func TestSmoke(t *testing.T) {
	e := newEnv(t, 3, true)
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	vip := testutil.VIP4(1)
	e.put(t, prev, e.farm("web", vip, 80, model.ProtoTCP, 8080))
	t.Log(e.nft(t, "list", "table", "inet", "xlb"))
	t.Log(testutil.RunErr(e.LB.Name, "nft", "list", "sets"))
	t.Log(testutil.RunErr(e.LB.Name, "nft", "list", "chain", "inet", "xlb", chainName("web")))
	for range 6 {
		name, from := e.askTCP(t, netip.AddrPortFrom(vip, 80))
		t.Log(name, from)
	}
}
