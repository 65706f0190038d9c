package conformance

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// Scenarios of farms chosen by source table (model.Farm.SourceTable): two
// farms on one VIP, protocol and port, the one whose table holds the
// client serving it, the other (the default) the rest.

// sourceTableFarm is a snat farm on the scenario's VIP and port chosen by
// the addr table "src", served by the topology's second backend only.
func sourceTableFarm(e *Env) model.Farm { return sourceFarm(e, model.ProtoTCP) }

func sourceTableFarmUDP(e *Env) model.Farm { return sourceFarm(e, model.ProtoUDP) }

func sourceFarm(e *Env, proto model.Protocol) model.Farm {
	f := e.Farm("src-farm", proto)
	f.SourceTable = "src"
	f.Backends = f.Backends[len(f.Backends)-1:]
	return f
}

// runSourceTable: the default farm (first backend) and the source farm
// (second backend) share the VIP and port; a client in the source table
// reaches the source farm's backend, another the default's. Entries
// changed, then the table swapped with another, steer the next
// connections at once.
func runSourceTable(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	dflt := e.Farm("default-farm", f.Protocol)
	dflt.Backends = dflt.Backends[:1]
	ts := e.tablePlane(t)
	ts.put(t, "src", model.ListNone, c[1].String())
	ts.put(t, "other", model.ListNone, c[0].String())
	ts.putFarm(t, e, f) // the source farm's tables' side first, as the engine does
	e.Put(t, dflt)
	e.expectBackend(t, f, "client 1 in src", map[netip.Addr]string{c[0]: "b0", c[1]: "b1"})
	var est net.Conn
	if f.Protocol == model.ProtoTCP {
		// A connection made now stays with its farm after the change.
		var err error
		if est, err = testutil.DialTCPFrom(e.Client.NS, netip.AddrPortFrom(c[1], 0), e.vipPort(f), 3*time.Second); err != nil {
			t.Fatalf("connect from %s: %v", c[1], err)
		}
		defer est.Close()
		if line, err := testutil.ReadLine(est, 3*time.Second); err != nil || !strings.HasPrefix(line, "b1") {
			t.Fatalf("established connection from %s: first line %q, %v; want backend b1", c[1], line, err)
		}
	}
	ts.put(t, "src", model.ListNone, c[0].String())
	e.expectBackend(t, f, "src now holds client 0", map[netip.Addr]string{c[0]: "b1", c[1]: "b0"})
	if est != nil {
		if _, err := est.Write([]byte("still-b1\n")); err != nil {
			t.Errorf("established connection after the table change: write: %v", err)
		} else if line, err := testutil.ReadLine(est, 3*time.Second); err != nil || line != "still-b1" {
			t.Errorf("established connection after the table change: echo %q, %v; want it kept by backend b1", line, err)
		}
	}
	ts.put(t, "src", model.ListNone)
	e.expectBackend(t, f, "src empty", map[netip.Addr]string{c[0]: "b0", c[1]: "b0"})
	ts.put(t, "src", model.ListNone, prefixOf(c[0], 24))
	ts.put(t, "other", model.ListNone, c[1].String())
	ts.swap(t, "src", "other")
	e.expectBackend(t, f, "swapped: src holds client 1", map[netip.Addr]string{c[0]: "b0", c[1]: "b1"})
	// A source farm that is down leaves its clients to the default farm.
	f.State = model.StateDown
	ts.putFarm(t, e, f)
	e.expectBackend(t, f, "source farm down", map[netip.Addr]string{c[0]: "b0", c[1]: "b0"})
}

// sourceTableOwnFarm is sourceTableFarm in mode dnat (its backend sees the
// client) with a per-client new-rtlimit of 2 a minute, burst 2.
func sourceTableOwnFarm(e *Env) model.Farm {
	f := sourceFarm(e, model.ProtoTCP)
	f.Mode = model.ModeDNAT
	f.NewRTLimit, f.NewRTUnit, f.NewRTBurst = 2, model.PerMinute, 2
	return f
}

