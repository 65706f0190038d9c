package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// failoverOpts is one run of the failover scenario: long-lived
// connections and a stream of new ones through the VIP of two xlb nodes
// behind BIRD's ECMP, then one node killed, brought back, and a third
// added.
type failoverOpts struct {
	Mode string // dnat, snat, dsr, stlsdnat
	// Plane: nft, ebpf, or mixed (nodes 0 and 2 on nft, node 1 on
	// ebpf: a cluster being moved from one plane to the other, whose
	// nodes must carry each other's flows).
	Plane string
	Sync  bool // connection sync between the nodes
	// NodeLost: the killed node's links go down too (the whole node is
	// gone, its kernel forwards nothing); otherwise only its daemon dies
	// (kill -9), its kernel keeps its rules and connections.
	NodeLost bool
	Conns    int           // long-lived connections
	NewRate  int           // new connections a second
	Phase    time.Duration // time between the events
	// Baseline "vrrp": the LVS-style active-backup baseline instead of
	// BGP and ECMP (vrrp_test.go): keepalived moves the VIP, and with
	// Conntrackd conntrackd (FTFW) keeps the backup's copy of the
	// master's connections, with Sync xlb's own sync does. Only with
	// NodeLost, and no third node.
	Baseline   string `json:",omitempty"`
	Conntrackd bool   `json:",omitempty"`
	// Scheduler of the farm (default maglev).
	Scheduler string `json:",omitempty"`
	// VRRPAdvert is keepalived's advertisement interval (default 1 s).
	VRRPAdvert time.Duration `json:",omitempty"`
	// SyncCut: instead of losing the first node, cut its connection sync
	// (its sync packets dropped both ways) and restore it; no third node.
	SyncCut bool `json:",omitempty"`
	// SharedSNAT (snat): every node translates to the farm's source-addr,
	// one address for all (sharedSNAT), each from its own source ports
	// (--snat-ports), and the backends answer through the node whose
	// packet came last; otherwise each node masquerades with its own
	// address.
	SharedSNAT bool `json:",omitempty"`
	// Persistence: the farm's persistence keys (nftlb's "persistence",
	// e.g. srcip), with a persist-ttl of 300 s; none by default.
	Persistence string `json:",omitempty"`
}

// planeOf is node i's data plane.
func (o failoverOpts) planeOf(i int) string {
	if o.Plane != "mixed" {
		return o.Plane
	}
	return []string{"nft", "ebpf"}[i%2]
}

// failoverResult counts what the clients saw in each phase.
type failoverResult struct {
	Opts failoverOpts `json:"opts"`
	// Long-lived connections broken in each phase (reset, EOF, or no echo
	// within 2 s), and established at the start.
	Established int            `json:"established"`
	Broken      map[string]int `json:"broken"`     // by phase: lost, back, added
	BrokenHow   map[string]int `json:"broken-how"` // reset, eof, stall
	// Recovered: of the stalled ones, by phase, those whose echo came
	// within 15 s after all (the connection lived on, late).
	Recovered   map[string]int             `json:"recovered,omitempty"`
	NewFailed   map[string]int             `json:"new-failed"`   // by phase
	NewTotal    map[string]int             `json:"new-total"`    // by phase
	RouteTimes  map[string]string          `json:"route-times"`  // until the router withdrew or re-added the node
	SetupFailed int                        `json:"setup-failed"` // long-lived connections that could not be opened
	Sync        map[string]json.RawMessage `json:"sync,omitempty"`
	// Notes: what a baseline's nodes counted (vrrp_test.go).
	Notes map[string]string `json:"notes,omitempty"`
}

var phases = []string{"steady", "lost", "back", "added"}

// sharedSNAT is the snat farms' source-addr with failoverOpts.SharedSNAT:
// outside the backend segment, so the backends route it to a node.
var sharedSNAT = netip.MustParseAddr("10.201.0.1")

