package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
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
	Mode  string // dnat, snat, dsr, stlsdnat
	Plane string // nft, ebpf
	Sync  bool   // connection sync between the nodes
	// NodeLost: the killed node's links go down too (the whole node is
	// gone, its kernel forwards nothing); otherwise only its daemon dies
	// (kill -9), its kernel keeps its rules and connections.
	NodeLost bool
	// SharedSNAT (snat): every node translates to the farm's source-addr,
	// one address for all (sharedSNAT), each from its own source ports
	// (--snat-ports), and the backends answer through the node whose
	// packet came last; otherwise each node masquerades with its own
	// address.
	SharedSNAT bool          `json:",omitempty"`
	Conns      int           // long-lived connections
	NewRate    int           // new connections a second
	Phase      time.Duration // time between the events
}

// failoverResult counts what the clients saw in each phase.
type failoverResult struct {
	Opts failoverOpts `json:"opts"`
	// Long-lived connections broken in each phase (reset, EOF, or no echo
	// within 2 s), and established at the start.
	Established int                        `json:"established"`
	Broken      map[string]int             `json:"broken"`       // by phase: lost, back, added
	BrokenHow   map[string]int             `json:"broken-how"`   // reset, eof, stall
	NewFailed   map[string]int             `json:"new-failed"`   // by phase
	NewTotal    map[string]int             `json:"new-total"`    // by phase
	RouteTimes  map[string]string          `json:"route-times"`  // until the router withdrew or re-added the node
	SetupFailed int                        `json:"setup-failed"` // long-lived connections that could not be opened
	Sync        map[string]json.RawMessage `json:"sync,omitempty"`
}

var phases = []string{"steady", "lost", "back", "added"}

// sharedSNAT is the snat farms' source-addr with failoverOpts.SharedSNAT:
// outside the backend segment, so the backends route it to a node.
var sharedSNAT = netip.MustParseAddr("10.201.0.1")

