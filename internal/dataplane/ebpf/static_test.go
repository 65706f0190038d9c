package ebpf

import (
	"context"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestStaticSessions: nftlb's static sessions on this plane. A farm with
// persistence srcip and a static session pinning the client to be2: every
// connection goes to be2 (persistence alone would keep it on be0, rr's
// first); be2 down, the client is scheduled as any other; be2 up again,
// its static session wins again; the session removed, xlb_static is empty.
func TestStaticSessions(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	vip := netip.AddrPortFrom(testutil.VIP4(61), 80)
	f := farm(t, "static", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)...)
	f.Persistence, f.PersistTTL = model.KeySrcIP, 300
	f.Sessions = []model.StaticSession{{Client: topo.Client.IPv4.String(), Backend: f.Backends[2].Name}}
	apply := func(g *model.Farm) {
		t.Helper()
		if err := p.Check(g); err != nil {
			t.Fatal(err)
		}
		if err := p.Reconcile(context.Background(), []*model.Farm{g}); err != nil {
			t.Fatal(err)
		}
	}
	answers := func(step string, want string) {
		t.Helper()
		for range 4 {
			got, err := testutil.AskTCP(topo.Client.NS, vip)
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			name, _, _ := testutil.ParseReply(got)
			if want != "" && name != want || want == "" && name == "be2" {
				t.Errorf("%s: answered by %s, want %s", step, name, map[bool]string{true: want, false: "another than be2"}[want != ""])
			}
		}
	}
	apply(f)
	answers("static session to be2", "be2")
	down := f.Clone()
	down.Backends[2].State = model.StateDown
	apply(&down)
	answers("be2 down", "")
	apply(f)
	answers("be2 up again", "be2")
	none := f.Clone()
	none.Sessions = nil
	apply(&none)
	var k xlbPersistKey
	var v xlbPersistVal
	if it := p.objs.XlbStatic.Iterate(); it.Next(&k, &v) {
		t.Errorf("a static session is left after it was removed: %+v", k)
	}
}
