package conformance

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

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