// runSourceTableOwn: two farms on one key that differ in all but the key,
// each applying its own settings to its own clients only: the default farm
// (first backend) masquerades and logs, the source farm (second backend)
// is dnat and limits new connections. The source farm's client is seen by
// its backend as itself, logs nothing and is limited; the default farm's
// client is seen as the LB, logged and not limited.
func runSourceTableOwn(t *testing.T, e *Env, f model.Farm) {
	wait := e.logWaiter(t)
	c := e.ClientAddrs(t, 2)
	dflt := e.Farm("default-farm", f.Protocol)
	dflt.Backends = dflt.Backends[:1]
	dflt.Log, dflt.LogPrefix = model.LogForward, "own-dflt "
	ts := e.tablePlane(t)
	ts.put(t, "src", model.ListNone, c[1].String())
	ts.putFarm(t, e, f)
	e.Put(t, dflt)
	prefixes := plan.FarmLogPrefixes(&dflt)
	if len(prefixes) != 1 {
		t.Fatalf("the default farm's log prefixes: %q", prefixes)
	}
	ask := func(a netip.Addr) (string, netip.AddrPort) { return e.askFrom(e.Client.NS, a) } // f is on VIP():VPort
	// The source farm's client first (its burst of 2 covers this and
	// the retry), then the default's, whose log line must be the first.
	name, from := ask(c[1])
	if name != "b1" || from.Addr() != c[1] {
		t.Errorf("client %s (source farm, dnat): backend %q saw %s, want b1 seeing the client", c[1], name, from)
	}
	name, from = ask(c[0])
	if name != "b0" || from.Addr() != e.lbBack() {
		t.Errorf("client %s (default farm, snat): backend %q saw %s, want b0 seeing the LB's %s", c[0], name, from, e.lbBack())
	}
	entry, err := wait(prefixes[0], 3*time.Second)
	if err != nil {
		t.Fatalf("the default farm's log line: %v", err)
	}
	if entry.Src != c[0] {
		t.Errorf("first log line %q is of %s -> %s, want the default farm's client %s (the source farm does not log)", entry.Prefix, entry.Src, entry.Dst, c[0])
	}
	// The source farm's limit: of 8 quick connections from its client at
	// most the burst's 2 and one more are answered; the default farm's
	// client, right after, is not limited.
	ok := 0
	for range 8 {
		if e.quickTCPFrom(c[1], e.vipPort(f), 300*time.Millisecond) {
			ok++
		}
	}
	if ok > 3 {
		t.Errorf("client %s (source farm, new-rtlimit 2/minute burst 2): %d of 8 quick connections answered, want at most 3", c[1], ok)
	}
	ok = 0
	for range 8 {
		if e.quickTCPFrom(c[0], e.vipPort(f), time.Second) {
			ok++
		}
	}
	if ok != 8 {
		t.Errorf("client %s (default farm, no limit): %d of 8 connections answered, want 8", c[0], ok)
	}
	// Each farm's traffic counters count its own connections.
	cr, isReader := e.DP.(dataplane.CounterReader)
	if !isReader {
		return
	}
	for _, fc := range []struct {
		f       model.Farm
		at, min int
	}{{f, 0, 1}, {dflt, 0, 9}} {
		got, err := cr.Counters(context.Background(), &fc.f)
		if err != nil {
			t.Fatalf("counters of %s: %v", fc.f.Name, err)
		}
		if len(got.Backends) != 1 || got.Backends[fc.at].Connections < uint64(fc.min) || got.Connections != got.Backends[fc.at].Connections {
			t.Errorf("counters of %s: %d connections, backends %+v; want at least %d, all on its backend", fc.f.Name, got.Connections, got.Backends, fc.min)
		}
	}
}

// sourceTableHairpinFarm is sourceTableFarm in mode dnat.
func sourceTableHairpinFarm(e *Env) model.Farm {
	f := sourceFarm(e, model.ProtoTCP)
	f.Mode = model.ModeDNAT
	return f
}

// runSourceTableHairpin: the source farm (dnat, the second backend) holds
// its own backend as a client, as a Kubernetes Pod reaching its own
// Service through the Pods' farm; the default farm masquerades (the first
// backend). The backend that connects to the VIP and is given itself is
// masqueraded (hairpin: else it would answer itself and the connection
// never complete), another client of the source farm is not.
func runSourceTableHairpin(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 1)
	dflt := e.Farm("default-farm", f.Protocol)
	dflt.Backends = dflt.Backends[:1]
	self := e.Backends[1].Addr(false)
	ts := e.tablePlane(t)
	ts.put(t, "src", model.ListNone, self.String(), c[0].String())
	ts.putFarm(t, e, f)
	e.Put(t, dflt)
	if name, from := e.askFrom(e.Client.NS, c[0]); name != "b1" || from.Addr() != c[0] {
		t.Errorf("client %s (source farm, dnat): backend %q saw %s, want b1 seeing the client", c[0], name, from)
	}
	if name, from := e.askFrom(e.Backends[1].NS, self); name != "b1" || from.Addr() == self {
		t.Errorf("backend b1 (%s) to the VIP, in the source table: answered by %q seeing %s, want b1 seeing the LB's address (hairpin)", self, name, from)
	}
}

