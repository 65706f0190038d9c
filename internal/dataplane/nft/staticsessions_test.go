package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestStaticSessions: clients listed in a farm's static sessions go to
// their backend on every connection, whatever the scheduler says; one whose
// backend is down is scheduled as any other and returns once the backend
// is up; keys of one field (srcip) and of several (srcip dstport) work;
// removing the sessions removes their map.
func TestStaticSessions(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	other := netip.MustParseAddr("10.100.0.21")
	free := netip.MustParseAddr("10.100.0.22")
	for _, a := range []netip.Addr{other, free} {
		e.Client.AddAddr(t, netip.PrefixFrom(a, 24))
	}
	ask := func(from netip.Addr, port uint16) string {
		t.Helper()
		// A lost SYN on a loaded machine is not a failure: retry.
		var err error
		for range 3 {
			var got string
			if got, err = testutil.AskTCPFrom(e.Client.NS, netip.AddrPortFrom(from, 0), netip.AddrPortFrom(vip, port)); err == nil {
				name, _, _ := testutil.ParseReply(got)
				return name
			}
		}
		t.Fatalf("tcp from %s to %s:%d: %v", from, vip, port, err)
		return ""
	}
	prev := map[string]*model.Farm{}
	f := e.farm("static", vip, 80, model.ProtoTCP, 8080)
	f.Persistence, f.PersistTTL = model.KeySrcIP, 300
	f.Sessions = []model.StaticSession{{Client: e.Client.IPv4.String(), Backend: "b2"}, {Client: other.String(), Backend: "b1"}}
	g := e.farm("static2", vip, 81, model.ProtoTCP, 8080)
	g.Persistence, g.PersistTTL = model.KeySrcIP|model.KeyDstPort, 300
	g.Sessions = []model.StaticSession{{Client: e.Client.IPv4.String() + " 81", Backend: "b1"}}
	e.put(t, prev, f, g)
	out := e.nft(t, "list", "table", "inet", "xlb")
	for _, want := range []string{"10.100.0.2 : 0x", "10.100.0.21 : 0x", "10.100.0.2 . 81 : 0x"} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}
	// Listed first, as configured, without expiry.
	ss, err := e.p.Sessions(context.Background(), prev["static"])
	if err != nil || len(ss) < 2 || ss[0] != (dataplane.Session{Client: "10.100.0.2", Backend: "b2", Static: true}) ||
		ss[1] != (dataplane.Session{Client: "10.100.0.21", Backend: "b1", Static: true}) {
		t.Errorf("sessions %+v, %v: want the two static ones first", ss, err)
	}
	check := func(step string, want map[netip.Addr]string) {
		t.Helper()
		for range 4 {
			for a, b := range want {
				if got := ask(a, 80); got != b {
					t.Errorf("%s: client %s went to %s, want %s", step, a, got, b)
				}
			}
		}
	}
	// A client without a static session is scheduled (rr from b0) and
	// kept by its dynamic session.
	first := ask(free, 80)
	check("static sessions", map[netip.Addr]string{e.Client.IPv4: "b2", other: "b1", free: first})
	if got := ask(e.Client.IPv4, 81); got != "b1" {
		t.Errorf("srcip dstport key: client went to %s on port 81, want b1", got)
	}
	// b2 down: its static client is scheduled among b0 and b1.
	f.Backends[2].State = model.StateDown
	e.put(t, prev, f)
	if got := ask(e.Client.IPv4, 80); got == "b2" || got == "" {
		t.Errorf("b2 down: its static client went to %q", got)
	}
	f.Backends[2].State = model.StateUp
	e.put(t, prev, f)
	check("b2 up again", map[netip.Addr]string{e.Client.IPv4: "b2", other: "b1"})
	// Sessions removed: the map goes with them.
	f.Sessions = nil
	e.put(t, prev, f)
	out = e.nft(t, "list", "table", "inet", "xlb")
	if strings.Contains(out, "10.100.0.21 : 0x") {
		t.Errorf("static map of farm static left after its sessions were removed:\n%s", out)
	}
	e.del(t, prev, "static", "static2")
	if out := e.nft(t, "list", "table", "inet", "xlb"); strings.Contains(out, "10.100.0.2 . 81 : 0x") {
		t.Errorf("static map left after the farm was deleted:\n%s", out)
	}
	// Modes without persistence here are refused, naming the field.
	d := e.farm("static-dsr", vip, 82, model.ProtoTCP, 0)
	d.Mode = model.ModeLocal
	d.Persistence = model.KeySrcIP
	d.Sessions = []model.StaticSession{{Client: "10.100.0.2", Backend: "b0"}}
	if err := e.p.Check(&d); err == nil || !strings.Contains(err.Error(), `"sessions"`) {
		t.Errorf("local farm with static sessions: %v, want a refusal naming sessions", err)
	}
}
