package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// vrrpCluster is the LVS-style baseline of the failover benchmark: two
// xlb nodes on the nft plane in place of IPVS directors (IPVS is not in
// this kernel), active-backup: keepalived's VRRP holds the VIP (on the
// router side) and the backends' gateway (on the backend side) on the
// master and moves both to the backup when the master goes; with
// Conntrackd, conntrackd (FTFW) keeps the backup's copy of the master's
// conntrack table, which keepalived's notify script commits to the kernel
// on taking over (conntrackd's primary-backup.sh); with Sync, xlb's own
// sync keeps it (on either plane), which is how an LVS + keepalived pair
// moves to xlb keeping its VRRP. The router reaches the VIP on its LB
// segment (ARP, updated by keepalived's gratuitous ARPs).
type vrrpCluster struct {
	o     failoverOpts
	topo  *testutil.HATopology
	vip   netip.AddrPort
	nodes []*haNode
	vrrp  []*testutil.VRRPNode
	notes map[string]string
}

func newVRRPCluster(t *testing.T, o failoverOpts, vip netip.AddrPort) *vrrpCluster {
	if !o.NodeLost {
		t.Fatal("the VRRP baseline runs with the node lost only: keepalived killed alone leaves the VIP on the node")
	}
	if o.Mode != "dnat" && o.Mode != "snat" {
		t.Fatalf("the VRRP baseline runs modes dnat (LVS-NAT) and snat (from the floating gateway address), not %s", o.Mode)
	}
	topo := testutil.NewHATopology(t, testutil.HAOptions{LBs: 2, Backends: 3})
	startBackends(t, topo, o, vip)
	topo.SetBackendGateway(t, testutil.VRRPGateway4)
	testutil.Run(t, topo.Router.Name, "ip", "route", "replace", vip.Addr().String()+"/32", "dev", "lbs")
	extra := ""
	if o.Mode == "snat" {
		// The source the backends answer moves with the master.
		extra = fmt.Sprintf(`,"source-addr":"%s"`, testutil.VRRPGateway4)
	}
	stateFile := farmState(t, topo, o, vip, extra)
	c := &vrrpCluster{o: o, topo: topo, vip: vip, notes: map[string]string{}}
	keyFile := filepath.Join(t.TempDir(), "sync.key")
	for i, lb := range topo.LBs {
		args := []string{"--dataplane", o.Plane}
		if o.Plane == "ebpf" {
			// Pins that outlive the daemon (ecmpCluster.startNode).
			args = append(args, "--pin-path", mountBPFFS(t))
		}
		if o.Sync {
			args = append(args, syncArgs(t, lb, len(topo.LBs), keyFile)...)
		}
		n := newHANodeWith(t, topo, lb, xlbBinary(t), true, args...)
		n.mustCLI("restore", "-f", stateFile)
		c.nodes = append(c.nodes, n)
		c.vrrp = append(c.vrrp, topo.StartVRRP(t, lb, testutil.VRRPOptions{VIP: vip.Addr(), Priority: 150 - 50*i,
			AdvertInt: o.VRRPAdvert, Conntrackd: o.Conntrackd, Peer: topo.LBs[1-i]}))
	}
	c.vrrp[0].WaitState(t, "MASTER", 30*time.Second)
	c.vrrp[1].WaitState(t, "BACKUP", 10*time.Second)
	waitFor(t, "the VIP answering through the master", 10*time.Second, func() bool {
		_, err := testutil.AskTCP(topo.Client.NS, vip)
		return err == nil
	})
	return c
}

// hasAddr reports whether lb holds addr on link.
func hasAddr(lb *testutil.LBNode, link string, addr netip.Addr) bool {
	out, err := testutil.RunErr(lb.Name, "ip", "-o", "addr", "show", "dev", link)
	return err == nil && strings.Contains(out, " "+addr.String()+"/")
}

