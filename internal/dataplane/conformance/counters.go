package conformance

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// Reopen closes the plane dp opened on netnsPath and opens it again as a
// restarted daemon does (same pins, same tables), returning the new one;
// the suite then reconciles it with the farms it had.
type Reopen func(t testing.TB, dp dataplane.Dataplane, netnsPath string) dataplane.Dataplane

// udpFlow sends n datagrams of one flow (one socket) to addr from the
// client, each after the answer to the one before, and returns the bytes
// of the IP packets sent and received.
func udpFlow(t *testing.T, e *Env, addr netip.AddrPort, n int) (string, uint64, uint64) {
	t.Helper()
	var c *net.UDPConn
	if err := testutil.Do(e.Client.NS, func() error {
		var err error
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const ipUDP = 20 + 8 // IPv4 and UDP headers
	payload := []byte("counted datagram")
	var in, out uint64
	buf := make([]byte, 2048)
	backend := ""
	for i := range n {
		c.SetDeadline(time.Now().Add(testutil.DefaultTimeout))
		if _, err := c.Write(payload); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		m, err := c.Read(buf)
		if err != nil {
			t.Fatalf("answer to datagram %d: %v", i, err)
		}
		name, _ := parse(t, string(buf[:m]))
		if backend != "" && name != backend {
			t.Fatalf("one flow answered by %s and %s", backend, name)
		}
		backend = name
		in += uint64(len(payload) + ipUDP)
		out += uint64(m + ipUDP)
	}
	return backend, in, out
}

// RunCounters checks a plane's traffic counters (dataplane.CounterReader)
// with exact numbers: n datagrams of one UDP flow through a farm, each
// answered, raise the backend's and the farm's packets in and out by
// exactly n, their bytes by the packets' IP lengths, and their
// connections by one; the other backend's stay. The counts survive a
// restart of the plane (reopen, then Reconcile), and count on from there.
func RunCounters(t *testing.T, p Plane, reopen Reopen) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	e := newEnv(t, p, scenario{name: "counters", backends: 2})
	f := e.farmOn("udp", testutil.VIP4(1), VPort, model.ProtoUDP)
	e.Put(t, f)
	vip := netip.AddrPortFrom(testutil.VIP4(1), VPort)
	read := func(dp dataplane.Dataplane) dataplane.FarmCounters {
		t.Helper()
		cr, ok := dp.(dataplane.CounterReader)
		if !ok {
			t.Fatalf("%s keeps no counters (dataplane.CounterReader)", p.Name)
		}
		c, err := cr.Counters(ctx, &f)
		if err != nil {
			t.Fatalf("read counters: %v", err)
		}
		if len(c.Backends) != 2 {
			t.Fatalf("counters of %d backends, want 2: %+v", len(c.Backends), c)
		}
		// The read of every farm at once (the rate estimator's and a
		// scrape's) gives the same.
		if br, ok := dp.(dataplane.BulkCounterReader); ok {
			all, err := br.AllCounters(ctx, []*model.Farm{&f})
			if err != nil {
				t.Fatalf("read all counters: %v", err)
			}
			if len(all) != 1 || all[0].Counters != c.Counters || !slices.Equal(all[0].Backends, c.Backends) {
				t.Fatalf("all farms' counters %+v, the farm's %+v", all, c)
			}
		}
		return c
	}
	before := read(e.DP)
	const n = 100
	name, inBytes, outBytes := udpFlow(t, e, vip, n)
	after := read(e.DP)
	check := func(what string, before, after dataplane.FarmCounters, served string, conns, pkts, in, out uint64) {
		t.Helper()
		want := dataplane.Counters{Connections: conns, InPackets: pkts, OutPackets: pkts, InBytes: in, OutBytes: out}
		diff := func(a, b dataplane.Counters) dataplane.Counters {
			return dataplane.Counters{Connections: b.Connections - a.Connections, InPackets: b.InPackets - a.InPackets,
				OutPackets: b.OutPackets - a.OutPackets, InBytes: b.InBytes - a.InBytes, OutBytes: b.OutBytes - a.OutBytes}
		}
		if got := diff(before.Counters, after.Counters); got != want {
			t.Errorf("%s: farm counters rose by %+v, want %+v", what, got, want)
		}
		for i, b := range after.Backends {
			got := diff(before.Backends[i].Counters, b.Counters)
			w := dataplane.Counters{}
			if b.Name == served {
				w = want
			}
			if got != w {
				t.Errorf("%s: backend %s's counters rose by %+v, want %+v (%s answered)", what, b.Name, got, w, served)
			}
		}
	}
	check("one flow", before, after, name, 1, n, inBytes, outBytes)

	// A flow without answers (nothing listens on the backend's port) is
	// one connection however many datagrams it sends.
	quiet := e.farmOn("quiet", testutil.VIP4(2), VPort, model.ProtoUDP)
	quiet.Backends = quiet.Backends[:1]
	quiet.Backends[0].Port = 9
	e.Put(t, quiet)
	cr := e.DP.(dataplane.CounterReader)
	q0, err := cr.Counters(ctx, &quiet)
	if err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	if err := testutil.Do(e.Client.NS, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(testutil.VIP4(2), VPort))
	for i := range n {
		if _, err := pc.WriteTo([]byte("unanswered"), to); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
	}
	pc.Close()
	var q1 dataplane.FarmCounters
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if q1, err = cr.Counters(ctx, &quiet); err != nil {
			t.Fatal(err)
		}
		if q1.InPackets-q0.InPackets >= n || time.Now().After(deadline) {
			break
		}
	}
	if c, p := q1.Connections-q0.Connections, q1.InPackets-q0.InPackets; c != 1 || p != n || q1.OutPackets != q0.OutPackets {
		t.Errorf("unanswered flow of %d datagrams: %d connections, %d packets in, %d out; want 1, %d, 0",
			n, c, p, q1.OutPackets-q0.OutPackets, n)
	}

	// A restart keeps the counts, and counting goes on.
	dp := reopen(t, e.DP, "/run/netns/"+e.LB.Name)
	e.DP = dp
	nf, nq := f.Clone(), quiet.Clone()
	if err := dp.Reconcile(ctx, []*model.Farm{&nf, &nq}); err != nil {
		t.Fatalf("reconcile after the restart: %v", err)
	}
	kept := read(dp)
	if kept.Counters != after.Counters {
		t.Errorf("counters after the restart %+v, before it %+v", kept.Counters, after.Counters)
	}
	name2, in2, out2 := udpFlow(t, e, vip, n)
	check("one flow after the restart", kept, read(dp), name2, 1, n, in2, out2)
}
