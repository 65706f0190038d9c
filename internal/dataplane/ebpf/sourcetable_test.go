package ebpf

import (
	"context"
	"net/netip"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestSourceTableRestart runs SYNs through the tcx program
// (BPF_PROG_TEST_RUN): a client in the source table of "web-in" is sent to
// its backend, another to the default farm's, before a restart, on the
// restarted program before its daemon reconciles (the pinned maps steer
// alone), and after the reconcile (tags given anew, services rewritten).
func TestSourceTableRestart(t *testing.T) {
	testutil.RequireRoot(t)
	ns := fixtureNS(t)
	pin := mountBPFFS(t)
	p := newPlane(t, ns, pin, []string{"front"}, 4096)
	farms := fixtureFarms(t)
	web := farms[0].Clone()
	web.Backends = web.Backends[:1] // 10.200.0.11
	farms[0] = &web
	in := farm(t, "web-in", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.13:8080")
	in.SourceTable = "src"
	farms = append(farms, in)
	src := addrTable(t, "src", model.ListNone, 5, 2, client.String())
	d := created(src)
	d.Farms = []plan.FarmChange{{New: in}}
	applyTables(t, p, d)
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	sport := uint16(43000)
	check := func(q *Plane, what string) {
		t.Helper()
		for from, want := range map[netip.Addr]string{client: "10.200.0.13", other: "10.200.0.11"} {
			sport++
			pkt := pktSpec{src: from, dst: vip1, sport: sport, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build()
			v, out := runProg(t, ns, q.objs.XlbIngress, pkt)
			if v != verdictRedirect {
				t.Errorf("%s: SYN from %s: verdict %d, want redirect", what, from, v)
				continue
			}
			if dst := netip.AddrFrom4([4]byte(out[14+16 : 14+20])); dst.String() != want {
				t.Errorf("%s: SYN from %s sent to %s, want %s", what, from, dst, want)
			}
		}
	}
	check(p, "applied")
	p.Close()
	q := newPlane(t, ns, pin, []string{"front"}, 4096)
	check(q, "restarted, before reconcile")
	if err := q.ReconcileTables(context.Background(), []*model.Table{src}, []*model.Farm{in}); err != nil {
		t.Fatalf("reconcile tables: %v", err)
	}
	if err := q.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	check(q, "reconciled")
	// The source farm gone: everyone reaches the default farm.
	applyTables(t, q, plan.TableDiff{Farms: []plan.FarmChange{{Old: in}}})
	if err := q.Reconcile(context.Background(), farms[:len(farms)-1]); err != nil {
		t.Fatal(err)
	}
	sport++
	v, out := runProg(t, ns, q.objs.XlbIngress, pktSpec{src: client, dst: vip1, sport: sport, dport: 80, proto: protoTCP, tcpFlags: tcpSYN}.build())
	if dst := netip.AddrFrom4([4]byte(out[14+16 : 14+20])); v != verdictRedirect || dst != be1 {
		t.Errorf("source farm removed: verdict %d to %s, want redirect to %s", v, dst, be1)
	}
	if n, _ := countKeys(q.objs.XlbTblSteer); n != 0 {
		t.Errorf("xlb_tbl_steer keeps %d keys after its last source farm went", n)
	}
}
