package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/conntrack"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// syncCostResult is one run of TestSyncCost.
type syncCostResult struct {
	Engine string `json:"engine"` // xlb, conntrackd-direct, conntrackd-cache
	Conns  int    `json:"conns"`
	// Until the receiving node's kernel (conntrackd-cache: its external
	// cache) holds every connection, from the first one made.
	Wall string `json:"wall"`
	// CPU time of the sync processes (user+system), less what they
	// spend idle over as long, per connection, on the sending and the
	// receiving node.
	SendNsPerConn float64 `json:"send-ns-per-conn"`
	RecvNsPerConn float64 `json:"recv-ns-per-conn"`
	// conntrackd-cache: conntrackd -c on the receiving node (its CPU per
	// connection, and until the kernel holds them all).
	CommitNsPerConn float64 `json:"commit-ns-per-conn,omitempty"`
	CommitWall      string  `json:"commit-wall,omitempty"`
	// Build is what was measured (XLB_SYNC_COST_BUILD: bench/ha/run.sh
	// writes the date and the commit); the report keeps builds apart.
	Build string `json:"build,omitempty"`
}

// TestSyncCost compares what connection sync costs per connection with
// xlb's own (the nft plane's ctnetlink syncer and connsync, two xlb
// daemons) and with conntrackd (FTFW over UDP, two conntrackd, with the
// backup injecting straight into its kernel, or keeping an external cache
// committed on demand, conntrackd's default), on the same load: Conns
// dnat entries to an xlb VIP appear in node A's conntrack (the test
// installs them over ctnetlink, 256 a batch, as fast as the kernel takes
// them, as the master's traffic would make them), and the sync processes
// carry them into node B. Measured: the CPU time of the sync processes of
// A and B (/proc/PID/stat) from the first entry until B holds all, less
// their CPU over an idle period as long. XLB_SYNC_COST=FILE runs it and
// appends a JSON line per run (bench/ha/run.sh), labelled with
// XLB_SYNC_COST_BUILD; XLB_SYNC_COST_ENGINES picks engines
// (comma-separated).
func TestSyncCost(t *testing.T) {
	out := os.Getenv("XLB_SYNC_COST")
	if out == "" {
		t.Skip("set XLB_SYNC_COST=FILE to compare the sync engines' cost (bench/ha/run.sh)")
	}
	conns, _ := strconv.Atoi(os.Getenv("XLB_SYNC_COST_CONNS"))
	if conns <= 0 {
		conns = 20000
	}
	runs, _ := strconv.Atoi(os.Getenv("XLB_SYNC_COST_RUNS"))
	if runs <= 0 {
		runs = 1
	}
	engines := []string{"xlb", "conntrackd-direct", "conntrackd-cache"}
	if e := os.Getenv("XLB_SYNC_COST_ENGINES"); e != "" {
		engines = strings.Split(e, ",")
	}
	for r := range runs {
		for _, engine := range engines {
			t.Run(fmt.Sprintf("%s-%d", engine, r), func(t *testing.T) {
				res := syncCost(t, engine, conns)
				res.Build = os.Getenv("XLB_SYNC_COST_BUILD")
				b, _ := json.Marshal(res)
				t.Logf("%s", b)
				f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				f.Write(append(b, '\n'))
			})
		}
	}
}