// runSourceTableFilters: the default farm (first backend) has a tight
// rst-rtlimit (1/s, burst 1), the source farm (second backend) none; the
// resets of the source farm's client close all its connections at once
// (the default farm's limit would drop all but about one).
func runSourceTableFilters(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 1)
	dflt := e.Farm("default-farm", f.Protocol)
	dflt.Backends = dflt.Backends[:1]
	dflt.RstRTLimit, dflt.RstRTBurst = 1, 1
	ts := e.tablePlane(t)
	ts.put(t, "src", model.ListNone, c[0].String())
	ts.putFarm(t, e, f)
	e.Put(t, dflt)
	const n = 15
	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		conn, err := testutil.DialTCPFrom(e.Client.NS, netip.AddrPortFrom(c[0], 0), e.vipPort(f), time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, conn.(*net.TCPConn))
		if line, err := testutil.ReadLine(conn, time.Second); err != nil || !strings.HasPrefix(line, "b1") {
			t.Fatalf("connection %d: first line %q, %v; want backend b1", i, line, err)
		}
	}
	if got := e.established(t, e.Backends[1]); got != n {
		t.Fatalf("backend b1 holds %d connections, want %d", got, n)
	}
	for _, conn := range conns {
		_ = conn.SetLinger(0) // close sends a reset
		conn.Close()
	}
	conns = nil
	time.Sleep(300 * time.Millisecond)
	if left := e.established(t, e.Backends[1]); left > 1 {
		t.Errorf("after %d resets from the source farm's client, b1 still holds %d connections: the default farm's rst-rtlimit dropped them", n, left)
	}
}

// queuedDefaultFarm is the default farm of a shared key (first backend)
// whose new connections go to nfqueue 7.
func queuedDefaultFarm(e *Env) model.Farm {
	f := e.Farm("default-farm", model.ProtoTCP)
	f.Backends = f.Backends[:1]
	f.Queue = 7
	return f
}

// runSourceTableQueue: what the default farm does to a new connection's
// first packet does not reach the connections the source table steers to
// another farm. The default farm's queue has a reader that drops every
// packet: its own clients are not served, the source farm's client is,
// and the reader never sees its packets. On nft the first packet met the
// default farm's filter chain before the choice labelled it, until that
// chain moved after the tables' (priority -150 -> -105).
func runSourceTableQueue(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	src := sourceFarm(e, model.ProtoTCP)
	ts := e.tablePlane(t)
	ts.put(t, "src", model.ListNone, c[1].String())
	ts.putFarm(t, e, src)
	e.Put(t, f)
	q := testutil.ListenNFQueue(t, e.LB.NS, 7)
	q.SetDrop(true)
	if e.answers(f, c[0], time.Second) {
		t.Errorf("client %s of the default farm was served past a queue reader that drops", c[0])
	}
	if err := q.WaitSeen(1, 2*time.Second); err != nil {
		t.Fatalf("the default farm's queue saw none of its client's packets: %v", err)
	}
	var got string
	for try := 0; try < 4 && got != "b1"; try++ {
		got = e.askBackend(model.ProtoTCP, netip.AddrPortFrom(c[1], 0), e.vipPort(f))
	}
	if got != "b1" {
		t.Errorf("client %s in the source table: answered by %q, want the source farm's b1", c[1], got)
	}
	for _, p := range q.Seen() {
		if p.Src == c[1] {
			t.Errorf("the default farm's queue saw the source farm's client's packet %+v", p)
			break
		}
	}
}

// askFrom asks the scenario's VIP:VPort over TCP from local in namespace
// ns and returns the backend's name and the address it saw.
func (e *Env) askFrom(ns netns.NsHandle, local netip.Addr) (string, netip.AddrPort) {
	to := netip.AddrPortFrom(e.VIP(), VPort)
	got, err := testutil.AskTCPFrom(ns, netip.AddrPortFrom(local, 0), to)
	if err != nil {
		return "error: " + err.Error(), netip.AddrPort{}
	}
	name, from, err := testutil.ParseReply(got)
	if err != nil {
		return "error: " + err.Error(), netip.AddrPort{}
	}
	return name, from
}

// expectBackend asks the farm's VIP and port over its protocol from each
// client and checks which backend answers (each a new connection, or a
// new UDP flow from a new source port). A wrong or missing answer is
// retried a few times: a changed table takes effect for the next new
// connection, and the first datagram from a fresh address may wait for
// neighbour discovery.
func (e *Env) expectBackend(t *testing.T, f model.Farm, what string, want map[netip.Addr]string) {
	t.Helper()
	to := e.vipPort(f)
	for a, name := range want {
		var got string
		for try := 0; try < 4 && got != name; try++ {
			if try > 0 {
				time.Sleep(200 * time.Millisecond)
			}
			got = e.askBackend(f.Protocol, netip.AddrPortFrom(a, 0), to)
		}
		if got != name {
			t.Errorf("%s: client %s reached %q, want backend %q", what, a, got, name)
		}
	}
}

// askBackend returns the name of the backend that answers one request, or the
// error's text.
func (e *Env) askBackend(proto model.Protocol, local, to netip.AddrPort) string {
	var got string
	var err error
	if proto == model.ProtoUDP {
		got, err = testutil.AskUDPFrom(e.Client.NS, local, to)
	} else {
		got, err = testutil.AskTCPFrom(e.Client.NS, local, to)
	}
	if err != nil {
		return "error: " + err.Error()
	}
	name, _, perr := testutil.ParseReply(got)
	if perr != nil {
		return "error: " + perr.Error()
	}
	return name
}
