package ebpf

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestTrafficCountersAndLog: n TCP connections and n UDP flows through
// farms with log set. Every backend's counters show exactly the connections
// it answered, with packets and bytes both ways; the farm's are their sum;
// and each connection gave one log record naming its farm, its prefix and
// the backend that answered.
func TestTrafficCountersAndLog(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3})
	for i, b := range topo.Backends {
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), fmt.Sprintf("be%d", i))
		testutil.StartUDPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8053), fmt.Sprintf("be%d", i))
	}
	sink := newConnLogSink(testLogger(t).Handler())
	p, err := New(context.Background(), slog.New(sink), Options{NetNS: topo.LB.NS, PinPath: mountBPFFS(t), ConnTableSize: 16384})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })

	web := farm(t, "web", testutil.VIP4(1).String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR, backendsOf(topo, 8080)...)
	web.Log, web.LogPrefix = model.LogForward, "web-in"
	dns := farm(t, "dns", testutil.VIP4(2).String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8053)...)
	dns.Log = model.LogInput
	quiet := farm(t, "quiet", testutil.VIP4(3).String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, backendsOf(topo, 8080)...)
	if err := p.Reconcile(context.Background(), []*model.Farm{web, dns, quiet}); err != nil {
		t.Fatal(err)
	}
	// be<i> answers for backend b<i+1> (farm() names them b1..b3).
	beName := func(answer string) string { return fmt.Sprintf("b%c", answer[2]+1) }

	const n = 12
	for _, c := range []struct {
		f      *model.Farm
		askFn  func() (string, error)
		prefix string
	}{
		{web, func() (string, error) {
			return testutil.AskTCP(topo.Client.NS, netip.AddrPortFrom(testutil.VIP4(1), 80))
		}, "web-in"},
		{dns, func() (string, error) {
			return testutil.AskUDP(topo.Client.NS, netip.AddrPortFrom(testutil.VIP4(2), 53))
		}, "IN-dns "}, // nftlb's default prefix, TYPE-FNAME
	} {
		answered := map[string]uint64{}
		for i := range n {
			s, err := c.askFn()
			if err != nil {
				t.Fatalf("%s request %d: %v", c.f.Name, i, err)
			}
			name, _, err := testutil.ParseReply(s)
			if err != nil {
				t.Fatal(err)
			}
			be := beName(name)
			answered[be]++
			m, err := sink.wait("farm="+c.f.Name+" ", 2*time.Second)
			if err != nil {
				t.Fatalf("%s request %d: %v", c.f.Name, i, err)
			}
			if m["backend"] != be || m["prefix"] != c.prefix || m["vip"] != netip.AddrPortFrom(c.f.VirtualAddr, c.f.VirtualPorts[0].First).String() ||
				m["protocol"] != c.f.Protocol.String() {
				t.Errorf("%s request %d answered by %s: log record %v", c.f.Name, i, be, m)
			}
			if cl, err := netip.ParseAddrPort(m["client"]); err != nil || cl.Addr() != topo.Client.IPv4 {
				t.Errorf("%s request %d: log record client %q, want %s", c.f.Name, i, m["client"], topo.Client.IPv4)
			}
		}
		fc, err := p.Counters(context.Background(), c.f)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: answered %v, counters %+v", c.f.Name, answered, fc)
		if fc.Connections != n || len(fc.Backends) != 3 {
			t.Errorf("%s: %d connections over %d backends, want %d over 3", c.f.Name, fc.Connections, len(fc.Backends), n)
		}
		var sum dataplane.Counters
		for _, b := range fc.Backends {
			sum.Add(b.Counters)
			if b.Connections != answered[b.Name] {
				t.Errorf("%s backend %s: %d connections counted, %d answered", c.f.Name, b.Name, b.Connections, answered[b.Name])
			}
			// Each connection carries at least a request one way and an
			// answer the other; bytes are at least 20 (IP) + 8 per packet.
			if b.InPackets < b.Connections || b.OutPackets < b.Connections ||
				b.InBytes < 28*b.InPackets || b.OutBytes < 28*b.OutPackets {
				t.Errorf("%s backend %s: counters %+v", c.f.Name, b.Name, b.Counters)
			}
		}
		if sum != fc.Counters {
			t.Errorf("%s: farm counters %+v, sum of its backends %+v", c.f.Name, fc.Counters, sum)
		}
	}
	// A farm without log logs nothing, but counts.
	if _, err := testutil.AskTCP(topo.Client.NS, netip.AddrPortFrom(testutil.VIP4(3), 80)); err != nil {
		t.Fatal(err)
	}
	if m, err := sink.wait("farm=quiet ", 300*time.Millisecond); err == nil {
		t.Errorf("farm without log logged %v", m)
	}
	if fc, err := p.Counters(context.Background(), quiet); err != nil || fc.Connections != 1 {
		t.Errorf("quiet: counters %+v, %v; want 1 connection", fc, err)
	}

	// Removing a backend keeps the farm's totals (its counts are carried).
	before, _ := p.Counters(context.Background(), web)
	web2 := *web
	web2.Backends = web.Backends[1:]
	if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: web, New: &web2}}}); err != nil {
		t.Fatal(err)
	}
	// The old generation is freed at the next change.
	if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: quiet, New: nil}}}); err != nil {
		t.Fatal(err)
	}
	after, err := p.Counters(context.Background(), &web2)
	if err != nil {
		t.Fatal(err)
	}
	if after.Counters != before.Counters || len(after.Backends) != 2 {
		t.Errorf("after removing b1: farm counters %+v (%d backends), before %+v", after.Counters, len(after.Backends), before.Counters)
	}
	// A farm deleted and added again starts from zero.
	if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: &web2}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: web}}}); err != nil {
		t.Fatal(err)
	}
	if fc, err := p.Counters(context.Background(), web); err != nil || fc.Counters != (dataplane.Counters{}) {
		t.Errorf("farm deleted and added again: counters %+v, %v; want zero", fc.Counters, err)
	}
	st, _ := p.Stats()
	if st["log_lost"] != 0 {
		t.Errorf("log_lost %d", st["log_lost"])
	}
}