// failoverCluster is the nodes of one run: how the first one goes, comes
// back, and how a third is added (ECMP over BGP, or the VRRP baseline).
type failoverCluster interface {
	// lose takes the first node away and returns how long until the
	// others carry its traffic (the router withdrew it; the backup took
	// the VIP).
	lose(t *testing.T) time.Duration
	// back brings it back and returns how long until it is ready (the
	// router re-added it; it is the VRRP backup again).
	back(t *testing.T) time.Duration
	// add adds a third node and returns how long until it carries
	// traffic; false: not done (active-backup has no use for it).
	add(t *testing.T) (time.Duration, bool)
	// finish adds what the nodes counted to the result.
	finish(res *failoverResult)
}

// runFailover runs the scenario and returns its counts.
func runFailover(t *testing.T, o failoverOpts) failoverResult {
	testutil.RequireRoot(t)
	if o.Phase == 0 {
		o.Phase = 8 * time.Second
	}
	if o.Scheduler == "" {
		o.Scheduler = "maglev"
	}
	res := failoverResult{Opts: o, Broken: map[string]int{}, BrokenHow: map[string]int{}, Recovered: map[string]int{}, NewFailed: map[string]int{},
		NewTotal: map[string]int{}, RouteTimes: map[string]string{}, Sync: map[string]json.RawMessage{}}
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	var cl failoverCluster
	var client testutil.Host
	if o.Baseline == "vrrp" {
		v := newVRRPCluster(t, o, vip)
		cl, client = v, v.topo.Client
	} else {
		e := newECMPCluster(t, o, vip)
		cl, client = e, e.topo.Client
	}

	// Long-lived connections: an echo a second on each.
	var phase atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	broken := func(how string) {
		mu.Lock()
		res.Broken[phases[phase.Load()]]++
		res.BrokenHow[how]++
		mu.Unlock()
	}
	var wg sync.WaitGroup
	conns := make([]net.Conn, 0, o.Conns)
	for i := 0; i < o.Conns; i++ {
		c, err := testutil.DialTCP(client.NS, vip, 3*time.Second)
		if err == nil {
			_, err = testutil.ReadLine(c, 3*time.Second)
		}
		if err != nil {
			res.SetupFailed++
			if c != nil {
				c.Close()
			}
			continue
		}
		conns = append(conns, c)
	}
	res.Established = len(conns)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			// Spread the echoes over the second.
			time.Sleep(time.Duration(i) * time.Second / time.Duration(max(len(conns), 1)))
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				msg := "ping " + strconv.Itoa(n)
				c.SetWriteDeadline(time.Now().Add(2 * time.Second))
				if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
					broken(classify(err))
					return
				}
				line, err := testutil.ReadLine(c, 2*time.Second)
				if err != nil || line != msg {
					if ctx.Err() != nil {
						return
					}
					how := classify(err)
					broken(how)
					if how == "stall" {
						// Counted broken; whether its echo comes at
						// all (within 15 s) is noted apart.
						p := phases[phase.Load()]
						rest, err := testutil.ReadLine(c, 15*time.Second)
						if err == nil && line+rest == msg {
							mu.Lock()
							res.Recovered[p]++
							mu.Unlock()
						}
					}
					return
				}
			}
		}()
	}
	// New connections: NewRate a second, each connect + greeting.
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(max(o.NewRate, 1)))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			p := phases[phase.Load()]
			go func() {
				_, err := testutil.AskTCP(client.NS, vip)
				mu.Lock()
				res.NewTotal[p]++
				if err != nil && ctx.Err() == nil {
					res.NewFailed[p]++
				}
				mu.Unlock()
			}()
		}
	}()
	time.Sleep(o.Phase)

	// lost: kill -9 (and the node's links down).
	phase.Store(1)
	res.RouteTimes["withdrawn"] = cl.lose(t).Round(time.Millisecond).String()
	time.Sleep(o.Phase)

	// back: the node returns (links up, daemons started).
	phase.Store(2)
	res.RouteTimes["re-added"] = cl.back(t).Round(time.Millisecond).String()
	time.Sleep(o.Phase)

	// added: a third node.
	phase.Store(3)
	if d, ok := cl.add(t); ok {
		res.RouteTimes["added"] = d.Round(time.Millisecond).String()
		time.Sleep(o.Phase)
	}

	cancel()
	wg.Wait()
	cl.finish(&res)
	return res
}

