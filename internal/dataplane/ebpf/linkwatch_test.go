package ebpf

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// waitPin waits (at most 3 s) until the pin of interface name's link
// exists (want) or not.
func waitPin(t *testing.T, pin, name string, want bool) {
	t.Helper()
	path := filepath.Join(pin, "link_ingress_"+name)
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, err := os.Stat(path)
		if (err == nil) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("link pin of %s: exists=%v, want %v", name, err == nil, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttachNewLinks: interfaces created after the plane started (a Pod's
// veth) are served without a restart; with --interfaces patterns, only the
// interfaces that match; links of deleted interfaces are dropped.
func TestAttachNewLinks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ifaces []string
		late   string // the new client's veth in the LB namespace
		served bool
	}{
		{"every interface", nil, "pod0", true},
		{"pattern matches", []string{"eth0", "be*", "lxc*"}, "lxc0", true},
		{"pattern does not match", []string{"eth0", "be*", "lxc*"}, "pod0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := trafficTopology(t)
			pin := mountBPFFS(t)
			p, err := New(context.Background(), testLogger(t), Options{NetNS: topo.LB.NS, Interfaces: tc.ifaces, PinPath: pin, ConnTableSize: 16384})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			vip := netip.AddrPortFrom(testutil.VIP4(31), 80)
			f := farm(t, "web", vip.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)...)
			if err := p.Reconcile(context.Background(), []*model.Farm{f}); err != nil {
				t.Fatal(err)
			}
			late := topo.AddClient(t, tc.late, netip.MustParsePrefix("10.101.0.0/24"))
			waitPin(t, pin, tc.late, tc.served)
			if !tc.served {
				// Not selected: the VIP is not balanced there (the LB
				// namespace has no route to it).
				if s, err := testutil.AskTCP(late.NS, vip); err == nil {
					t.Fatalf("an interface outside --interfaces was served: %q", s)
				}
				return
			}
			const n = 9
			counts := ask(t, n, func() (string, error) { return testutil.AskTCP(late.NS, vip) }, late.IPv4)
			checkSpread(t, counts, n, 3)
			// The namespace (and its veth) goes: so does the link.
			if err := testutil.DeleteLink(topo.LB.NS, tc.late); err != nil {
				t.Fatal(err)
			}
			waitPin(t, pin, tc.late, false)
			p.mu.Lock()
			_, held := p.links[tc.late]
			p.mu.Unlock()
			if held {
				t.Errorf("link of the deleted %s still held", tc.late)
			}
		})
	}
}