// runFailover runs the scenario and returns its counts.
func runFailover(t *testing.T, o failoverOpts) failoverResult {
	testutil.RequireRoot(t)
	if o.Phase == 0 {
		o.Phase = 8 * time.Second
	}
	res := failoverResult{Opts: o, Broken: map[string]int{}, BrokenHow: map[string]int{}, NewFailed: map[string]int{},
		NewTotal: map[string]int{}, RouteTimes: map[string]string{}, Sync: map[string]json.RawMessage{}}
	// dnat: the backends answer the client, and must answer through the
	// node that forwarded (docs/ha.md): each connection's replies follow
	// the LB its last packet came from.
	// snat with a shared source address: the same, since the address is
	// every node's. dsr: the backends answer clients through a router of
	// their own, as in a real network.
	topo := testutil.NewHATopology(t, testutil.HAOptions{LBs: 2, Backends: 3,
		SymmetricReturn: o.Mode == "dnat" || o.SharedSNAT, ReturnViaRouter: o.Mode == "dsr"})
	bird := topo.StartBIRD(t, testutil.BIRDOptions{Peers: 3})
	_ = bird
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	// dsr: the backends hold the VIP and answer the client directly.
	// stlsdnat: they listen on their own address, and any node turns
	// their replies' source back into the VIP (stateless both ways).
	stateless := o.Mode == "dsr"
	for i, b := range topo.Backends {
		if stateless {
			testutil.Run(t, b.Name, "ip", "addr", "add", vip.Addr().String()+"/32", "dev", "lo")
			testutil.StartTCPServer(t, b.NS, vip, fmt.Sprintf("backend-%d", i+1))
		} else {
			testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), fmt.Sprintf("backend-%d", i+1))
		}
	}
	keyFile := filepath.Join(t.TempDir(), "sync.key")
	os.WriteFile(keyFile, []byte("failover-sync-key-0123456789\n"), 0o600)
	// The same state on every node (as xlb restore from the operator's
	// tooling would put it); maglev, so that a flow moved to another
	// node finds the same backend there even without state.
	var state strings.Builder
	src := ""
	if o.SharedSNAT {
		src = fmt.Sprintf(`"source-addr":"%s",`, sharedSNAT)
	}
	fmt.Fprintf(&state, `{"farms":[{"name":"web","family":"ipv4","virtual-addr":"%s","virtual-ports":"80","protocol":"tcp","mode":"%s",%s"scheduler":"maglev","backends":[`, vip.Addr(), o.Mode, src)
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

	// eBPF: each node pins its program on a bpffs of its own that
	// outlives the daemon, as on a real node (under `ip netns exec` the
	// daemon's own mount of /sys/fs/bpf dies with it, and the program
	// with it: a kill -9 would then take the node's data plane too, and
	// the replies still routed to it would go untranslated).
	pins := map[int]string{}
	nodeArgs := func(lb *testutil.LBNode) []string {
		args := []string{"--dataplane", o.Plane}
		if o.Plane == "ebpf" {
			if pins[lb.Index] == "" {
				pins[lb.Index] = mountBPFFS(t)
			}
			args = append(args, "--pin-path", pins[lb.Index])
		}
		if o.SharedSNAT {
			// Disjoint source ports: node i takes 20000+10000i to
			// 29999+10000i.
			first := 20000 + 10000*lb.Index
			args = append(args, "--snat-ports", fmt.Sprintf("%d-%d", first, first+9999))
		}
		if o.Sync {
			var peers []string
			for i := range 3 {
				if i != lb.Index {
					peers = append(peers, fmt.Sprintf("10.101.0.%d:7000", 11+i))
				}
			}
			args = append(args, "--sync-listen", lb.IPv4.String()+":7000", "--sync-peers", strings.Join(peers, ","),
				"--sync-key-file", keyFile, "--sync-wait", "5s")
		}
		return args
	}
	startNode := func(lb *testutil.LBNode) *haNode {
		if stateless {
			// dsr takes the VIP's packets at ingress; the route keeps
			// the node's kernel from answering for it.
			testutil.RunErr(lb.Name, "ip", "route", "replace", vip.Addr().String()+"/32", "dev", "eth0")
		}
		n := newHANodeState(t, topo, lb, stateFile, nodeArgs(lb)...)
		return n
	}
	nodes := []*haNode{startNode(topo.LBs[0]), startNode(topo.LBs[1])}
	topo.WaitNextHops(t, vip.Addr(), 2, 20*time.Second)

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
		c, err := testutil.DialTCP(topo.Client.NS, vip, 3*time.Second)
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
					broken(classify(err))
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
				_, err := testutil.AskTCP(topo.Client.NS, vip)
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
	t0 := time.Now()
	nodes[0].kill()
	if o.NodeLost {
		topo.SetLBLinks(t, 0, false)
	}
	topo.WaitNextHops(t, vip.Addr(), 1, 15*time.Second)
	res.RouteTimes["withdrawn"] = time.Since(t0).Round(time.Millisecond).String()
	time.Sleep(o.Phase)

	// back: the node returns (links up, daemon started: it announces
	// once it has its peers' state).
	phase.Store(2)
	t0 = time.Now()
	if o.NodeLost {
		topo.SetLBLinks(t, 0, true)
	}
	nodes[0].start()
	topo.WaitNextHops(t, vip.Addr(), 2, 20*time.Second)
	res.RouteTimes["re-added"] = time.Since(t0).Round(time.Millisecond).String()
	time.Sleep(o.Phase)

	// added: a third node. The backends route through it only once it
	// announces (it holds its peers' state by then).
	phase.Store(3)
	t0 = time.Now()
	lb2 := topo.AddLB(t)
	topo.SetReturnVia(t, 2, false)
	nodes = append(nodes, startNode(lb2))
	topo.WaitNextHops(t, vip.Addr(), 3, 20*time.Second)
	res.RouteTimes["added"] = time.Since(t0).Round(time.Millisecond).String()
	topo.SetReturnVia(t, 2, true)
	time.Sleep(o.Phase)

	cancel()
	wg.Wait()
	if o.Sync {
		for _, n := range nodes {
			if out, err := n.cli("sync"); err == nil {
				if i := strings.Index(out, "{"); i >= 0 {
					res.Sync[n.lb.Name[strings.LastIndex(n.lb.Name, "-")+1:]] = json.RawMessage(out[i:])
				}
			}
		}
	}
	return res
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
// lost, the same runs break connections (bench/results/ha.md).
func TestSyncFailover(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
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
		// mode/plane/sync|nosync/kill|lost; mode snat+shared: SharedSNAT
		f := strings.Split(spec, "/")
		if len(f) != 4 {
			t.Fatalf("XLB_HA_CASES: %q is not mode/plane/sync|nosync/kill|lost", spec)
		}
		mode, shared := strings.CutSuffix(f[0], "+shared")
		cases = append(cases, failoverOpts{Mode: mode, SharedSNAT: shared, Plane: f[1], Sync: f[2] == "sync", NodeLost: f[3] == "lost",
			Conns: conns, NewRate: 20, Phase: phase})
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s-%s-sync=%v-lost=%v-shared=%v", c.Mode, c.Plane, c.Sync, c.NodeLost, c.SharedSNAT)
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