// farmState is the state every node restores: one farm on vip, on the
// topology's backends, as the operator's tooling would put it.
func farmState(t *testing.T, topo *testutil.HATopology, o failoverOpts, vip netip.AddrPort, extra string) string {
	// dsr: the backends hold the VIP and answer the client directly.
	stateless := o.Mode == "dsr"
	var state strings.Builder
	fmt.Fprintf(&state, `{"farms":[{"name":"web","family":"ipv4","virtual-addr":"%s","virtual-ports":"80","protocol":"tcp","mode":"%s","scheduler":"%s"%s,"backends":[`,
		vip.Addr(), o.Mode, o.Scheduler, extra)
	for i, b := range topo.Backends {
		if i > 0 {
			state.WriteString(",")
		}
		port := "8080"
		if stateless {
			port = ""
		}
		fmt.Fprintf(&state, `{"name":"be%d","ip-addr":"%s","port":"%s"}`, i+1, b.IPv4, port)
	}
	state.WriteString("]}]}")
	stateFile := filepath.Join(t.TempDir(), "state.json")
	os.WriteFile(stateFile, []byte(state.String()), 0o644)
	return stateFile
}

// startBackends starts the backends' servers (dsr: on the VIP, which
// they hold; otherwise on their own address).
func startBackends(t *testing.T, topo *testutil.HATopology, o failoverOpts, vip netip.AddrPort) {
	for i, b := range topo.Backends {
		if o.Mode == "dsr" {
			testutil.Run(t, b.Name, "ip", "addr", "add", vip.Addr().String()+"/32", "dev", "lo")
			testutil.StartTCPServer(t, b.NS, vip, fmt.Sprintf("backend-%d", i+1))
		} else {
			testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), fmt.Sprintf("backend-%d", i+1))
		}
	}
}

// ecmpCluster is xlb's own: BIRD spreads flows over the nodes that
// announce the VIP over BGP; with Sync the nodes share connection state.
type ecmpCluster struct {
	o         failoverOpts
	topo      *testutil.HATopology
	vip       netip.AddrPort
	stateFile string
	keyFile   string
	nodes     []*haNode
	// pins: each eBPF node's pin path, kept across its restart.
	pins map[int]string
}

func newECMPCluster(t *testing.T, o failoverOpts, vip netip.AddrPort) *ecmpCluster {
	// dnat: the backends answer the client, and must answer through the
	// node that forwarded (docs/ha.md): each connection's replies follow
	// the LB its last packet came from. snat with a shared source
	// address: the same, since the address is every node's. dsr: the
	// backends answer clients through a router of their own, as in a real
	// network.
	topo := testutil.NewHATopology(t, testutil.HAOptions{LBs: 2, Backends: 3,
		SymmetricReturn: o.Mode == "dnat" || o.SharedSNAT, ReturnViaRouter: o.Mode == "dsr"})
	topo.StartBIRD(t, testutil.BIRDOptions{Peers: 3})
	startBackends(t, topo, o, vip)
	c := &ecmpCluster{o: o, topo: topo, vip: vip, keyFile: filepath.Join(t.TempDir(), "sync.key"), pins: map[int]string{}}
	// The same state on every node; maglev, so that a flow moved to
	// another node finds the same backend there even without state.
	extra := ""
	if o.SharedSNAT {
		extra = fmt.Sprintf(`,"source-addr":"%s"`, sharedSNAT)
	}
	if o.Persistence != "" {
		extra += fmt.Sprintf(`,"persistence":"%s","persist-ttl":"300"`, o.Persistence)
	}
	c.stateFile = farmState(t, topo, o, vip, extra)
	c.nodes = []*haNode{c.startNode(t, topo.LBs[0]), c.startNode(t, topo.LBs[1])}
	topo.WaitNextHops(t, vip.Addr(), 2, 20*time.Second)
	return c
}

