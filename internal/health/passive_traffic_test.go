package health

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// Passive checks with real traffic, on each data plane: of four backends
// one serves, one resets new connections (no server on its port), one
// resets them too, and one drops them (a blackhole: SYNs go unanswered).
// With failures 3 and max-ejected 50 %, two of the three broken ones are
// ejected after their third failure, never a third at the same time; an
// ejection ends after ejection-time, and a backend still broken is ejected
// again, for twice as long. The eBPF plane counts in its own conntrack,
// the nft plane from netfilter's conntrack events.
func TestPassiveEjectsWithTraffic(t *testing.T) {
	testutil.RequireRoot(t)
	topo := passiveTopology(t)
	dir, err := os.MkdirTemp("", "xlb-bpffs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH); os.Remove(dir) })
	dp, err := ebpf.New(context.Background(), quiet, ebpf.Options{NetNS: topo.LB.NS, PinPath: dir + "/xlb", ConnTableSize: 16384})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	passiveEjects(t, topo, dp)
}

func TestPassiveEjectsWithTrafficNft(t *testing.T) {
	testutil.RequireRoot(t)
	topo := passiveTopology(t)
	dp, err := nft.New(context.Background(), quiet, nft.Options{NetNS: topo.LB.NS})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	passiveEjects(t, topo, dp)
}

// passiveTopology: four backends, be0 and be3 serving on 8080, be1 and be2
// with nothing there, be3 dropping every SYN before its server gets it.
func passiveTopology(t *testing.T) *testutil.Topology {
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 4})
	testutil.StartTCPServer(t, topo.Backends[0].NS, netip.AddrPortFrom(topo.Backends[0].IPv4, 8080), "be0")
	testutil.StartTCPServer(t, topo.Backends[3].NS, netip.AddrPortFrom(topo.Backends[3].IPv4, 8080), "be3")
	testutil.Run(t, topo.Backends[3].Name, "nft", "add table inet bh; add chain inet bh in { type filter hook input priority 0 ; } ; add rule inet bh in tcp dport 8080 drop")
	return topo
}

// passivePlane is a data plane that counts handshakes.
type passivePlane interface {
	dataplane.Dataplane
	dataplane.PassiveReader
}

func passiveEjects(t *testing.T, topo *testutil.Topology, dp passivePlane) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eng, err := engine.New(ctx, quiet, dp, st)
	if err != nil {
		t.Fatal(err)
	}
	broker := events.NewBroker(1024)
	eng.SetEvents(broker)
	sub := broker.Subscribe(0, 1024)

	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	var bes []string
	for i, b := range topo.Backends {
		bes = append(bes, fmt.Sprintf(`{"name":"be%d","ip-addr":"%s","port":"8080"}`, i, b.IPv4))
	}
	fs, err := model.DecodeFarms([]byte(`{"name":"web","virtual-addr":"`+vip.Addr().String()+`","virtual-ports":"80",
		"check":{"passive":{"failures":"3","timeout":"200ms","ejection-time":"1500ms","max-ejected":"50%"}},
		"backends":[`+strings.Join(bes, ",")+`]}`), func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Change(ctx, func(tx *engine.Txn) error { return tx.Put(fs[0]) }); err != nil {
		t.Fatal(err)
	}
	x := NewEjector(quiet, eng, dp, 50*time.Millisecond)
	go x.Watch(ctx, eng)
	go x.Run(ctx)

	// ejected follows the events; it must never exceed 2 (50 % of 4).
	ejected := map[string]bool{}
	var seen []events.Event
	maxOut := 0
	drain := func() {
		for {
			select {
			case ev := <-sub.C:
				if ev.Kind != events.KindHealth {
					continue
				}
				seen = append(seen, ev)
				ejected[ev.Backend] = ev.State == engine.HealthEjected
				n := 0
				for _, e := range ejected {
					if e {
						n++
					}
				}
				maxOut = max(maxOut, n)
			default:
				return
			}
		}
	}
	try := func() error {
		c, err := testutil.DialTCP(topo.Client.NS, vip, 300*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	}
	// Connections until two backends are out: each broken one fails
	// every fourth connection at first.
	deadline := time.Now().Add(15 * time.Second)
	for tries := 0; time.Now().Before(deadline); tries++ {
		try()
		drain()
		n := 0
		for _, e := range ejected {
			if e {
				n++
			}
		}
		if n == 2 {
			t.Logf("two ejected after %d connections", tries+1)
			break
		}
	}
	if maxOut != 2 {
		t.Fatalf("ejected at most %d backends, want 2; events %+v", maxOut, seen)
	}
	for _, ev := range seen {
		if ev.State == engine.HealthEjected && !strings.Contains(ev.Reason, "consecutive connection failures") {
			t.Errorf("ejection reason %q", ev.Reason)
		}
		if ev.Backend == "be0" {
			t.Errorf("the serving backend was ejected: %+v", ev)
		}
	}
	f, _ := eng.Snapshot().Farm("web")
	hs, _ := eng.FarmHealth(f)
	for i, h := range hs {
		t.Logf("%s: %s %s", f.Backends[i].Name, h.State, h.EjectReason)
	}
	// The third broken backend stays in (max-ejected) and keeps failing;
	// keep the traffic going past the ejection time: the ejected ones
	// return, and are ejected again (for 3 s) as they still fail.
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		try()
		drain()
		time.Sleep(20 * time.Millisecond)
	}
	returned, again := 0, 0
	for _, ev := range seen {
		if ev.State == engine.HealthReturned {
			returned++
			if !strings.Contains(ev.Reason, "ejection of 1.5s over") {
				t.Errorf("return reason %q", ev.Reason)
			}
		}
		if ev.State == engine.HealthEjected && strings.HasSuffix(ev.Reason, "ejected for 3s") {
			again++
		}
	}
	if returned == 0 || again == 0 {
		t.Errorf("returns %d, second ejections %d; events %+v", returned, again, seen)
	}
	if maxOut > 2 {
		t.Errorf("ejected %d backends at once, max 2", maxOut)
	}
	// While two are out, the serving ones take the new connections: be0
	// always answers.
	st0, ok := x.PassiveStatus("web", "be0")
	if !ok || st0.Count.Successes == 0 || st0.Count.Failures() != 0 || st0.Ejected {
		t.Errorf("be0: %+v", st0)
	}
	st3, _ := x.PassiveStatus("web", "be3")
	st1, _ := x.PassiveStatus("web", "be1")
	if st3.Count.Timeouts == 0 || st1.Count.Resets == 0 {
		t.Errorf("be1 resets %d, be3 timeouts %d: %+v %+v", st1.Count.Resets, st3.Count.Timeouts, st1, st3)
	}
}
