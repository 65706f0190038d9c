// Package conformance is the one suite of scenarios every xlb data plane
// must pass. Each scenario builds its own client -> LB -> backends topology
// in new network namespaces (testutil.NewTopology), opens the data plane on
// the LB namespace, programs farms through the dataplane.Dataplane interface
// only, and checks with real traffic what a user would check: which backend
// answered, which source address it saw, that the excess was dropped.
//
// A data plane plugs in from a test of its own package:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Plane{
//			Name: "nft",
//			Open: func(t testing.TB, netnsPath string) dataplane.Dataplane { ... },
//			Snapshot: func(t testing.TB, netnsPath string) string { ... },
//			Refuses: map[string]string{"helper-ftp": `"helper" value "ftp"`},
//		})
//	}
//
// Refuses lists the scenarios the plane must refuse, each with a substring
// its error must contain. For a refused scenario the suite applies a plain
// baseline farm, takes a Snapshot, asks Check and then Apply to take the
// scenario's farm and requires the error; then it requires the snapshot to
// be unchanged and the baseline farm to keep serving. A scenario that is
// not listed must pass. Run fails on a Refuses key that names no scenario,
// so the list cannot silently go stale.
//
// A scenario without a traffic check can only be refused (none today).
// Scenarios that log expect the plane to send its log lines to NFLOG group
// LogGroup (see Plane.Open), unless Plane.ConnLog says where else to read
// them.
//
// Scenarios run in parallel, each in its own namespaces; the whole suite
// takes about 25 s against nft on 2 cores.
package conformance

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// LogGroup is the NFLOG group a plane under test must send farm logs to
// (Open configures it): the kernel log of a namespace is silent unless a
// host-wide sysctl says otherwise, so the suite reads NFLOG.
const LogGroup = 7

// Plane is a data plane under test.
type Plane struct {
	// Name is used in messages only.
	Name string
	// Open returns the data plane programming the network namespace
	// bind-mounted at netnsPath (/run/netns/NAME). The suite closes it.
	// Open fails the test itself on error.
	Open func(t testing.TB, netnsPath string) dataplane.Dataplane
	// Snapshot returns a dump of the plane's kernel state in the namespace
	// (for nft: `nft list ruleset`). Refused scenarios compare it before
	// and after. Optional.
	Snapshot func(t testing.TB, netnsPath string) string
	// Refuses maps a scenario name to a substring of the error the plane
	// must return for it.
	Refuses map[string]string
	// ConnLog, when set, is where the log scenario reads the connection
	// log of the plane opened on netnsPath instead of NFLOG: it returns a
	// function waiting for the next record that contains substr. Optional.
	ConnLog func(t testing.TB, netnsPath string) func(substr string, timeout time.Duration) (testutil.NFLogEntry, error)
}

// Scenarios returns the names of all scenarios, sorted.
func Scenarios() []string {
	var out []string
	for _, s := range scenarios {
		out = append(out, s.name)
	}
	sort.Strings(out)
	return out
}

// Run runs every scenario against p as parallel subtests of t.
func Run(t *testing.T, p Plane) {
	known := map[string]bool{}
	for _, s := range scenarios {
		if known[s.name] {
			t.Fatalf("conformance: scenario %q defined twice", s.name)
		}
		known[s.name] = true
	}
	for name := range p.Refuses {
		if !known[name] {
			t.Errorf("conformance: %s refuses unknown scenario %q (known: %s)", p.Name, name, strings.Join(Scenarios(), ", "))
		}
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			testutil.RequireRoot(t)
			e := newEnv(t, p, s)
			f := s.farm(e)
			if err := f.Validate(); err != nil {
				t.Fatalf("scenario farm is invalid: %v", err)
			}
			if want, ok := p.Refuses[s.name]; ok {
				e.checkRefused(t, &f, want, s.attach)
				return
			}
			if s.run == nil {
				t.Fatalf("%s accepts scenario %s, which has no traffic check yet: refuse it or write the check", p.Name, s.name)
			}
			s.run(t, e, f)
		})
	}
}

// scenario is one behaviour checked with traffic.
type scenario struct {
	name     string
	backends int
	v6       bool
	// hairpin puts the backends' bridge ports in hairpin mode (a backend
	// reaching itself through the LB, testutil.TopologyOptions.Hairpin).
	hairpin bool
	// farm returns the farm under test, with the topology's backends.
	farm func(e *Env) model.Farm
	// run applies the farm and checks traffic. nil: no check written yet
	// (the scenario can only be refused).
	run func(t *testing.T, e *Env, f model.Farm)
	// attach, when set, is what a plane that refuses the scenario must
	// refuse instead of the farm alone: it applies the tables the farm
	// uses, then the farm with them, and returns the plane's error.
	attach func(t *testing.T, e *Env, f model.Farm) error
}

// Port numbers: farms listen on VIP:VPort and backends serve on BPort.
const (
	VPort = 80
	BPort = 8080
)

// Env is one scenario's topology and data plane.
type Env struct {
	*testutil.Topology
	DP    dataplane.Dataplane
	plane Plane
	prev  map[string]*model.Farm
	v6    bool
}

func newEnv(t *testing.T, p Plane, s scenario) *Env {
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: max(s.backends, 1), IPv6: true, Hairpin: s.hairpin})
	dp := p.Open(t, "/run/netns/"+topo.LB.Name)
	t.Cleanup(func() { _ = dp.Close() })
	e := &Env{Topology: topo, DP: dp, plane: p, prev: map[string]*model.Farm{}, v6: s.v6}
	for i, b := range topo.Backends {
		name := fmt.Sprintf("b%d", i)
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), BPort), name)
		testutil.StartUDPServer(t, b.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), BPort), name)
	}
	return e
}