func (c *ecmpCluster) startNode(t *testing.T, lb *testutil.LBNode) *haNode {
	plane := c.o.planeOf(lb.Index)
	args := []string{"--dataplane", plane}
	if plane == "ebpf" {
		// Each node pins its program on a bpffs of its own that
		// outlives the daemon, as on a real node (under `ip netns exec`
		// the daemon's own mount of /sys/fs/bpf dies with it, and the
		// program with it: a kill -9 would then take the node's data
		// plane too, and the replies still routed to it would go
		// untranslated).
		if c.pins[lb.Index] == "" {
			c.pins[lb.Index] = mountBPFFS(t)
		}
		args = append(args, "--pin-path", c.pins[lb.Index])
	}
	if c.o.SharedSNAT {
		// Disjoint source ports: node i takes 20000+10000i to
		// 29999+10000i.
		first := 20000 + 10000*lb.Index
		args = append(args, "--snat-ports", fmt.Sprintf("%d-%d", first, first+9999))
	}
	if c.o.Sync {
		args = append(args, syncArgs(t, lb, 3, c.keyFile)...)
	}
	if c.o.Mode == "dsr" {
		// dsr takes the VIP's packets at ingress; the route keeps the
		// node's kernel from answering for it.
		testutil.RunErr(lb.Name, "ip", "route", "replace", c.vip.Addr().String()+"/32", "dev", "eth0")
	}
	return newHANodeState(t, c.topo, lb, c.stateFile, args...)
}

