package nft

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newPlane returns a plane on ns, closed in Cleanup.
func newPlane(tb testing.TB, ns netns.NsHandle) *Plane {
	tb.Helper()
	p, err := New(context.Background(), testLogger(), Options{NetNS: ns})
	if err != nil {
		tb.Fatalf("new plane: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// env is a topology with a plane on its LB.
type env struct {
	*testutil.Topology
	p *Plane
}

func newEnv(tb testing.TB, backends int, v6 bool) *env {
	tb.Helper()
	testutil.RequireRoot(tb)
	topo := testutil.NewTopology(tb, testutil.TopologyOptions{Backends: backends, IPv6: v6})
	return &env{Topology: topo, p: newPlane(tb, topo.LB.NS)}
}

// farm builds a valid farm on vip:port with the backends' addresses.
func (e *env) farm(name string, vip netip.Addr, port uint16, proto model.Protocol, bport uint16) model.Farm {
	f := model.NewFarm(name)
	f.VirtualAddr = vip
	if vip.Is6() {
		f.Family = model.FamilyIPv6
	}
	if port != 0 {
		f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
	}
	f.Protocol = proto
	for i, b := range e.Backends {
		bk := model.NewBackend(fmt.Sprintf("b%d", i))
		bk.Addr = b.Addr(vip.Is6())
		bk.Port = bport
		f.Backends = append(f.Backends, bk)
	}
	return f
}

func mustValid(tb testing.TB, p *Plane, f *model.Farm) *model.Farm {
	tb.Helper()
	if err := f.Validate(); err != nil {
		tb.Fatalf("farm %s: %v", f.Name, err)
	}
	if err := p.Check(f); err != nil {
		tb.Fatalf("farm %s: %v", f.Name, err)
	}
	c := f.Clone()
	return &c
}

// put applies farms as adds or updates (old taken from prev).
func (e *env) put(tb testing.TB, prev map[string]*model.Farm, farms ...model.Farm) {
	tb.Helper()
	var d plan.Diff
	for i := range farms {
		nf := mustValid(tb, e.p, &farms[i])
		d.Changes = append(d.Changes, plan.FarmChange{Old: prev[nf.Name], New: nf})
		prev[nf.Name] = nf
	}
	if err := e.p.Apply(context.Background(), d); err != nil {
		tb.Fatalf("apply: %v", err)
	}
}

// startServers starts a TCP and UDP server named b<i> on every backend.
func (e *env) startServers(tb testing.TB, port uint16) {
	tb.Helper()
	for i, b := range e.Backends {
		name := fmt.Sprintf("b%d", i)
		testutil.StartTCPServer(tb, b.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), port), name)
		testutil.StartUDPServer(tb, b.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), port), name)
	}
}

// askTCP returns which backend answered and the address it saw.
func (e *env) askTCP(tb testing.TB, to netip.AddrPort) (string, netip.AddrPort) {
	tb.Helper()
	got, err := testutil.AskTCP(e.Client.NS, to)
	if err != nil {
		tb.Fatalf("tcp to %s: %v", to, err)
	}
	name, from, err := testutil.ParseReply(got)
	if err != nil {
		tb.Fatal(err)
	}
	return name, from
}

func (e *env) askUDP(tb testing.TB, to netip.AddrPort) (string, netip.AddrPort) {
	tb.Helper()
	got, err := testutil.AskUDP(e.Client.NS, to)
	if err != nil {
		tb.Fatalf("udp to %s: %v", to, err)
	}
	name, from, err := testutil.ParseReply(got)
	if err != nil {
		tb.Fatal(err)
	}
	return name, from
}

func (e *env) nft(tb testing.TB, args ...string) string {
	tb.Helper()
	return testutil.Run(tb, e.LB.Name, append([]string{"nft"}, args...)...)
}

// del deletes the named farms (old taken from prev).
func (e *env) del(tb testing.TB, prev map[string]*model.Farm, names ...string) {
	tb.Helper()
	var d plan.Diff
	for _, n := range names {
		d.Changes = append(d.Changes, plan.FarmChange{Old: prev[n]})
		delete(prev, n)
	}
	if err := e.p.Apply(context.Background(), d); err != nil {
		tb.Fatalf("apply: %v", err)
	}
}

// hasFarmRules says whether an nft listing holds a farm's rules: a chain of
// its own, or rules in a group chain (commented with the farm's name).
func hasFarmRules(listing, farm string) bool {
	return strings.Contains(listing, "chain "+chainName(farm)+" {") || strings.Contains(listing, `comment "farm `+farm+`"`)
}

// farmRule is one of a farm's rules in `nft -a list table`.
type farmRule struct{ chain, line, handle string }

// farmRuleLines returns a farm's rules from `nft -a list table`: those of
// its own chain and those of group chains that carry its comment.
func farmRuleLines(listing, farm string) []farmRule {
	var out []farmRule
	chain := ""
	for _, l := range strings.Split(listing, "\n") {
		l = strings.TrimSpace(l)
		if c, ok := strings.CutPrefix(l, "chain "); ok {
			chain, _, _ = strings.Cut(c, " ")
			continue
		}
		rule, handle, ok := strings.Cut(l, " # handle ")
		if !ok || strings.HasPrefix(l, "table ") {
			continue
		}
		if chain == chainName(farm) || strings.HasSuffix(rule, `comment "farm `+farm+`"`) {
			out = append(out, farmRule{chain: chain, line: l, handle: handle})
		}
	}
	return out
}

// holdTCP opens a TCP connection from the client to vip:port, reads the
// server's greeting, and returns a function that checks the connection
// still echoes: each step sends its name and expects it back.
func (e *env) holdTCP(t *testing.T, to netip.AddrPort) func(step string) {
	t.Helper()
	held, err := testutil.DialTCP(e.Client.NS, to, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() })
	if _, err := testutil.ReadLine(held, time.Second); err != nil {
		t.Fatal(err)
	}
	return func(step string) {
		t.Helper()
		if _, err := io.WriteString(held, step+"\n"); err != nil {
			t.Fatalf("%s: held connection: %v", step, err)
		}
		if line, err := testutil.ReadLine(held, time.Second); err != nil || line != step {
			t.Fatalf("%s: held connection answered %q, %v", step, line, err)
		}
	}
}