// VIP is the scenario's virtual address (IPv6 for v6 scenarios).
func (e *Env) VIP() netip.Addr {
	if e.v6 {
		return testutil.VIP6(1)
	}
	return testutil.VIP4(1)
}

// Farm returns a valid snat/rr farm on VIP:VPort over proto with every
// backend of the topology on BPort.
func (e *Env) Farm(name string, proto model.Protocol) model.Farm {
	return e.farmOn(name, e.VIP(), VPort, proto)
}

func (e *Env) farmOn(name string, vip netip.Addr, port uint16, proto model.Protocol) model.Farm {
	f := model.NewFarm(name)
	f.VirtualAddr = vip
	if vip.Is6() {
		f.Family = model.FamilyIPv6
	}
	f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
	f.Protocol = proto
	for i, b := range e.Backends {
		bk := model.NewBackend(fmt.Sprintf("b%d", i))
		bk.Addr = b.Addr(vip.Is6())
		bk.Port = BPort
		f.Backends = append(f.Backends, bk)
	}
	return f
}

// Put validates, checks and applies farms as one diff (adds or updates).
func (e *Env) Put(t testing.TB, farms ...model.Farm) {
	t.Helper()
	if err := e.TryPut(farms...); err != nil {
		t.Fatal(err)
	}
}

// TryPut is Put returning the error; on error nothing is remembered.
func (e *Env) TryPut(farms ...model.Farm) error {
	var d plan.Diff
	for i := range farms {
		f := farms[i].Clone()
		if err := f.Validate(); err != nil {
			return fmt.Errorf("validate: %w", err)
		}
		if err := e.DP.Check(&f); err != nil {
			return fmt.Errorf("check: %w", err)
		}
		d.Changes = append(d.Changes, plan.FarmChange{Old: e.prev[f.Name], New: &f})
	}
	if err := e.DP.Apply(context.Background(), d); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	for _, c := range d.Changes {
		e.prev[c.New.Name] = c.New
	}
	return nil
}

// AskTCP opens a new TCP connection from the client (from local if valid)
// and returns which backend answered and the address it saw.
func (e *Env) AskTCP(t testing.TB, local, to netip.AddrPort) (string, netip.AddrPort) {
	t.Helper()
	got, err := testutil.AskTCPFrom(e.Client.NS, local, to)
	if err != nil {
		t.Fatalf("tcp %s -> %s: %v", local, to, err)
	}
	return parse(t, got)
}

// AskUDP is AskTCP over UDP (a new socket, so a new flow, each time).
func (e *Env) AskUDP(t testing.TB, local, to netip.AddrPort) (string, netip.AddrPort) {
	t.Helper()
	got, err := testutil.AskUDPFrom(e.Client.NS, local, to)
	if err != nil {
		t.Fatalf("udp %s -> %s: %v", local, to, err)
	}
	return parse(t, got)
}

func parse(t testing.TB, got string) (string, netip.AddrPort) {
	t.Helper()
	name, from, err := testutil.ParseReply(got)
	if err != nil {
		t.Fatal(err)
	}
	return name, from
}

// Count asks n times and counts answers per backend.
func Count(n int, ask func() string) map[string]int {
	c := map[string]int{}
	for range n {
		c[ask()]++
	}
	return c
}

// FlushConntrack forgets every connection in the LB namespace, so the next
// packet of a flow is scheduled again.
func (e *Env) FlushConntrack(t testing.TB) {
	t.Helper()
	if out, err := testutil.RunErr(e.LB.Name, "conntrack", "-F"); err != nil && !strings.Contains(out, "0 flow entries") {
		t.Logf("conntrack -F: %v", err)
	}
}

// ClientAddrs adds n extra addresses to the client (10.100.0.10+i or
// fd00:100::10+i) and returns them.
func (e *Env) ClientAddrs(t testing.TB, n int) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for i := range n {
		var a netip.Addr
		if e.v6 {
			b := testutil.ClientNet6.Addr().As16()
			b[15] = byte(0x10 + i)
			a = netip.AddrFrom16(b)
			e.Client.AddAddr(t, netip.PrefixFrom(a, 64))
		} else {
			b := testutil.ClientNet4.Addr().As4()
			b[3] = byte(10 + i)
			a = netip.AddrFrom4(b)
			e.Client.AddAddr(t, netip.PrefixFrom(a, 24))
		}
		out = append(out, a)
	}
	return out
}

// checkRefused applies a baseline farm, then requires the plane to refuse
// f with an error containing want, leaving the kernel unchanged.
func (e *Env) checkRefused(t *testing.T, f *model.Farm, want string, attach func(*testing.T, *Env, model.Farm) error) {
	base := e.farmOn("conformance-baseline", testutil.VIP4(200), VPort, model.ProtoTCP)
	e.Put(t, base)
	ask := func() {
		t.Helper()
		if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(testutil.VIP4(200), VPort)); err != nil {
			t.Fatalf("baseline farm does not answer: %v", err)
		}
	}
	ask()
	var before string
	if e.plane.Snapshot != nil {
		before = e.plane.Snapshot(t, "/run/netns/"+e.LB.Name)
	}
	var err error
	if attach != nil {
		err = attach(t, e, *f)
	} else if err = e.DP.Check(f); err == nil {
		nf := f.Clone()
		err = e.DP.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: &nf}}})
	}
	switch {
	case err == nil:
		t.Errorf("%s took the farm, want a refusal containing %q", e.plane.Name, want)
	case !strings.Contains(err.Error(), want):
		t.Errorf("refusal %q does not contain %q", err, want)
	}
	if e.plane.Snapshot != nil {
		if after := e.plane.Snapshot(t, "/run/netns/"+e.LB.Name); after != before {
			t.Errorf("refused farm changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	}
	ask()
}