// syncArgs are the daemon flags of node lb's connection sync with the
// other nodes of a cluster of n (their LB-side addresses, port 7000), with
// the key in keyFile (written here if missing).
func syncArgs(t *testing.T, lb *testutil.LBNode, n int, keyFile string) []string {
	if _, err := os.Stat(keyFile); err != nil {
		if err := os.WriteFile(keyFile, []byte("failover-sync-key-0123456789\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var peers []string
	for i := range n {
		if i != lb.Index {
			peers = append(peers, fmt.Sprintf("10.101.0.%d:7000", 11+i))
		}
	}
	return []string{"--sync-listen", lb.IPv4.String() + ":7000", "--sync-peers", strings.Join(peers, ","),
		"--sync-key-file", keyFile, "--sync-wait", "5s"}
}

// syncCut is the nft table that cuts a node's connection sync.
const syncCut = `table inet xlbt_synccut {
	chain in { type filter hook input priority -300; tcp dport 7000 drop; tcp sport 7000 drop; }
	chain out { type filter hook output priority -300; tcp dport 7000 drop; tcp sport 7000 drop; }
}
`

func (c *ecmpCluster) lose(t *testing.T) time.Duration {
	if c.o.SyncCut {
		cmd := exec.Command("ip", "netns", "exec", c.topo.LBs[0].Name, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(syncCut)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cut the sync of %s: %v: %s", c.topo.LBs[0].Name, err, out)
		}
		return 0
	}
	t0 := time.Now()
	c.nodes[0].kill()
	if c.o.NodeLost {
		c.topo.SetLBLinks(t, 0, false)
	}
	c.topo.WaitNextHops(t, c.vip.Addr(), 1, 15*time.Second)
	return time.Since(t0)
}

// back: it announces once it has its peers' state.
func (c *ecmpCluster) back(t *testing.T) time.Duration {
	t0 := time.Now()
	if c.o.SyncCut {
		// Both nodes announced all along: losing sync withdraws nothing.
		if nhs, _ := c.topo.RouteNextHops(c.vip.Addr()); len(nhs) != 2 {
			t.Errorf("with the sync cut, the router's route has next hops %v, want both nodes", nhs)
		}
		// The cut node sees its stream to the peer broken (nothing
		// acknowledged within the sync's send timeout).
		waitFor(t, c.nodes[0].lb.Name+" sees its sync stream broken", 15*time.Second, func() bool {
			out, err := c.nodes[0].cli("sync")
			return err == nil && !strings.Contains(out, "connected")
		})
		testutil.Run(t, c.topo.LBs[0].Name, "nft", "delete", "table", "inet", "xlbt_synccut")
		for _, n := range c.nodes {
			waitFor(t, n.lb.Name+" sync connected again", 30*time.Second, func() bool {
				out, err := n.cli("sync")
				return err == nil && strings.Contains(out, "connected")
			})
		}
		return time.Since(t0)
	}
	if c.o.NodeLost {
		c.topo.SetLBLinks(t, 0, true)
	}
	c.nodes[0].start()
	c.topo.WaitNextHops(t, c.vip.Addr(), 2, 20*time.Second)
	return time.Since(t0)
}

// add: the backends route through the third node only once it announces
// (it holds its peers' state by then).
func (c *ecmpCluster) add(t *testing.T) (time.Duration, bool) {
	if c.o.SyncCut {
		return 0, false
	}
	t0 := time.Now()
	lb2 := c.topo.AddLB(t)
	c.topo.SetReturnVia(t, 2, false)
	c.nodes = append(c.nodes, c.startNode(t, lb2))
	c.topo.WaitNextHops(t, c.vip.Addr(), 3, 20*time.Second)
	d := time.Since(t0)
	c.topo.SetReturnVia(t, 2, true)
	return d, true
}

func (c *ecmpCluster) finish(res *failoverResult) {
	if !c.o.Sync {
		return
	}
	for _, n := range c.nodes {
		if out, err := n.cli("sync"); err == nil {
			if i := strings.Index(out, "{"); i >= 0 {
				res.Sync[n.lb.Name[strings.LastIndex(n.lb.Name, "-")+1:]] = json.RawMessage(out[i:])
			}
		}
	}
}

func classify(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "wrong-echo"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.As(err, &ne) && ne.Timeout():
		return "stall"
	case errors.Is(err, syscall.EPIPE) || strings.Contains(err.Error(), "EOF"):
		return "eof"
	}
	return "other: " + err.Error()
}

// newHANodeState is newHANode that restores stateFile once it answers.
func newHANodeState(t *testing.T, topo *testutil.HATopology, lb *testutil.LBNode, stateFile string, args ...string) *haNode {
	n := newHANode(t, topo, lb, args...)
	n.mustCLI("restore", "-f", stateFile)
	return n
}

// TestSyncFailover: snat and dnat on both data planes with connection
// sync: long-lived connections through two nodes survive one node's daemon
// being killed (the routers move its flows to the other node, which has
// never seen them), its return, and a third node added; snat with a source
// address the nodes share survives the whole node lost (its links down).
// Without sync, or with each node's own source address when the node is
// lost, the same runs break connections (bench/results/ha.md). "mixed"
// is a cluster of both planes (the first and third node nft, the second
// eBPF): each plane installs the other's records.
func TestSyncFailover(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf", "mixed"} {
		for _, c := range []struct {
			name string
			o    failoverOpts
		}{
			{"snat", failoverOpts{Mode: "snat"}},
			{"dnat", failoverOpts{Mode: "dnat"}},
			// The whole node lost: its snat flows go on from the other
			// node with the address they had, which is every node's.
			{"snat-shared-lost", failoverOpts{Mode: "snat", SharedSNAT: true, NodeLost: true}},
		} {
			t.Run(plane+"/"+c.name, func(t *testing.T) {
				o := c.o
				o.Plane, o.Sync, o.Conns, o.NewRate, o.Phase = plane, true, 60, 10, 4*time.Second
				syncFailover(t, o)
			})
		}
	}
}

func syncFailover(t *testing.T, o failoverOpts) {
	res := runFailover(t, o)
	b, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("result:\n%s", b)
	if res.Established < 55 {
		t.Fatalf("only %d of 60 long-lived connections opened", res.Established)
	}
	total := 0
	for _, n := range res.Broken {
		total += n
	}
	if total != 0 {
		t.Fatalf("%d long-lived connections broken: %v %v", total, res.Broken, res.BrokenHow)
	}
}

// TestSyncCut: losing connection sync never stops local traffic. Two
// nodes with sync carry snat connections behind BIRD's ECMP; the first
// node's sync is cut (its sync packets dropped both ways, a partition of
// the sync channel only) for a phase, then restored: no long-lived
// connection breaks, no new connection fails, both nodes stay announced,
// and sync connects again.
func TestSyncCut(t *testing.T) {
	res := runFailover(t, failoverOpts{Mode: "snat", Plane: "nft", Sync: true, SyncCut: true, Conns: 60, NewRate: 10, Phase: 5 * time.Second})
	b, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("result:\n%s", b)
	if res.Established < 55 {
		t.Fatalf("only %d of 60 long-lived connections opened", res.Established)
	}
	for _, p := range phases {
		if res.Broken[p] != 0 || res.NewFailed[p] != 0 {
			t.Errorf("phase %s: %d long-lived connections broken (%v), %d of %d new connections failed",
				p, res.Broken[p], res.BrokenHow, res.NewFailed[p], res.NewTotal[p])
		}
	}
}

// TestHABench runs the measured matrix (bench/ha/run.sh) when
// XLB_HA_BENCH names the file to append results to.
func TestHABench(t *testing.T) {
	out := os.Getenv("XLB_HA_BENCH")
	if out == "" {
		t.Skip("set XLB_HA_BENCH=FILE to run the HA benchmark (bench/ha/run.sh)")
	}
	conns, _ := strconv.Atoi(os.Getenv("XLB_HA_CONNS"))
	if conns <= 0 {
		conns = 1000
	}
	phase, _ := time.ParseDuration(os.Getenv("XLB_HA_PHASE"))
	var cases []failoverOpts
	for _, spec := range strings.Fields(os.Getenv("XLB_HA_CASES")) {
		// mode/plane/how/kill|lost[/scheduler], how: sync, nosync (xlb's
		// BGP and ECMP, with or without its sync), vrrp, vrrp+conntrackd
		// (the keepalived baseline, vrrp_test.go), vrrp+sync
		// (keepalived's VRRP with xlb's sync), these three with
		// @INTERVAL for VRRP's advertisements (default 1s); mode
		// snat+shared: SharedSNAT.
		f := strings.Split(spec, "/")
		if len(f) != 4 && len(f) != 5 {
			t.Fatalf("XLB_HA_CASES: %q is not mode/plane/sync|nosync|vrrp[@ADVERT]|vrrp+conntrackd[@ADVERT]|vrrp+sync[@ADVERT]/kill|lost[/scheduler]", spec)
		}
		mode, shared := strings.CutSuffix(f[0], "+shared")
		o := failoverOpts{Mode: mode, SharedSNAT: shared, Plane: f[1], Sync: f[2] == "sync", NodeLost: f[3] == "lost",
			Conns: conns, NewRate: 20, Phase: phase}
		how, advert, _ := strings.Cut(f[2], "@")
		switch how {
		case "sync", "nosync":
		case "vrrp", "vrrp+conntrackd", "vrrp+sync":
			o.Baseline, o.Conntrackd, o.Sync = "vrrp", how == "vrrp+conntrackd", how == "vrrp+sync"
			if advert != "" {
				d, err := time.ParseDuration(advert)
				if err != nil {
					t.Fatalf("XLB_HA_CASES: %q: advertisement interval: %v", spec, err)
				}
				o.VRRPAdvert = d
			}
		default:
			t.Fatalf("XLB_HA_CASES: %q: %q is not sync, nosync, vrrp, vrrp+conntrackd or vrrp+sync", spec, f[2])
		}
		if len(f) == 5 {
			o.Scheduler = f[4]
		}
		cases = append(cases, o)
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s-%s-sync=%v-lost=%v-%s%v-%s-shared=%v", c.Mode, c.Plane, c.Sync, c.NodeLost, c.Baseline, c.Conntrackd, c.Scheduler, c.SharedSNAT)
		t.Run(name, func(t *testing.T) {
			res := runFailover(t, c)
			b, _ := json.Marshal(res)
			f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			f.Write(append(b, '\n'))
			t.Logf("%s", b)
		})
	}
}
