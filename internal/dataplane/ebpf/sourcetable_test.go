package ebpf

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"

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

// TestSourceFarmSync: node A's flows and persistence sessions of a farm
// chosen by source table, installed at node B (connection sync), land on
// that farm at B, not on the key's default farm: the synced flow is bound
// to the source farm's service and counted active on its backend, and the
// clients' next connections at B go to the backends A's sessions chose
// (B's own round robin would have sent the client elsewhere).
func TestSourceFarmSync(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	client2 := netip.MustParseAddr("10.100.0.3")
	be3 := netip.MustParseAddr("10.200.0.13")
	src := addrTable(t, "src", model.ListNone, 5, 2, client.String(), client2.String())
	in := farm(t, "web-in", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.12:8080", "10.200.0.13:8080")
	in.SourceTable = "src"
	in.Persistence, in.PersistTTL = model.KeySrcIP, 300
	web := farm(t, "web", "10.99.0.1", 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, "10.200.0.11:8080")
	var planes [2]*Plane
	var nss [2]netns.NsHandle
	for i := range planes {
		nss[i] = fixtureNS(t)
		planes[i] = newPlane(t, nss[i], mountBPFFS(t), []string{"front", "back"}, 4096)
		d := created(src)
		d.Farms = []plan.FarmChange{{New: in}}
		applyTables(t, planes[i], d)
		if err := planes[i].Reconcile(ctx, []*model.Farm{web, in}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := planes[0], planes[1]
	sport := uint16(42000)
	send := func(i int, from netip.Addr, port uint16, flags uint8) netip.Addr {
		t.Helper()
		verdict, out := runProg(t, nss[i], planes[i].objs.XlbIngress, pktSpec{src: from, sport: port, dst: vip1, dport: 80,
			proto: protoTCP, tcpFlags: flags}.build())
		got, err := parse(out)
		if verdict != verdictRedirect || err != nil {
			t.Fatalf("packet from %s:%d at node %d: verdict %d, %v", from, port, i, verdict, err)
		}
		return got.dst
	}
	w := watchConns(ctx, t, a)
	// At A, rr over web-in's two backends: client2 first, then client.
	sport++
	first := send(0, client2, sport, tcpSYN)
	sport++
	cport := sport
	picked := send(0, client, cport, tcpSYN)
	if first == picked || (picked != be2 && picked != be3) {
		t.Fatalf("at A: client2 to %s, client to %s; want web-in's two backends", first, picked)
	}
	send(0, client, cport, tcpACK) // established
	got := w.settled(t, 5)
	w.end(t)
	if len(got) != 5 {
		t.Fatalf("A sent %d events, want 5 (2 new flows, 1 established, 2 sessions): %+v", len(got), got)
	}
	for _, ev := range got {
		if ev.Conn.VIP != netip.AddrPortFrom(vip1, 80) {
			t.Errorf("A's event %+v: VIP %s, want %s:80", ev.Kind, ev.Conn.VIP, vip1)
		}
	}
	if n, err := b.InstallConns(ctx, got); err != nil || n != 5 {
		t.Fatalf("install at B: %d of 5, %v", n, err)
	}
	// The client's flow at B: bound to web-in's service; the flows are
	// counted on its backends as at A.
	var v xlbCtVal
	if err := b.objs.XlbCt.Lookup(ctKey(client, cport, vip1, 80, protoTCP), &v); err != nil {
		t.Fatalf("B has no entry of the client's flow: %v", err)
	}
	key := xlbSvcKey{Addr: [4]uint32{ne32(vip1)}, Port: ne16(80), Proto: protoTCP, Family: afInet | b.srcs.tags["web-in"]<<svcTagShift}
	var sv xlbSvcVal
	if err := b.objs.XlbServices.Lookup(&key, &sv); err != nil {
		t.Fatalf("web-in's service at B: %v", err)
	}
	if v.Svc != sv.Id || v.Backend == 0 {
		t.Errorf("the client's synced flow at B: service %d backend %d, want web-in's service %d and a backend of it", v.Svc, v.Backend, sv.Id)
	}
	if act, want := sumActive(t, b), sumActive(t, a); act != want || act == 0 {
		t.Errorf("B counts %d active connections, want A's %d (web-in's flows, on its backends)", act, want)
	}
	// The clients' next connections at B follow A's sessions.
	sport++
	if got := send(1, client, sport, tcpSYN); got != picked {
		t.Errorf("client's new connection at B to %s, want %s (A's session of web-in)", got, picked)
	}
	sport++
	if got := send(1, client2, sport, tcpSYN); got != first {
		t.Errorf("client2's new connection at B to %s, want %s (A's session of web-in)", got, first)
	}
	if st, _ := b.Stats(); st["persist_hit"] != 2 {
		t.Errorf("B's persist_hit = %d, want 2", st["persist_hit"])
	}
}