func syncCost(t *testing.T, engine string, n int) syncCostResult {
	testutil.RequireRoot(t)
	topo := testutil.NewHATopology(t, testutil.HAOptions{LBs: 2, Backends: 1})
	a, b := topo.LBs[0], topo.LBs[1]
	vip := netip.MustParseAddrPort("10.99.0.1:80")
	var pa, pb int
	var ctB *testutil.Conntrackd
	switch engine {
	case "xlb":
		key := filepath.Join(t.TempDir(), "sync.key")
		os.WriteFile(key, []byte("sync-cost-key-0123456789\n"), 0o600)
		state := filepath.Join(t.TempDir(), "state.json")
		os.WriteFile(state, []byte(fmt.Sprintf(`{"farms":[{"name":"web","virtual-addr":"%s","virtual-ports":"80","mode":"dnat","backends":[{"name":"b","ip-addr":"%s","port":"8080"}]}]}`,
			vip.Addr(), topo.Backends[0].IPv4)), 0o644)
		var nodes []*haNode
		for _, lb := range []*testutil.LBNode{a, b} {
			peer := a
			if lb == a {
				peer = b
			}
			nd := newHANodeWith(t, topo, lb, xlbBinary(t), true, "--dataplane", "nft", "--sync-listen", lb.IPv4.String()+":7000",
				"--sync-peers", peer.IPv4.String()+":7000", "--sync-key-file", key, "--sync-wait", "3s")
			nd.mustCLI("restore", "-f", state)
			nodes = append(nodes, nd)
		}
		for _, nd := range nodes {
			waitFor(t, nd.lb.Name+" sync connected", 20*time.Second, func() bool {
				out, err := nd.cli("sync")
				return err == nil && strings.Contains(out, "ready true") && strings.Contains(out, "connected")
			})
		}
		pa, pb = nodes[0].daemon.Process.Pid, nodes[1].daemon.Process.Pid
	case "conntrackd-direct", "conntrackd-cache":
		direct := engine == "conntrackd-direct"
		ctA := topo.StartConntrackd(t, a, b, direct)
		ctB = topo.StartConntrackd(t, b, a, direct)
		time.Sleep(time.Second)
		pa, pb = ctA.Pid(), ctB.Pid()
		if direct {
			ctB = nil
		}
	default:
		t.Fatalf("engine %q", engine)
	}

	// Idle: what the processes spend doing nothing for as long as a run.
	const idle = 3 * time.Second
	ia0, ib0 := cpuTime(t, pa), cpuTime(t, pb)
	time.Sleep(idle)
	idleA, idleB := cpuTime(t, pa)-ia0, cpuTime(t, pb)-ib0

	base := conntrackCount(t, b)
	ca0, cb0 := cpuTime(t, pa), cpuTime(t, pb)
	t0 := time.Now()
	installer := &conntrack.Syncer{}
	err := testutil.Do(a.NS, func() error {
		evs := make([]dataplane.ConnEvent, 0, 256)
		for i := 0; i < n; i += 256 {
			evs = evs[:0]
			for j := i; j < min(i+256, n); j++ {
				c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 100, byte(j >> 8), byte(j)}), uint16(20000+j%40000))
				evs = append(evs, dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: dataplane.SyncConn{Proto: unix.IPPROTO_TCP,
					Client: c, VIP: vip, Backend: netip.AddrPortFrom(topo.Backends[0].IPv4, 8080), Reply: c,
					Timeout: 600, TCPState: 3}})
			}
			if k, err := installer.InstallConns(context.Background(), evs); err != nil || k != len(evs) {
				return fmt.Errorf("installed %d of %d in %s: %v", k, len(evs), a.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	arrived := func() int {
		if ctB != nil {
			c, err := ctB.ExternalCache()
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		return conntrackCount(t, b) - base
	}
	for got := 0; got < n; got = arrived() {
		if time.Since(t0) > 2*time.Minute {
			t.Fatalf("%s: %d of %d connections on %s after 2 minutes", engine, got, n, b.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wall := time.Since(t0)
	ca1, cb1 := cpuTime(t, pa), cpuTime(t, pb)
	scale := float64(wall) / float64(idle)
	res := syncCostResult{Engine: engine, Conns: n, Wall: wall.Round(time.Millisecond).String(),
		SendNsPerConn: (float64(ca1-ca0) - scale*float64(idleA)) / float64(n),
		RecvNsPerConn: (float64(cb1-cb0) - scale*float64(idleB)) / float64(n)}
	if ctB != nil {
		c0, t1 := cpuTime(t, pb), time.Now()
		if _, err := ctB.Command("-c"); err != nil {
			t.Fatal(err)
		}
		for conntrackCount(t, b)-base < n {
			if time.Since(t1) > time.Minute {
				t.Fatalf("commit: %d of %d connections in %s's kernel after a minute", conntrackCount(t, b)-base, n, b.Name)
			}
			time.Sleep(20 * time.Millisecond)
		}
		res.CommitWall = time.Since(t1).Round(time.Millisecond).String()
		res.CommitNsPerConn = float64(cpuTime(t, pb)-c0) / float64(n)
	}
	return res
}

// cpuTime is a process's user and system CPU time so far (all threads).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command's closing parenthesis: state is the
	// first, utime the 12th, stime the 13th (proc(5)).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	// USER_HZ is 100 on Linux.
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// conntrackCount is the number of entries in lb's conntrack table.
func conntrackCount(t *testing.T, lb *testutil.LBNode) int {
	t.Helper()
	var n int
	err := testutil.Do(lb.NS, func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			return err
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
