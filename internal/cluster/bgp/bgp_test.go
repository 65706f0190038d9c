package bgp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"

	"github.com/xlb-lb/xlb/internal/health"
	"github.com/xlb-lb/xlb/internal/model"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`
router-id: 10.101.0.11
as: 65001
hold-time: 3s
next-hop-ipv6: fd00:101::11
peers:
  - {address: 10.101.0.1, as: 65000, password: s3cret}
announce: {communities: ["65001:100"]}
farms:
  web: {med: 10, withdraw-when-down: true, communities: ["65001:200", "65001:300"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.HoldTime != 3*time.Second || c.DrainWait != DefaultDrainWait || c.Peers[0].Port != 179 || c.Peers[0].Password != "s3cret" {
		t.Fatalf("config %+v", c)
	}
	web := c.attrsFor("web")
	if *web.MED != 10 || !web.WithdrawWhenDown || fmt.Sprint(web.Communities) != "[65001:200 65001:300]" {
		t.Fatalf("web attrs %+v", web)
	}
	if other := c.attrsFor("other"); other.MED != nil || fmt.Sprint(other.Communities) != "[65001:100]" {
		t.Fatalf("default attrs %+v", other)
	}
	for _, tc := range []struct{ yaml, want string }{
		{`{as: 1, peers: [{address: 10.0.0.1, as: 2}]}`, `router-id "": must be an IPv4 address`},
		{`{router-id: 1.1.1.1, peers: [{address: 10.0.0.1, as: 2}]}`, `as: required`},
		{`{router-id: 1.1.1.1, as: 1}`, `peers: at least one`},
		{`{router-id: 1.1.1.1, as: 1, peers: [{address: 10.0.0.300, as: 2}]}`, `peers[0]: address "10.0.0.300": must be an IP address`},
		{`{router-id: 1.1.1.1, as: 1, peers: [{address: 10.0.0.1, as: 2}, {address: 10.0.0.1, as: 3}]}`, `peers[1]: address 10.0.0.1: listed twice`},
		{`{router-id: 1.1.1.1, as: 1, hold-time: 1s, peers: [{address: 10.0.0.1, as: 2}]}`, `hold-time "1s": must be whole seconds from 3s to 65535s`},
		{`{router-id: 1.1.1.1, as: 1, peers: [{address: 10.0.0.1, as: 2}], announce: {communities: ["70000:1"]}}`, `announce: communities: community "70000:1": must be ASN:VALUE`},
		{`{router-id: 1.1.1.1, as: 1, peers: [{address: 10.0.0.1, as: 2}], farms: {"a b": {}}}`, `farms: name "a b"`},
		{`{router-id: 1.1.1.1, as: 1, peerz: []}`, `field peerz not found`},
		{`{router-id: 1.1.1.1, as: 1, next-hop-ipv6: 10.0.0.1, peers: [{address: 10.0.0.1, as: 2}]}`, `next-hop-ipv6 "10.0.0.1": must be an IPv6 address`},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

func farm(t *testing.T, name, vip string, state model.State, backends ...model.Backend) *model.Farm {
	t.Helper()
	f := model.NewFarm(name)
	f.VirtualAddr = netip.MustParseAddr(vip)
	f.State = state
	f.Backends = backends
	return &f
}

func TestDesired(t *testing.T) {
	ten, five := uint32(10), uint32(5)
	cfg := &Config{
		Default: Attrs{Communities: []Community{100}},
		Farms: map[string]Attrs{
			"checked": {WithdrawWhenDown: true, MED: &ten},
			"quiet":   {Announce: new(bool)},
			"web443":  {MED: &five, Communities: []Community{200}},
		},
	}
	up := model.NewBackend("b")
	up.Addr = netip.MustParseAddr("10.200.0.11")
	down := up
	down.State = model.StateDown
	farms := []*model.Farm{
		farm(t, "checked", "10.99.0.1", model.StateUp, up),
		farm(t, "off", "10.99.0.2", model.StateOff, up),
		farm(t, "quiet", "10.99.0.3", model.StateUp, up),
		farm(t, "web", "fd00:99::1", model.StateUp, up),
		farm(t, "web443", "fd00:99::1", model.StateUp, up),
		{Name: "mark", Mark: 7},
	}
	farms[4].VirtualPorts = nil
	eff := map[string]*model.Farm{"checked": farms[0]}
	get := func(n string) (*model.Farm, bool) { f, ok := eff[n]; return f, ok }
	got := desired(cfg, farms, get, nil)
	if len(got) != 2 {
		t.Fatalf("desired %v, want 10.99.0.1 and fd00:99::1", got)
	}
	if a := got[netip.MustParseAddr("10.99.0.1")]; *a.MED != 10 {
		t.Fatalf("checked: %+v", a)
	}
	if a := got[netip.MustParseAddr("fd00:99::1")]; *a.MED != 5 || !slices.Equal(a.Communities, []Community{100, 200}) {
		t.Fatalf("shared VIP: %+v, want MED 5 and both communities", a)
	}
	// With a health check on its backend: not before the check has
	// passed once.
	farms[0].Check = &model.Check{Type: model.CheckTCP}
	checks := fakeChecks{}
	if got := desired(cfg, farms, get, checks); len(got) != 1 {
		t.Fatalf("desired %v before the first check", got)
	}
	checks["checked/b"] = health.Status{Up: true, Checked: true}
	if got := desired(cfg, farms, get, checks); len(got) != 2 {
		t.Fatalf("desired %v after the first check passed", got)
	}
	// Every backend of the checked farm down by health: withdrawn.
	eff["checked"] = farm(t, "checked", "10.99.0.1", model.StateUp, down)
	if got := desired(cfg, farms, get, checks); len(got) != 1 {
		t.Fatalf("desired %v with checked's backends down", got)
	}
}

type fakeChecks map[string]health.Status

func (f fakeChecks) Status(farm, backend string) (health.Status, bool) {
	st, ok := f[farm+"/"+backend]
	return st, ok
}

// testRouter is a GoBGP server on a loopback address standing in for a
// router, so the speaker's messages are checked by another BGP
// implementation's decoder without any privilege.
func testRouter(t *testing.T, peer netip.Addr) (*server.BgpServer, uint16) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	r := server.NewBgpServer(server.LoggerOption(&logAdapter{log: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	go r.Serve()
	t.Cleanup(r.Stop)
	ctx := context.Background()
	if err := r.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: 65000, RouterId: "192.0.2.1",
		ListenPort: int32(port), ListenAddresses: []string{"127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	if err := r.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
		Conf:      &api.PeerConf{NeighborAddress: peer.String(), PeerAsn: 65001},
		Transport: &api.Transport{PassiveMode: true},
		AfiSafis: []*api.AfiSafi{
			{Config: &api.AfiSafiConfig{Family: familyV4, Enabled: true}},
			{Config: &api.AfiSafiConfig{Family: familyV6, Enabled: true}},
		},
	}}); err != nil {
		t.Fatal(err)
	}
	return r, port
}

// received lists what the router learnt: prefix -> "nh=... med=... comm=[...]".
func received(t *testing.T, r *server.BgpServer) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, fam := range []*api.Family{familyV4, familyV6} {
		err := r.ListPath(context.Background(), &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: fam},
			func(d *api.Destination) {
				for _, p := range d.Paths {
					attrs, err := apiutil.UnmarshalPathAttributes(p.Pattrs)
					if err != nil {
						t.Errorf("decode attributes of %s: %v", d.Prefix, err)
						return
					}
					var desc []string
					for _, a := range attrs {
						switch a := a.(type) {
						case *bgp.PathAttributeNextHop:
							desc = append(desc, "nh="+a.Value.String())
						case *bgp.PathAttributeMpReachNLRI:
							desc = append(desc, "nh="+a.Nexthop.String())
						case *bgp.PathAttributeMultiExitDisc:
							desc = append(desc, fmt.Sprintf("med=%d", a.Value))
						case *bgp.PathAttributeCommunities:
							var cs []string
							for _, c := range a.Value {
								cs = append(cs, Community(c).String())
							}
							desc = append(desc, "comm="+strings.Join(cs, ","))
						}
					}
					slices.Sort(desc)
					out[d.Prefix] = strings.Join(desc, " ")
				}
			})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSpeaker announces IPv4 and IPv6 VIPs with communities and a MED to
// a GoBGP router on loopback, changes and withdraws them, and drains.
func TestSpeaker(t *testing.T) {
	local := netip.MustParseAddr("127.0.0.2")
	r, port := testRouter(t, local)
	med := uint32(20)
	cfg := &Config{RouterID: netip.MustParseAddr("192.0.2.2"), AS: 65001, HoldTime: 3 * time.Second,
		DrainWait: 300 * time.Millisecond, NextHop6: netip.MustParseAddr("fd00:101::11"),
		Peers: []Peer{{Address: netip.MustParseAddr("127.0.0.1"), AS: 65000, Port: port, LocalAddress: local}}}
	ctx := context.Background()
	sp, err := NewSpeaker(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop()
	waitFor(t, "session established", func() bool {
		ss, err := sp.Sessions(ctx)
		return err == nil && len(ss) == 1 && ss[0].State == "established"
	})
	v4, v6 := netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("fd00:99::1")
	if err := sp.Set(ctx, map[netip.Addr]Attrs{
		v4: {Communities: []Community{65001<<16 | 100}, MED: &med},
		v6: {},
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"10.99.0.1/32":   "comm=65001:100 med=20 nh=127.0.0.2", // next hop: the session's address
		"fd00:99::1/128": "nh=fd00:101::11",
	}
	waitFor(t, "routes received", func() bool { return fmt.Sprint(received(t, r)) == fmt.Sprint(want) })
	if rs := sp.Routes(); len(rs) != 2 || rs[0].Prefix != "10.99.0.1/32" || rs[0].Communities[0] != "65001:100" {
		t.Fatalf("routes %+v", rs)
	}
	// Attributes changed: re-announced in place; v6 withdrawn.
	med = 30
	if err := sp.Set(ctx, map[netip.Addr]Attrs{v4: {MED: &med}}); err != nil {
		t.Fatal(err)
	}
	want = map[string]string{"10.99.0.1/32": "med=30 nh=127.0.0.2"}
	waitFor(t, "change and withdrawal received", func() bool { return fmt.Sprint(received(t, r)) == fmt.Sprint(want) })
	// Drain: withdrawn first, the session still up during the wait.
	done := make(chan struct{})
	go func() { sp.Drain(ctx); close(done) }()
	waitFor(t, "withdrawal before the session closes", func() bool { return len(received(t, r)) == 0 })
	select {
	case <-done:
		t.Fatal("drain returned before its wait")
	default:
	}
	<-done
	if err := sp.Set(ctx, map[netip.Addr]Attrs{v4: {}}); err == nil {
		t.Fatal("Set after Drain succeeded")
	}
}

type testGate struct {
	ready   bool
	why     string
	changed chan struct{}
}

func (g *testGate) Ready() (bool, string)    { return g.ready, g.why }
func (g *testGate) Changed() <-chan struct{} { return g.changed }

// TestJoinGates: open when every gate is; the first closed one says why;
// a change of any is forwarded.
func TestJoinGates(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := &testGate{ready: true, changed: make(chan struct{}, 1)}
	b := &testGate{why: "waiting for b", changed: make(chan struct{}, 1)}
	if g := JoinGates(ctx, nil, a); g != Gate(a) {
		t.Fatalf("one gate: %v", g)
	}
	if g := JoinGates(ctx, nil, nil); g != nil {
		t.Fatalf("no gate: %v", g)
	}
	g := JoinGates(ctx, a, b)
	if ok, why := g.Ready(); ok || why != "waiting for b" {
		t.Fatalf("b closed: %v %q", ok, why)
	}
	b.ready = true
	b.changed <- struct{}{}
	select {
	case <-g.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("b's change not forwarded")
	}
	if ok, _ := g.Ready(); !ok {
		t.Fatal("both open, joined closed")
	}
}