// lose: the master is lost (its daemons killed, its links down); the
// backup takes the VIP once it misses three advertisements.
func (c *vrrpCluster) lose(t *testing.T) time.Duration {
	if c.o.Conntrackd {
		if n, err := c.vrrp[1].CT.ExternalCache(); err == nil {
			c.notes["backup-external-cache-before"] = strconv.Itoa(n)
		} else {
			c.notes["backup-external-cache-before"] = err.Error()
		}
	}
	t0 := time.Now()
	c.nodes[0].kill()
	c.vrrp[0].Kill()
	c.topo.SetLBLinks(t, 0, false)
	for !hasAddr(c.topo.LBs[1], "eth0", c.vip.Addr()) {
		if time.Since(t0) > 30*time.Second {
			t.Fatalf("the backup has not taken the VIP after 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	d := time.Since(t0)
	// The notify script records MASTER once conntrackd has committed.
	c.vrrp[1].WaitState(t, "MASTER", 30*time.Second)
	c.notes["master-ready"] = time.Since(t0).Round(time.Millisecond).String()
	return d
}

// back: the lost node returns as it would after a restart, without the
// floating addresses its killed keepalived left; with nopreempt it stays
// the backup, and (with conntrackd) asks the master for its state.
func (c *vrrpCluster) back(t *testing.T) time.Duration {
	t0 := time.Now()
	lb := c.topo.LBs[0]
	testutil.RunErr(lb.Name, "ip", "addr", "del", c.vip.Addr().String()+"/32", "dev", "eth0")
	testutil.RunErr(lb.Name, "ip", "addr", "del", testutil.VRRPGateway4.String()+"/24", "dev", "eth1")
	c.topo.SetLBLinks(t, 0, true)
	c.nodes[0].start()
	c.vrrp[0].Start(t)
	c.vrrp[0].WaitState(t, "BACKUP", 30*time.Second)
	return time.Since(t0)
}

func (c *vrrpCluster) add(*testing.T) (time.Duration, bool) { return 0, false }

func (c *vrrpCluster) finish(res *failoverResult) {
	if c.o.Conntrackd {
		if n, err := c.vrrp[0].CT.ExternalCache(); err == nil {
			c.notes["returned-node-external-cache-at-end"] = strconv.Itoa(n)
		}
	}
	res.Notes = c.notes
}

// TestVRRPBaseline keeps the benchmark's LVS-style baseline working:
// keepalived and conntrackd from Debian in the LB namespaces, the master
// lost, the backup takes the VIP and commits conntrackd's copy; every
// long-lived connection opens, and new connections succeed once the
// backup holds the VIP. (What the baseline breaks is measured by
// bench/ha/run.sh, not asserted here.)
func TestVRRPBaseline(t *testing.T) {
	res := runFailover(t, failoverOpts{Mode: "dnat", Plane: "nft", NodeLost: true, Conns: 40, NewRate: 10,
		Phase: 3 * time.Second, Baseline: "vrrp", Conntrackd: true, Scheduler: "rr", VRRPAdvert: 200 * time.Millisecond})
	t.Logf("result: %+v", res)
	if res.Established != 40 {
		t.Fatalf("%d of 40 long-lived connections opened", res.Established)
	}
	if res.NewFailed["back"] != 0 || res.NewTotal["back"] == 0 {
		t.Fatalf("new connections after the takeover: %d of %d failed", res.NewFailed["back"], res.NewTotal["back"])
	}
	if n, err := strconv.Atoi(res.Notes["backup-external-cache-before"]); err != nil || n < 40 {
		t.Fatalf("the backup's conntrackd held %q of the master's connections, want at least 40", res.Notes["backup-external-cache-before"])
	}
}

// TestVRRPSync: an LVS + keepalived pair moved to xlb keeping its VRRP:
// keepalived moves the VIP and the backends' gateway, xlb's own connection
// sync (not conntrackd) gives the backup the master's connections, on both
// data planes. With round robin the backup would choose other backends for
// the master's flows without their state: none of the long-lived
// connections breaks when the master is lost (its daemons killed, its
// links down) or when it comes back, and new connections succeed once the
// backup holds the VIP.
func TestVRRPSync(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			res := runFailover(t, failoverOpts{Mode: "dnat", Plane: plane, NodeLost: true, Conns: 40, NewRate: 10,
				Phase: 3 * time.Second, Baseline: "vrrp", Sync: true, Scheduler: "rr", VRRPAdvert: 200 * time.Millisecond})
			t.Logf("result: %+v", res)
			if res.Established < 38 {
				t.Fatalf("%d of 40 long-lived connections opened", res.Established)
			}
			for _, p := range []string{"lost", "back"} {
				if res.Broken[p] != 0 {
					t.Errorf("phase %s: %d long-lived connections broken (%v)", p, res.Broken[p], res.BrokenHow)
				}
			}
			if res.NewFailed["back"] != 0 || res.NewTotal["back"] == 0 {
				t.Errorf("new connections after the takeover: %d of %d failed", res.NewFailed["back"], res.NewTotal["back"])
			}
		})
	}
}
