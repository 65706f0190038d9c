package conformance

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// ConnTable returns what lists, deletes and counts the connections of the
// plane dp opened on netnsPath: dp itself (eBPF) or the kernel's conntrack
// read over netlink (nft). It must implement dataplane.ConnCounter too.
type ConnTable func(t testing.TB, dp dataplane.Dataplane, netnsPath string) dataplane.ConnLister

// connEnv is a topology of two backends with the plane on its LB, and
// what lists and counts the plane's connections.
func connEnv(t *testing.T, p Plane, table ConnTable, name string) (*Env, dataplane.ConnLister, dataplane.ConnCounter) {
	testutil.RequireRoot(t)
	e := newEnv(t, p, scenario{name: name, backends: 2})
	lister := table(t, e.DP, "/run/netns/"+e.LB.Name)
	counter, ok := lister.(dataplane.ConnCounter)
	if !ok {
		t.Fatalf("%T does not count connections (dataplane.ConnCounter)", lister)
	}
	return e, lister, counter
}

// RunConnections checks the connection listing of a plane with real
// traffic, as `ipvsadm -Lc` shows it: a TCP farm with held connections and
// a UDP farm, listed with protocol, state, client, VIP and backend,
// filtered by farm, backend and client, counted per backend as active
// (established TCP) and inactive connections, and a client's connections
// deleted.
func RunConnections(t *testing.T, p Plane, table ConnTable) {
	ctx := context.Background()
	e, lister, counter := connEnv(t, p, table, "connections")
	web := e.farmOn("web", testutil.VIP4(1), VPort, model.ProtoTCP)
	dns := e.farmOn("dns", testutil.VIP4(2), VPort, model.ProtoUDP)
	e.Put(t, web, dns)
	farms := []*model.Farm{&web, &dns}
	vipWeb := netip.AddrPortFrom(testutil.VIP4(1), VPort)
	vipDNS := netip.AddrPortFrom(testutil.VIP4(2), VPort)

	// Four held TCP connections (round robin: two per backend) and two
	// UDP flows.
	const held = 4
	byBackend := map[string]int{}
	clientPorts := map[uint16]string{}
	for range held {
		c, err := testutil.DialTCP(e.Client.NS, vipWeb, testutil.DefaultTimeout)
		if err != nil {
			t.Fatalf("dial %s: %v", vipWeb, err)
		}
		t.Cleanup(func() { c.Close() })
		line, err := testutil.ReadLine(c, testutil.DefaultTimeout)
		if err != nil {
			t.Fatalf("read from %s: %v", vipWeb, err)
		}
		name, _ := parse(t, line)
		byBackend[name]++
		clientPorts[uint16(c.LocalAddr().(*net.TCPAddr).Port)] = name
	}
	for range 2 {
		e.AskUDP(t, netip.AddrPort{}, vipDNS)
	}

	all, err := lister.Connections(ctx, farms, dataplane.ConnFilter{})
	if err != nil {
		t.Fatalf("list connections: %v", err)
	}
	var tcp, udp int
	for _, c := range all {
		switch c.Farm {
		case "web":
			tcp++
			if c.Protocol != 6 || c.State != "ESTABLISHED" || !c.Active {
				t.Errorf("web connection %+v: want TCP ESTABLISHED, active", c)
			}
			if c.Client.Addr() != e.Client.IPv4 || c.VIP != vipWeb {
				t.Errorf("web connection %+v: want client %s, VIP %s", c, e.Client.IPv4, vipWeb)
			}
			if want := clientPorts[c.Client.Port()]; c.BackendName != want {
				t.Errorf("connection from port %d: backend %q, but %q answered it", c.Client.Port(), c.BackendName, want)
			}
			if b, i := web.Backend(c.BackendName); i < 0 || c.Backend != netip.AddrPortFrom(b.Addr, BPort) {
				t.Errorf("web connection %+v: backend address does not match backend %q", c, c.BackendName)
			}
			// IPVS's established timeout is 15 min, netfilter's 5 days.
			if c.Expires <= 0 || c.Expires > 5*24*time.Hour {
				t.Errorf("web connection %+v: expiry %v, want within 5 days", c, c.Expires)
			}
		case "dns":
			udp++
			if c.Protocol != 17 || c.Active || c.VIP != vipDNS || !strings.HasPrefix(c.BackendName, "b") {
				t.Errorf("dns connection %+v: want UDP, inactive, to %s, a backend", c, vipDNS)
			}
		default:
			t.Errorf("connection of farm %q: %+v", c.Farm, c)
		}
	}
	if tcp != held || udp != 2 {
		t.Fatalf("listed %d TCP and %d UDP connections, want %d and 2: %+v", tcp, udp, held, all)
	}

	// Filters: by backend, by client, one farm only.
	for name, n := range byBackend {
		got, err := lister.Connections(ctx, []*model.Farm{&web}, dataplane.ConnFilter{Backend: name})
		if err != nil || len(got) != n {
			t.Errorf("connections of backend %s: %d (%v), want %d", name, len(got), err, n)
		}
	}
	other := netip.MustParseAddr("10.100.0.99")
	if got, err := lister.Connections(ctx, farms, dataplane.ConnFilter{Client: other}); err != nil || len(got) != 0 {
		t.Errorf("connections of client %s: %d (%v), want none", other, len(got), err)
	}
	if got, err := lister.Connections(ctx, []*model.Farm{&dns}, dataplane.ConnFilter{Client: e.Client.IPv4}); err != nil || len(got) != 2 {
		t.Errorf("dns connections of client %s: %d (%v), want 2", e.Client.IPv4, len(got), err)
	}

	// Counts per backend: the held TCP connections are active, UDP
	// flows inactive.
	ct, err := counter.CountConns(ctx, farms, nil)
	if err != nil {
		t.Fatalf("count connections: %v", err)
	}
	if ct.Entries < held+2 {
		t.Errorf("table entries %d, want at least %d", ct.Entries, held+2)
	}
	for i, b := range web.Backends {
		got := ct.Backends["web"]
		if len(got) != len(web.Backends) || got[i].Active != uint64(byBackend[b.Name]) || got[i].Inactive != 0 {
			t.Errorf("web counts %+v, want backend %s active %d, inactive 0", got, b.Name, byBackend[b.Name])
		}
	}
	var udpActive, udpInactive uint64
	for _, c := range ct.Backends["dns"] {
		udpActive += c.Active
		udpInactive += c.Inactive
	}
	if udpActive != 0 || udpInactive != 2 {
		t.Errorf("dns counts %+v, want 2 inactive in all", ct.Backends["dns"])
	}

	// Deleting the client's web connections leaves its UDP flows.
	n, err := lister.DeleteConnections(ctx, []*model.Farm{&web}, dataplane.ConnFilter{Client: e.Client.IPv4})
	if err != nil || n != held {
		t.Fatalf("delete the client's web connections: %d (%v), want %d", n, err, held)
	}
	left, err := lister.Connections(ctx, farms, dataplane.ConnFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range left {
		if c.Farm == "web" {
			t.Errorf("web connection left after deletion: %+v", c)
		}
	}
	if len(left) != 2 {
		t.Errorf("%d connections left, want the 2 UDP flows: %+v", len(left), left)
	}
}

// RunSourceTableConnections checks the listing, counts and deletion of
// the connections of two farms on one VIP, protocol and port, one chosen
// by source table (model.Farm.SourceTable), both with the same backends
// so that only the farm's own evidence tells their connections apart
// (plan.ConnOwners): each farm lists its own clients' connections only,
// counts only them, and deleting one farm's connections leaves the
// other's working.
func RunSourceTableConnections(t *testing.T, p Plane, table ConnTable) {
	ctx := context.Background()
	e, lister, counter := connEnv(t, p, table, "source-table-connections")
	c := e.ClientAddrs(t, 2)
	dflt := e.Farm("default-farm", model.ProtoTCP)
	src := e.Farm("src-farm", model.ProtoTCP)
	src.SourceTable = "src"
	ts := e.tablePlane(t)
	ts.put(t, "src", model.ListNone, c[1].String())
	ts.putFarm(t, e, src)
	e.Put(t, dflt)
	farms := []*model.Farm{&dflt, &src}
	owners := plan.NewConnOwners(farms, ts.tables)

	// Client 1 (in the table) holds two connections, client 0 one.
	held := map[netip.Addr][]net.Conn{}
	for _, a := range []netip.Addr{c[1], c[1], c[0]} {
		conn, err := testutil.DialTCPFrom(e.Client.NS, netip.AddrPortFrom(a, 0), e.vipPort(src), testutil.DefaultTimeout)
		if err != nil {
			t.Fatalf("connect from %s: %v", a, err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := testutil.ReadLine(conn, testutil.DefaultTimeout); err != nil {
			t.Fatalf("connection from %s: %v", a, err)
		}
		held[a] = append(held[a], conn)
	}
	want := map[string]netip.Addr{"src-farm": c[1], "default-farm": c[0]}
	wantN := map[string]int{"src-farm": 2, "default-farm": 1}
	check := func(stage string, got []dataplane.Conn, farm string) {
		t.Helper()
		n := 0
		for _, cn := range got {
			if farm != "" && cn.Farm != farm {
				t.Errorf("%s: connection of farm %q listed for %q: %+v", stage, cn.Farm, farm, cn)
				continue
			}
			if cn.Client.Addr() != want[cn.Farm] {
				t.Errorf("%s: farm %q lists a connection of client %s, want only %s's: %+v", stage, cn.Farm, cn.Client.Addr(), want[cn.Farm], cn)
			}
			n++
		}
		if farm != "" && n != wantN[farm] {
			t.Errorf("%s: %d connections of %q, want %d: %+v", stage, n, farm, wantN[farm], got)
		}
	}
	for _, f := range farms {
		got, err := lister.Connections(ctx, []*model.Farm{f}, dataplane.ConnFilter{Owners: owners})
		if err != nil {
			t.Fatalf("list %s: %v", f.Name, err)
		}
		check("farm "+f.Name+" alone", got, f.Name)
	}
	all, err := lister.Connections(ctx, farms, dataplane.ConnFilter{Owners: owners})
	if err != nil {
		t.Fatal(err)
	}
	check("both farms", all, "")
	if len(all) != 3 {
		t.Errorf("both farms: %d connections, want 3: %+v", len(all), all)
	}
	ct, err := counter.CountConns(ctx, farms, owners)
	if err != nil {
		t.Fatalf("count connections: %v", err)
	}
	for name, n := range wantN {
		var active uint64
		for _, cc := range ct.Backends[name] {
			active += cc.Active
		}
		if active != uint64(n) {
			t.Errorf("farm %s: %d active connections counted (%+v), want %d", name, active, ct.Backends[name], n)
		}
	}

	// Deleting the default farm's connections leaves the source farm's.
	if n, err := lister.DeleteConnections(ctx, []*model.Farm{&dflt}, dataplane.ConnFilter{Owners: owners}); err != nil || n != 1 {
		t.Fatalf("delete the default farm's connections: %d (%v), want 1", n, err)
	}
	left, err := lister.Connections(ctx, farms, dataplane.ConnFilter{Owners: owners})
	if err != nil {
		t.Fatal(err)
	}
	wantN["default-farm"] = 0
	check("after deleting the default farm's", left, "")
	if len(left) != 2 {
		t.Errorf("after deleting the default farm's: %d connections, want client %s's 2: %+v", len(left), c[1], left)
	}
	for i, conn := range held[c[1]] {
		msg := fmt.Sprintf("still-%d", i)
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			t.Errorf("source farm's connection %d after the deletion: write: %v", i, err)
		} else if line, err := testutil.ReadLine(conn, testutil.DefaultTimeout); err != nil || line != msg {
			t.Errorf("source farm's connection %d after the deletion: echo %q, %v", i, line, err)
		}
	}
}
