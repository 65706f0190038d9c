package nft

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// groupsOf returns, per group chain, the farms whose rules it holds.
func groupsOf(listing string) map[string][]string {
	out := map[string][]string{}
	chain := ""
	for _, l := range strings.Split(listing, "\n") {
		l = strings.TrimSpace(l)
		if c, ok := strings.CutPrefix(l, "chain "); ok {
			chain, _, _ = strings.Cut(c, " ")
			if strings.HasPrefix(chain, "grp") {
				out[chain] = out[chain][:0:0]
			}
			continue
		}
		if _, after, ok := strings.Cut(l, `comment "farm `); ok && strings.HasPrefix(chain, "grp") {
			name, _, _ := strings.Cut(after, `"`)
			out[chain] = append(out[chain], name)
		}
	}
	return out
}

// groupOf returns the group chain that holds a farm's rules ("" if none).
func groupOf(groups map[string][]string, farm string) string {
	for ch, farms := range groups {
		for _, f := range farms {
			if f == farm {
				return ch
			}
		}
	}
	return ""
}

// TestGroupChains: farms of several backends share group chains of up to
// groupSize farms (group.go). With 44 IPv4 farms (single port, port range,
// every port, UDP, every protocol) and one IPv6 farm: the groups fill in
// order, every farm round-robins over its two backends, a change keeps a
// farm in its group without touching its neighbours' rules, a farm moves to
// a chain of its own and back while a connection through it stays up, an
// emptied group chain goes and its number is taken again, and Reconcile
// packs the groups afresh with traffic flowing.
func TestGroupChains(t *testing.T) {
	e := newEnv(t, 2, true)
	t.Parallel()
	e.startServers(t, 8080)
	ctx := context.Background()
	prev := map[string]*model.Farm{}
	var farms []model.Farm
	for i := 1; i <= 40; i++ {
		farms = append(farms, e.farm(fmt.Sprintf("g%d", i), testutil.VIP4(i), 80, model.ProtoTCP, 8080))
	}
	rng := e.farm("range", testutil.VIP4(41), 8000, model.ProtoTCP, 8080)
	rng.VirtualPorts[0].Last = 8010
	udp := e.farm("udp", testutil.VIP4(42), 53, model.ProtoUDP, 8080)
	anyPort := e.farm("anyport", testutil.VIP4(43), 0, model.ProtoTCP, 8080)
	anyProto := e.farm("anyproto", testutil.VIP4(44), 0, model.ProtoAll, 0)
	v6 := e.farm("v6", testutil.VIP6(1), 80, model.ProtoTCP, 8080)
	farms = append(farms, rng, udp, anyPort, anyProto, v6)
	e.put(t, prev, farms...)

	list := func() string { return e.nft(t, "-a", "list", "table", "inet", "xlb") }
	groups := groupsOf(list())
	sizes := map[string]int{}
	for ch, fs := range groups {
		sizes[ch] = len(fs)
	}
	if want := map[string]int{"grp4-0": 16, "grp4-1": 16, "grp4-2": 12, "grp6-0": 1}; fmt.Sprint(sizes) != fmt.Sprint(want) {
		t.Fatalf("group sizes %v, want %v:\n%s", sizes, want, list())
	}
	if out := list(); strings.Contains(out, "chain f-") {
		t.Errorf("a farm has a chain of its own:\n%s", out)
	}
	// Every farm round-robins over its two backends.
	rr := func(what string, ask func() string) {
		t.Helper()
		if c := e.count(t, 4, ask); c["b0"] != 2 || c["b1"] != 2 {
			t.Errorf("%s: %v, want 2 answers from each backend", what, c)
		}
	}
	tcp := func(vip netip.Addr, port uint16) func() string {
		return func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, port)); return n }
	}
	checkAll := func(when string) {
		t.Helper()
		for _, i := range []int{1, 16, 17, 32, 33, 40} {
			if prev[fmt.Sprintf("g%d", i)] != nil {
				rr(fmt.Sprintf("%s: g%d", when, i), tcp(testutil.VIP4(i), 80))
			}
		}
		rr(when+": range", tcp(testutil.VIP4(41), 8005))
		rr(when+": udp", func() string { n, _ := e.askUDP(t, netip.AddrPortFrom(testutil.VIP4(42), 53)); return n })
		rr(when+": anyport", tcp(testutil.VIP4(43), 4242))
		rr(when+": anyproto", tcp(testutil.VIP4(44), 8080))
		rr(when+": v6", tcp(testutil.VIP6(1), 80))
	}
	checkAll("after add")

	// A connection through g20 stays up through everything below.
	echo := e.holdTCP(t, netip.AddrPortFrom(testutil.VIP4(20), 80))

	// A change keeps g20 in its group: its svc element stays, its rule is
	// replaced, its neighbours' rules keep their handles.
	g20 := groupOf(groups, "g20")
	svcBefore := e.nft(t, "list", "map", "inet", "xlb", "svc4")
	neighbour := ruleHandles(t, e.LB.Name, "g21")
	mine := ruleHandles(t, e.LB.Name, "g20")
	f := prev["g20"].Clone()
	f.Backends[0].Weight = 3
	e.put(t, prev, f)
	groups = groupsOf(list())
	if got := groupOf(groups, "g20"); got != g20 {
		t.Errorf("g20 moved from %s to %s", g20, got)
	}
	if got := e.nft(t, "list", "map", "inet", "xlb", "svc4"); got != svcBefore {
		t.Errorf("svc4 changed:\n%s\nwas:\n%s", got, svcBefore)
	}
	if got := ruleHandles(t, e.LB.Name, "g21"); got != neighbour {
		t.Errorf("g21's rule changed:\n%s\nwas:\n%s", got, neighbour)
	}
	if got := ruleHandles(t, e.LB.Name, "g20"); got == mine {
		t.Errorf("g20's rule was not replaced: %s", got)
	}
	rr("g20 changed", tcp(testutil.VIP4(20), 80))
	echo("changed")

	// Persistence needs a chain of its own; without it, back to a group.
	f = prev["g20"].Clone()
	f.Persistence, f.PersistTTL = model.KeySrcIP, 60
	e.put(t, prev, f)
	if out := list(); !strings.Contains(out, "chain "+chainName("g20")+" {") || strings.Contains(out, `comment "farm g20"`) {
		t.Errorf("g20 with persistence: want a chain of its own:\n%s", out)
	}
	echo("own chain")
	f = prev["g20"].Clone()
	f.Persistence = 0
	e.put(t, prev, f)
	if out := list(); strings.Contains(out, "chain "+chainName("g20")) || groupOf(groupsOf(out), "g20") == "" {
		t.Errorf("g20 without persistence: want it in a group again:\n%s", out)
	}
	rr("g20 back in a group", tcp(testutil.VIP4(20), 80))
	echo("grouped again")

	// Emptying grp4-0 deletes it; new farms fill the open group, then take
	// the number 0 again.
	gone := append([]string(nil), groupsOf(list())["grp4-0"]...)
	e.del(t, prev, gone...)
	if out := list(); strings.Contains(out, "chain grp4-0 ") {
		t.Errorf("grp4-0 survived its last farm:\n%s", out)
	}
	groups = groupsOf(list())
	room := groupSize - len(groups["grp4-2"])
	if room < 1 || len(groups["grp4-1"]) != groupSize {
		t.Fatalf("unexpected groups: %v", groups)
	}
	var more []model.Farm
	for i := 50; i <= 50+room; i++ {
		more = append(more, e.farm(fmt.Sprintf("g%d", i), testutil.VIP4(i), 80, model.ProtoTCP, 8080))
	}
	e.put(t, prev, more...)
	groups = groupsOf(list())
	if len(groups["grp4-2"]) != groupSize || groupOf(groups, fmt.Sprintf("g%d", 50+room)) != "grp4-0" {
		t.Errorf("after %d more farms: groups %v, want grp4-2 full and the last in grp4-0", room+1, groups)
	}
	rr("last new farm", tcp(testutil.VIP4(50+room), 80))
	checkAll("after regrouping")
	echo("regrouped")

	// A restarted plane packs the groups afresh.
	var all []*model.Farm
	for _, f := range prev {
		all = append(all, f)
	}
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	e.p = newPlane(t, e.LB.NS)
	if err := e.p.Reconcile(ctx, all); err != nil {
		t.Fatal(err)
	}
	groups = groupsOf(list())
	n4 := 0
	for ch, fs := range groups {
		if strings.HasPrefix(ch, "grp4-") {
			n4 += len(fs)
		}
	}
	if want := (n4 + groupSize - 1) / groupSize; len(groups)-1 != want {
		t.Errorf("after Reconcile: %d IPv4 farms in %d group chains, want %d: %v", n4, len(groups)-1, want, groups)
	}
	echo("reconciled")
	checkAll("after Reconcile")
	rr("last new farm after Reconcile", tcp(testutil.VIP4(50+room), 80))
}
