package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestSyncPersistence: a persistent client whose connections BIRD's ECMP
// spreads over two nodes (each new connection another 5-tuple, so either
// node) keeps one backend when the nodes synchronise its persistence
// session, and gets one per node without; on both planes (eBPF: the
// program's records; nft: a poll of the farms' persistence maps). The farm
// is snat (each node's own source address, so the backends' answers say
// which node carried a connection) with rr and persistence srcip; another
// client address first makes one node's rr differ from the other's, so
// that without sync the two nodes pick different backends for the client.
// "mixed": the first node nft, the second eBPF, each installing the
// other's sessions.
func TestSyncPersistence(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf", "mixed"} {
		for _, sync := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sync=%v", plane, sync), func(t *testing.T) {
				backends, nodes := persistAcrossNodes(t, plane, sync)
				if len(nodes) < 2 {
					t.Fatalf("the client's connections all went through %v: ECMP did not spread them", nodes)
				}
				if sync && len(backends) != 1 {
					t.Errorf("with sync the persistent client reached %d backends %v through nodes %v, want one", len(backends), backends, nodes)
				}
				if !sync && len(backends) < 2 {
					t.Errorf("without sync the client reached only %v through nodes %v: the test cannot tell sync from none", backends, nodes)
				}
			})
		}
	}
}

// persistAcrossNodes runs the scenario and returns the backends the
// client's connections reached and the nodes that carried them (each with
// its count).
func persistAcrossNodes(t *testing.T, plane string, sync bool) (backends, nodes map[string]int) {
	testutil.RequireRoot(t)
	o := failoverOpts{Mode: "snat", Plane: plane, Sync: sync, Scheduler: "rr", Persistence: "srcip"}
	vip := netip.MustParseAddrPort("10.99.0.1:80")
	c := newECMPCluster(t, o, vip)
	if sync {
		for _, nd := range c.nodes {
			waitFor(t, nd.lb.Name+" sync connected", 20*time.Second, func() bool {
				out, err := nd.cli("sync")
				return err == nil && strings.Contains(out, "ready true") && strings.Contains(out, "connected")
			})
		}
	}
	// Another client, once: one node schedules it (its rr moves on), the
	// other does not.
	other := netip.MustParseAddr("10.100.0.50")
	testutil.Run(t, c.topo.Client.Name, "ip", "addr", "add", other.String()+"/24", "dev", "eth0")
	if _, err := testutil.AskTCPFrom(c.topo.Client.NS, netip.AddrPortFrom(other, 0), vip); err != nil {
		t.Fatalf("the other client: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // its session reaches the peer
	backends, nodes = map[string]int{}, map[string]int{}
	for i := range 24 {
		reply, err := testutil.AskTCPFrom(c.topo.Client.NS, netip.AddrPortFrom(c.topo.Client.IPv4, 0), vip)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		name, from, err := testutil.ParseReply(reply)
		if err != nil {
			t.Fatal(err)
		}
		backends[name]++
		nodes[from.Addr().String()]++
		// A session made at one node reaches the other within ~10 ms
		// on the eBPF plane (the reader's batch), within the poll's
		// second on nft: the client's next connections wait longer,
		// as a person's would.
		if i == 0 {
			time.Sleep(1500 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("backends %v, through nodes %v", backends, nodes)
	return backends, nodes
}
