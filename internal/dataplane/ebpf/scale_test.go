package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestTrafficManyFarms: more farms than the 16,383 generation ids the
// program once had (a Kubernetes cluster of 10,000 Services with NodePorts
// needs more): 20,000 farms, one port each on one VIP, all in the kernel,
// and the first, a middle and the last carry real traffic; then every
// farm changes at once (old and new generations alive together until the
// next change) and the last still answers.
func TestTrafficManyFarms(t *testing.T) {
	topo, p, _ := trafficSetup(t)
	const n = 20000
	vip := testutil.VIP4(9)
	be := backendsOf(topo, 8080)
	farms := make([]*model.Farm, 0, n)
	for i := range n {
		farms = append(farms, farm(t, fmt.Sprintf("f%05d", i), vip.String(), uint16(10000+i), model.ProtoTCP, model.ModeDNAT, model.SchedRR, be[i%len(be)]))
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatalf("reconcile %d farms: %v", n, err)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		addr := netip.AddrPortFrom(vip, uint16(10000+i))
		got, err := testutil.AskTCP(topo.Client.NS, addr)
		if err != nil {
			t.Fatalf("farm %d of %d (%s): %v", i+1, n, addr, err)
		}
		if name, _, _ := testutil.ParseReply(got); name != fmt.Sprintf("be%d", i%len(be)) {
			t.Errorf("farm %d answered by %s, want be%d", i+1, name, i%len(be))
		}
	}
	// Every farm to its next backend: each gets a new generation while
	// the old ones wait to be freed.
	for i, f := range farms {
		f.Backends[0].Addr = netip.MustParseAddrPort(be[(i+1)%len(be)]).Addr()
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatalf("change %d farms: %v", n, err)
	}
	last := netip.AddrPortFrom(vip, uint16(10000+n-1))
	got, err := testutil.AskTCP(topo.Client.NS, last)
	if err != nil {
		t.Fatalf("last farm after the change: %v", err)
	}
	if name, _, _ := testutil.ParseReply(got); name != fmt.Sprintf("be%d", n%len(be)) {
		t.Errorf("last farm after the change answered by %s, want be%d", name, n%len(be))
	}
}
