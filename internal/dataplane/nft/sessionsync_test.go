package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestInstallSessions: a peer's sessions go into the farm's persistence
// map (connection sync, internal/cluster/sessionsync): the client's next
// connection goes to the installed backend, not rr's; one with less time
// left than the session held stands aside, one with more replaces it; an
// unknown backend is refused, named.
func TestInstallSessions(t *testing.T) {
	e := newEnv(t, 3, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	prev := map[string]*model.Farm{}
	f := e.farm("sticky", vip.Addr(), 80, model.ProtoTCP, 8080)
	f.Persistence, f.PersistTTL = model.KeySrcIP, 300
	e.put(t, prev, f)
	c := netip.MustParseAddr("10.100.0.30")
	e.Client.AddAddr(t, netip.PrefixFrom(c, 24))
	ctx := context.Background()
	install := func(backend string, left time.Duration) (int, error) {
		return e.p.InstallSessions(ctx, prev["sticky"], []dataplane.Session{{Client: c.String(), Backend: backend, Expires: left}})
	}
	if n, err := install("b2", 100*time.Second); n != 1 || err != nil {
		t.Fatalf("install: %d, %v", n, err)
	}
	if n, err := install("b1", 50*time.Second); n != 0 || err != nil {
		t.Fatalf("install of one with less time left: %d, %v; want it kept out", n, err)
	}
	if n, err := install("b1", 200*time.Second); n != 1 || err != nil {
		t.Fatalf("install of one with more time left: %d, %v", n, err)
	}
	ss, err := e.p.Sessions(ctx, prev["sticky"])
	if err != nil || len(ss) != 1 || ss[0].Backend != "b1" || ss[0].Expires > 200*time.Second || ss[0].Expires < 190*time.Second {
		t.Fatalf("sessions %+v (%v), want the client's with b1 and about 200 s", ss, err)
	}
	got, err := testutil.AskTCPFrom(e.Client.NS, netip.AddrPortFrom(c, 0), vip)
	if err != nil {
		t.Fatal(err)
	}
	if name, _, _ := testutil.ParseReply(got); name != "b1" {
		t.Errorf("the client went to %s, want b1 (its installed session; rr's first is b0)", name)
	}
	if _, err := install("b9", time.Minute); err == nil || !strings.Contains(err.Error(), `no backend "b9"`) {
		t.Errorf("a session for an unknown backend: %v, want it refused, named", err)
	}
}

// BenchmarkSessionsPoll: what connection sync's poll of a persistent farm
// (internal/cluster/sessionsync, once a second) costs: listing the farm's
// 10,000 sessions whole. Reported per session.
func BenchmarkSessionsPoll(b *testing.B) {
	e := newEnv(b, 3, false)
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	prev := map[string]*model.Farm{}
	f := e.farm("sticky", vip.Addr(), 80, model.ProtoTCP, 8080)
	f.Persistence, f.PersistTTL = model.KeySrcIP, 3600
	e.put(b, prev, f)
	const n = 10000
	ss := make([]dataplane.Session, n)
	for i := range ss {
		a := netip.AddrFrom4([4]byte{10, 120, byte(i >> 8), byte(i)})
		ss[i] = dataplane.Session{Client: a.String(), Backend: []string{"b0", "b1", "b2"}[i%3], Expires: time.Hour}
	}
	ctx := context.Background()
	if k, err := e.p.InstallSessions(ctx, prev["sticky"], ss); k != n || err != nil {
		b.Fatalf("install: %d, %v", k, err)
	}
	for b.Loop() {
		got, err := e.p.Sessions(ctx, prev["sticky"])
		if err != nil || len(got) != n {
			b.Fatalf("sessions: %d, %v", len(got), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/session")
}
