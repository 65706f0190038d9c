package conformance

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// scenarios is the suite. Names are stable: planes refer to them in
// Plane.Refuses.
var scenarios = []scenario{
	{name: "snat-tcp-ipv4", backends: 2, farm: func(e *Env) model.Farm { return e.Farm("snat", model.ProtoTCP) }, run: runSNAT},
	{name: "snat-udp-ipv6", backends: 2, v6: true, farm: func(e *Env) model.Farm { return e.Farm("snat", model.ProtoUDP) }, run: runSNAT},
	{name: "dnat-tcp-ipv6", backends: 2, v6: true, farm: dnatFarm(model.ProtoTCP), run: runDNAT},
	{name: "dnat-udp-ipv4", backends: 2, farm: dnatFarm(model.ProtoUDP), run: runDNAT},
	{name: "sched-rr", backends: 3, farm: func(e *Env) model.Farm { return e.Farm("rr", model.ProtoTCP) }, run: runRR},
	{name: "sched-weight", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("weight", model.ProtoUDP)
		f.Scheduler = model.SchedWeight
		f.Backends[0].Weight, f.Backends[1].Weight = 1, 3
		return f
	}, run: runWeight},
	{name: "sched-lc", backends: 3, farm: func(e *Env) model.Farm {
		f := e.Farm("lc", model.ProtoTCP)
		f.Scheduler = model.SchedLC
		return f
	}, run: runLC},
	{name: "sched-hash-srcip", backends: 3, farm: weightedHashFarm(model.KeySrcIP), run: runHash},
	{name: "sched-hash-srcip-ipv6", backends: 3, v6: true, farm: weightedHashFarm(model.KeySrcIP), run: runHash},
	{name: "sched-hash-srcip-srcport", backends: 3, farm: weightedHashFarm(model.KeySrcIP | model.KeySrcPort), run: runHash},
	{name: "sched-hash-srcip-srcport-ipv6", backends: 3, v6: true, farm: weightedHashFarm(model.KeySrcIP | model.KeySrcPort), run: runHash},
	{name: "sched-hash-all-keys", backends: 3, farm: weightedHashFarm(model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort), run: runHash},
	{name: "sched-hash-srcmac", backends: 3, farm: hashFarm(model.SchedHash, model.KeySrcMAC), run: runSameBackend},
	{name: "sched-symhash", backends: 3, farm: hashFarm(model.SchedSymhash, model.KeySrcIP|model.KeySrcPort), run: runFlowHash},
	{name: "sched-maglev", backends: 5, farm: func(e *Env) model.Farm {
		f := e.Farm("maglev", model.ProtoUDP)
		f.Scheduler = model.SchedMaglev
		return f
	}, run: runMaglev},
	{name: "sched-maglev-ipv6", backends: 5, v6: true, farm: func(e *Env) model.Farm {
		f := e.Farm("maglev", model.ProtoUDP)
		f.Scheduler = model.SchedMaglev
		return f
	}, run: runMaglev},
	{name: "backend-priority", backends: 3, farm: func(e *Env) model.Farm {
		f := e.Farm("prio", model.ProtoTCP)
		f.Backends[2].Priority = 2
		return f
	}, run: runPriority},
	{name: "protocol-all", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("all", model.ProtoAll)
		f.VirtualPorts = nil
		for i := range f.Backends {
			f.Backends[i].Port = 0
		}
		return f
	}, run: runProtocolAll},
	{name: "protocol-sctp", backends: 2, farm: func(e *Env) model.Farm { return e.Farm("sctp", model.ProtoSCTP) }, run: runSCTP},
	{name: "backend-drain-down", backends: 3, farm: func(e *Env) model.Farm { return e.Farm("drain", model.ProtoTCP) }, run: runDrainDown},
	{name: "persistence-srcip", backends: 3, farm: persistFarm(model.KeySrcIP, model.ProtoTCP), run: runPersistence},
	{name: "persistence-srcip-ipv6", backends: 3, v6: true, farm: persistFarm(model.KeySrcIP, model.ProtoTCP), run: runPersistence},
	{name: "persistence-srcport", backends: 3, farm: persistFarm(model.KeySrcPort, model.ProtoUDP), run: runPersistence},
	{name: "persistence-srcmac", backends: 3, farm: persistFarm(model.KeySrcMAC, model.ProtoTCP), run: runPersistence},
	{name: "persistence-srcip-srcport", backends: 3, farm: persistFarm(model.KeySrcIP|model.KeySrcPort, model.ProtoUDP), run: runPersistence},
	{name: "persistence-srcip-dstport", backends: 3, farm: persistFarm(model.KeySrcIP|model.KeyDstPort, model.ProtoTCP), run: runPersistence},
	{name: "persistence-ttl", backends: 3, farm: func(e *Env) model.Farm {
		f := persistFarm(model.KeySrcIP, model.ProtoTCP)(e)
		f.PersistTTL = 1
		return f
	}, run: runPersistTTL},
	{name: "limit-new-rtlimit", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("rtlimit", model.ProtoUDP)
		f.NewRTLimit, f.NewRTBurst = 5, 5
		return f
	}, run: runNewRTLimit},
	{name: "limit-new-rtlimit-minute", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("rtlimitm", model.ProtoTCP)
		f.NewRTLimit, f.NewRTUnit, f.NewRTBurst = 300, model.PerMinute, 5
		return f
	}, run: runNewRTLimit},
	{name: "limit-new-rtlimit-farm-change", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("rtlimitc", model.ProtoTCP)
		f.NewRTLimit, f.NewRTUnit, f.NewRTBurst = 2, model.PerMinute, 2
		return f
	}, run: runNewRTLimitKept},
	{name: "limit-est-connlimit", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("connlimit", model.ProtoTCP)
		f.EstConnLimit = 3
		return f
	}, run: runEstConnLimit},
	{name: "limit-rst-rtlimit", backends: 1, farm: func(e *Env) model.Farm {
		f := e.Farm("rst", model.ProtoTCP)
		f.RstRTLimit, f.RstRTBurst = 5, 5
		return f
	}, run: runRstRTLimit},
	{name: "limit-backend-est-connlimit", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("bconnlimit", model.ProtoTCP)
		f.Backends[0].EstConnLimit = 2
		return f
	}, run: runBackendConnLimit},
	{name: "tcp-strict", backends: 1, farm: func(e *Env) model.Farm {
		f := e.Farm("strict", model.ProtoTCP)
		f.TCPStrict = true
		return f
	}, run: runTCPStrict},
	{name: "helper-ftp", backends: 1, farm: func(e *Env) model.Farm {
		f := e.farmOn("ftp", e.VIP(), ftpVPort, model.ProtoTCP)
		f.Backends[0].Port = ftpBPort
		f.Helper = model.HelperFTP
		return f
	}, run: runFTP},
	{name: "helper-tftp", backends: 1, farm: func(e *Env) model.Farm {
		f := e.farmOn("tftp", e.VIP(), tftpVPort, model.ProtoUDP)
		f.Backends[0].Port = tftpBPort
		f.Helper = model.HelperTFTP
		return f
	}, run: runTFTP},
	{name: "helper-sip", backends: 1, farm: helperFarm(model.HelperSIP, model.ProtoUDP), run: runHelperAttached},
	{name: "helper-amanda", backends: 1, farm: helperFarm(model.HelperAmanda, model.ProtoUDP), run: runHelperAttached},
	{name: "helper-h323", backends: 1, farm: helperFarm(model.HelperH323, model.ProtoTCP), run: runHelperAttached},
	{name: "helper-irc", backends: 1, farm: helperFarm(model.HelperIRC, model.ProtoTCP), run: runHelperAttached},
	{name: "helper-netbios-ns", backends: 1, farm: helperFarm(model.HelperNetbiosNS, model.ProtoUDP), run: runHelperAttached},
	{name: "helper-pptp", backends: 1, farm: helperFarm(model.HelperPPTP, model.ProtoTCP), run: runHelperAttached},
	{name: "helper-sane", backends: 1, farm: helperFarm(model.HelperSane, model.ProtoTCP), run: runHelperAttached},
	{name: "helper-snmp", backends: 1, farm: helperFarm(model.HelperSNMP, model.ProtoUDP), run: runHelperAttached},
	{name: "log", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("logged", model.ProtoTCP)
		f.Log, f.LogPrefix = model.LogInput|model.LogForward, "conf-KNAME-TYPE-FNAME "
		return f
	}, run: runLog},
	{name: "mark-backend", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("bmark", model.ProtoTCP)
		f.Backends[0].Mark = 0x100
		return f
	}, run: runBackendMark},
	{name: "fwmark-farm", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("fwmark", model.ProtoTCP)
		f.VirtualAddr, f.VirtualPorts, f.Mark = netip.Addr{}, nil, 7
		return f
	}, run: runFwmark},
	{name: "family-dual", backends: 2, farm: func(e *Env) model.Farm {
		// An IPv4 and an IPv6 VIP, each served by the backends of its
		// family (every backend namespace has an address of each).
		f := e.Farm("dual", model.ProtoTCP)
		f.Family, f.VirtualAddr2 = model.FamilyDual, testutil.VIP6(1)
		for i, b := range e.Backends {
			b6 := model.NewBackend(fmt.Sprintf("b%d-v6", i))
			b6.Addr, b6.Port = b.IPv6, BPort
			f.Backends = append(f.Backends, b6)
		}
		return f
	}, run: runDual},
	{name: "mode-dsr", backends: 1, farm: func(e *Env) model.Farm {
		f := e.Farm("dsr", model.ProtoTCP)
		f.Mode = model.ModeDSR
		// A data plane may pick a backend per packet in dsr (nft does,
		// at netdev ingress): a flow hash keeps a connection on one.
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		f.Backends[0].Port = VPort
		return f
	}, run: runDSR},
	{name: "mode-dsr-udp", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("dsr", model.ProtoUDP)
		f.Mode = model.ModeDSR
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		for i := range f.Backends {
			f.Backends[i].Port = 0
		}
		return f
	}, run: runDSR},
	{name: "mode-stlsdnat", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("stls", model.ProtoUDP)
		f.Mode = model.ModeStlsDNAT
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		return f
	}, run: runStateless},
	{name: "mode-stlsdnat-ipv6", backends: 2, v6: true, farm: func(e *Env) model.Farm {
		f := e.Farm("stls", model.ProtoUDP)
		f.Mode = model.ModeStlsDNAT
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		return f
	}, run: runStateless},
	{name: "mode-stlsdnat-tcp-ipv6", backends: 2, v6: true, farm: func(e *Env) model.Farm {
		f := e.Farm("stls", model.ProtoTCP)
		f.Mode = model.ModeStlsDNAT
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		return f
	}, run: runStateless},
	{name: "mode-stlsdnat-tcp", backends: 2, farm: func(e *Env) model.Farm {
		f := e.Farm("stls", model.ProtoTCP)
		f.Mode = model.ModeStlsDNAT
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		return f
	}, run: runStateless},
	{name: "mode-stlsdnat-ingress", backends: 2, farm: stlsIngressFarm(model.ProtoUDP), run: runStatelessIngress},
	{name: "mode-stlsdnat-ingress-tcp", backends: 2, farm: stlsIngressFarm(model.ProtoTCP), run: runStatelessIngress},
	{name: "mode-stlsdnat-ingress-ipv6", backends: 2, v6: true, farm: stlsIngressFarm(model.ProtoTCP), run: runStatelessIngress},
}

// stlsIngressFarm is a stlsdnat farm at ingress, as nftlb takes it: the
// clients' segment on iface (the LB's eth0), the backends' on oface (the
// bridge br0), the MACs found by the data plane.
func stlsIngressFarm(proto model.Protocol) func(e *Env) model.Farm {
	return func(e *Env) model.Farm {
		f := e.Farm("stls", proto)
		f.Mode = model.ModeStlsDNAT
		f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
		f.Iface, f.Oface = e.LB.Link, "br0"
		f.ResponseTTL = 30
		return f
	}
}

// runStatelessIngress: stateless DNAT at ingress, forwarding at layer 2
// both ways. With the LB's IP forwarding off, which a routed stlsdnat
// farm needs, the backends still see the client's address and the client
// gets its answers from the VIP.
func runStatelessIngress(t *testing.T, e *Env, f model.Farm) {
	for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := testutil.WriteSysctl(e.LB.NS, k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	runStateless(t, e, f)
}

func dnatFarm(proto model.Protocol) func(e *Env) model.Farm {
	return func(e *Env) model.Farm {
		f := e.Farm("dnat", proto)
		f.Mode = model.ModeDNAT
		return f
	}
}

func hashFarm(s model.Scheduler, keys model.HashKey) func(e *Env) model.Farm {
	return func(e *Env) model.Farm {
		f := e.Farm("hash", model.ProtoUDP)
		f.Scheduler, f.SchedParam = s, keys
		return f
	}
}

// weightedHashFarm is a hash farm whose backends weigh 1, 1 and 2, so the
// planes must also agree on the weighted slot table.
func weightedHashFarm(keys model.HashKey) func(e *Env) model.Farm {
	return func(e *Env) model.Farm {
		f := hashFarm(model.SchedHash, keys)(e)
		f.Backends[2].Weight = 2
		return f
	}
}

func persistFarm(keys model.HashKey, proto model.Protocol) func(e *Env) model.Farm {
	return func(e *Env) model.Farm {
		f := e.Farm("persist", proto)
		f.Persistence, f.PersistTTL = keys, 30
		return f
	}
}

func helperFarm(h model.Helper, proto model.Protocol) func(e *Env) model.Farm {
	return func(e *Env) model.Farm {
		f := e.Farm("helper", proto)
		f.Helper = h
		return f
	}
}

func (e *Env) vipPort(f model.Farm) netip.AddrPort {
	return netip.AddrPortFrom(f.VirtualAddr, f.VirtualPorts[0].First)
}

// ask opens a new flow of the farm's protocol from local (zero: any).
func (e *Env) ask(t testing.TB, f model.Farm, local netip.AddrPort) (string, netip.AddrPort) {
	t.Helper()
	if f.Protocol == model.ProtoUDP {
		return e.AskUDP(t, local, e.vipPort(f))
	}
	return e.AskTCP(t, local, e.vipPort(f))
}

func (e *Env) lbBack() netip.Addr {
	if e.v6 {
		return e.LBBack6
	}
	return e.LBBack4
}

func runSNAT(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	seen := map[string]bool{}
	for range 6 {
		name, from := e.ask(t, f, netip.AddrPort{})
		seen[name] = true
		if from.Addr() != e.lbBack() {
			t.Errorf("snat: backend saw %s, want the LB's %s", from, e.lbBack())
		}
	}
	if len(seen) != len(e.Backends) {
		t.Errorf("answers from %v, want every backend", seen)
	}
}

func runDNAT(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	for range 4 {
		_, from := e.ask(t, f, netip.AddrPort{})
		if from.Addr() != e.Client.Addr(e.v6) {
			t.Errorf("dnat: backend saw %s, want the client's %s", from, e.Client.Addr(e.v6))
		}
	}
}

// runDSR: direct server return, set up as its users do: each backend holds
// the VIP on its loopback and serves on VIP:port. A flow to the VIP reaches
// the backend with its destination unchanged (the server is bound to the
// VIP only, so a rewritten destination would find no listener), from the
// client's own address, and the backend answers as the VIP by itself (the
// client's socket, connected to the VIP, takes only those replies).
// runDual: over TCP and UDP, each VIP of a dual farm reaches every
// backend through the backends' address of its own family (snat: the
// backend sees the LB's address of that family).
func runDual(t *testing.T, e *Env, f model.Farm) {
	udp := f.Clone()
	udp.Name, udp.Protocol = "dual-udp", model.ProtoUDP
	e.Put(t, f, udp)
	for _, farm := range []model.Farm{f, udp} {
		for _, vip := range farm.VirtualAddrs() {
			lb := e.LBBack4
			if vip.Is6() {
				lb = e.LBBack6
			}
			seen := map[string]bool{}
			for range 10 {
				var name string
				var from netip.AddrPort
				to := netip.AddrPortFrom(vip, VPort)
				if farm.Protocol == model.ProtoUDP {
					name, from = e.AskUDP(t, netip.AddrPort{}, to)
				} else {
					name, from = e.AskTCP(t, netip.AddrPort{}, to)
				}
				seen[name] = true
				if from.Addr() != lb {
					t.Errorf("%s %s: backend saw %s, want the LB's %s", farm.Protocol, vip, from, lb)
				}
			}
			if !seen["b0"] || !seen["b1"] {
				t.Errorf("%s %s: answers from %v, want b0 and b1", farm.Protocol, vip, seen)
			}
		}
	}
}

func runDSR(t *testing.T, e *Env, f model.Farm) {
	vip := e.vipPort(f)
	bits := 32
	if vip.Addr().Is6() {
		bits = 128
	}
	// The LB routes the VIP to its client side, where the VIP's traffic
	// arrives (as a router announcing the VIP would): a data plane may
	// find the interface to hook that way.
	testutil.Run(t, e.LB.Name, "ip", "route", "add", netip.PrefixFrom(vip.Addr(), bits).String(), "dev", e.LB.Link)
	for i, b := range e.Backends {
		testutil.Run(t, b.Name, "ip", "addr", "add", netip.PrefixFrom(vip.Addr(), bits).String(), "dev", "lo")
		name := fmt.Sprintf("b%d", i)
		if f.Protocol == model.ProtoUDP {
			testutil.StartUDPServer(t, b.NS, vip, name)
		} else {
			testutil.StartTCPServer(t, b.NS, vip, name)
		}
	}
	e.Put(t, f)
	seen := map[string]int{}
	for range 12 * len(e.Backends) {
		name, from := e.ask(t, f, netip.AddrPort{})
		seen[name]++
		if from.Addr() != e.Client.Addr(e.v6) {
			t.Errorf("dsr: backend saw %s, want the client's %s", from, e.Client.Addr(e.v6))
		}
	}
	for i := range e.Backends {
		// 24 flows over 2 backends: all on one has probability 2^-23.
		if n := fmt.Sprintf("b%d", i); seen[n] == 0 {
			t.Errorf("dsr: no answer from %s (answers: %v)", n, seen)
		}
	}
}

func runRR(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	c := Count(30, func() string { n, _ := e.ask(t, f, netip.AddrPort{}); return n })
	for i := range e.Backends {
		if b := fmt.Sprintf("b%d", i); c[b] < 8 || c[b] > 12 {
			t.Errorf("rr: %s got %d of 30, want 10 ± 2 (all: %v)", b, c[b], c)
		}
	}
}

// runWeight: weights 1 and 3 over 200 flows: b1 expects 150; ± 30 is
// about 4.9 standard deviations.
func runWeight(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	c := Count(200, func() string { n, _ := e.ask(t, f, netip.AddrPort{}); return n })
	if c["b1"] < 120 || c["b1"] > 180 {
		t.Errorf("weight 1:3: got %v, want b1 150 ± 30 of 200", c)
	}
}

// runHashSrcIP: each client address always reaches the same backend (also
// after conntrack forgot it), and 8 addresses do not all land on one.
// runHash: every flow goes to the backend plan.HashTable and plan.FlowSlot
// name for the farm's keys, before and after a backend goes down, as in
// runMaglev: both planes run it against the same Go model, so they (and
// any node) pick the same backend for the same flow and backend set. The
// hash scheduler is not consistent: a backend going down may move any flow.
func runHash(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	addrs := e.ClientAddrs(t, 8)
	const ports = 6
	flows := len(addrs) * ports
	local := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(addrs[i%len(addrs)], uint16(42000+i/len(addrs)))
	}
	predict := func(g *model.Farm, i int) string {
		active := g.ActiveBackends()
		table := plan.HashTable(active)
		fl := plan.Flow{Src: local(i).Addr(), Dst: g.VirtualAddr, SPort: local(i).Port(), DPort: g.VirtualPorts[0].First}
		return active[table[plan.FlowSlot(g.SchedParam, fl, len(table))]].Name
	}
	before := make([]string, flows)
	c := map[string]int{}
	for i := range flows {
		before[i], _ = e.ask(t, f, local(i))
		c[before[i]]++
		if want := predict(&f, i); before[i] != want {
			t.Errorf("hash %s: flow %d from %s went to %s, the plan says %s", f.SchedParam, i, local(i), before[i], want)
		}
	}
	if len(c) < 2 {
		t.Errorf("hash %s: %d flows all reached %v", f.SchedParam, flows, c)
	}
	// As in runMaglev: new flows are the strict check after the change;
	// a tracked flow of a backend still up may stay where it is.
	e.FlushConntrack(t)
	g := f.Clone()
	g.Backends[2].State = model.StateDown
	e.Put(t, g)
	for i := range flows {
		if now, _ := e.ask(t, f, local(flows+i)); now != predict(&g, flows+i) {
			t.Errorf("hash %s, b2 down: new flow %d from %s went to %s, the plan says %s", f.SchedParam, i, local(flows+i), now, predict(&g, flows+i))
		}
		now, _ := e.ask(t, f, local(i))
		switch {
		case now == "b2":
			t.Errorf("hash %s: flow %d reached the down backend", f.SchedParam, i)
		case now != before[i] && now != predict(&g, i):
			t.Errorf("hash %s, b2 down: flow %d from %s went to %s, neither its backend %s nor the plan's %s", f.SchedParam, i, local(i), now, before[i], predict(&g, i))
		}
	}
}

// runSameBackend: every flow of the one client (one MAC) reaches one backend.
func runSameBackend(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	c := Count(12, func() string { n, _ := e.ask(t, f, netip.AddrPort{}); return n })
	if len(c) != 1 {
		t.Errorf("flows of one client spread over %v, want one backend", c)
	}
}

// runFlowHash: a flow (fixed source port) is hashed to the same backend
// every time, and 24 flows spread over more than one backend.
func runFlowHash(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	used := map[string]bool{}
	src := e.Client.Addr(e.v6)
	for i := range 24 {
		local := netip.AddrPortFrom(src, uint16(40000+i))
		a, _ := e.ask(t, f, local)
		e.FlushConntrack(t)
		b, _ := e.ask(t, f, local)
		if a != b {
			t.Errorf("flow from %s went to %s, then %s", local, a, b)
		}
		used[a] = true
	}
	if len(used) < 2 {
		t.Errorf("24 flows all hashed to %v", used)
	}
}

// runMaglev: every flow goes to the backend plan.Maglev and plan.FlowSlot
// say, before and after a backend goes down. Every plane runs this
// scenario against the same Go model, so it proves the planes pick the
// same backend for the same flow and backend set (and any node would: the
// model has no input but the flow and the backends). Removing one backend
// of 5 moves the flows it had (about 1/5) and few others.
func runMaglev(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	const flows = 150
	src := e.Client.Addr(e.v6)
	local := func(i int) netip.AddrPort { return netip.AddrPortFrom(src, uint16(41000+i)) }
	predict := func(g *model.Farm, i int) string {
		active := g.ActiveBackends()
		table := plan.MaglevTable(g, active)
		fl := plan.Flow{Src: src, Dst: g.VirtualAddr, SPort: local(i).Port(), DPort: g.VirtualPorts[0].First}
		return active[table[plan.FlowSlot(plan.MaglevKeys(g), fl, len(table))]].Name
	}
	before := make([]string, flows)
	c := map[string]int{}
	for i := range flows {
		before[i], _ = e.ask(t, f, local(i))
		c[before[i]]++
		if want := predict(&f, i); before[i] != want {
			t.Errorf("maglev: flow %d from %s went to %s, the plan says %s", i, local(i), before[i], want)
		}
	}
	if len(c) != len(e.Backends) {
		t.Fatalf("maglev: %d flows reached %v, want every backend", flows, c)
	}
	// Netfilter's conntrack would keep UDP flows on the down backend
	// until they time out; the eBPF plane expires them itself.
	e.FlushConntrack(t)
	g := f.Clone()
	g.Backends[2].State = model.StateDown
	e.Put(t, g)
	// New flows follow the plan of the new backend set. A flow that was
	// on b2 is scheduled again (its backend is gone); a tracked flow of
	// another backend may stay where it is (the eBPF plane keeps its own
	// connection table), which is why new flows are the strict check.
	for i := range flows {
		if now, _ := e.ask(t, f, local(flows+i)); now != predict(&g, flows+i) {
			t.Errorf("maglev, b2 down: new flow %d from %s went to %s, the plan says %s", i, local(flows+i), now, predict(&g, flows+i))
		}
		now, _ := e.ask(t, f, local(i))
		switch {
		case now == "b2":
			t.Errorf("flow %d reached the down backend", i)
		case before[i] == "b2" && now != predict(&g, i):
			t.Errorf("maglev, b2 down: flow %d of b2 from %s went to %s, the plan says %s", i, local(i), now, predict(&g, i))
		case now != before[i] && now != predict(&g, i):
			t.Errorf("maglev, b2 down: flow %d from %s went to %s, neither its backend %s nor the plan's %s", i, local(i), now, before[i], predict(&g, i))
		}
	}
	// What the change moves, by the plan both kernels just followed.
	moved, movedOther := 0, 0
	for i := range flows {
		if a, b := predict(&f, i), predict(&g, i); a != b {
			moved++
			if a != "b2" {
				movedOther++
			}
		}
	}
	share := float64(moved) / flows
	t.Logf("maglev: removing 1 of 5 backends moved %d of %d flows (%.2f), %d not on it", moved, flows, share, movedOther)
	if moved != c["b2"]+movedOther || share > 0.35 || movedOther > flows/20 {
		t.Errorf("maglev: removing 1 of 5 backends moved %d of %d flows (%d not on it), want about 1/5 and almost none of the others", moved, flows, movedOther)
	}
}

func runPriority(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	count := func(n int) map[string]int {
		return Count(n, func() string { n, _ := e.ask(t, f, netip.AddrPort{}); return n })
	}
	if c := count(10); c["b0"] != 5 || c["b1"] != 5 {
		t.Errorf("priority 1 level: got %v, want 5 each on b0, b1", c)
	}
	// nftlb's rule (model.Farm.PriorityLevel): one of level 1 down raises
	// the level to 2 and the spare b2 serves beside b1.
	one := f.Clone()
	one.Backends[0].State = model.StateDown
	e.Put(t, one)
	if c := count(10); c["b1"] != 5 || c["b2"] != 5 {
		t.Errorf("one of level 1 down: got %v, want 5 each on b1 and b2", c)
	}
	down := f.Clone()
	down.Backends[0].State, down.Backends[1].State = model.StateDown, model.StateDown
	e.Put(t, down)
	if c := count(5); c["b2"] != 5 {
		t.Errorf("failover: got %v, want all on b2", c)
	}
	e.Put(t, f)
	if c := count(10); c["b2"] != 0 {
		t.Errorf("failback: got %v, want none on b2", c)
	}
}

func runDrainDown(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	// Hold a connection to b0 (rr: the first one).
	held, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if line, err := testutil.ReadLine(held, time.Second); err != nil || !strings.HasPrefix(line, "b0 ") {
		t.Fatalf("first connection: %q, %v (want b0)", line, err)
	}
	g := f.Clone()
	g.Backends[0].Weight = 0
	g.Backends[1].State = model.StateDown
	e.Put(t, g)
	if c := Count(10, func() string { n, _ := e.ask(t, f, netip.AddrPort{}); return n }); c["b2"] != 10 {
		t.Errorf("with b0 drained and b1 down: got %v, want all on b2", c)
	}
	// The drained backend's established connection goes on.
	if _, err := fmt.Fprintf(held, "still there\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := testutil.ReadLine(held, time.Second); err != nil || line != "still there" {
		t.Errorf("connection to the drained backend: %q, %v", line, err)
	}
}

// runProtocolAll: a farm for every protocol and port balances TCP and UDP
// on any port, each to the same port on the backends.
func runProtocolAll(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	to := netip.AddrPortFrom(f.VirtualAddr, BPort)
	seen := map[string]bool{}
	for range 4 {
		n, _ := e.AskTCP(t, netip.AddrPort{}, to)
		seen[n] = true
		n, _ = e.AskUDP(t, netip.AddrPort{}, to)
		seen[n] = true
	}
	if len(seen) != 2 {
		t.Errorf("tcp and udp to %s reached %v, want both backends", to, seen)
	}
}

// runPersistence: the farm schedules rr, so without persistence successive
// flows would spread. Flows with the same persistence key reach one
// backend, also after an unrelated change of the farm; when that backend
// goes down its clients move to another one and stay there.
func runPersistence(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	src := e.Client.Addr(e.v6)
	local := netip.AddrPortFrom(src, 0)
	if f.Persistence&model.KeySrcPort != 0 {
		local = netip.AddrPortFrom(src, 42000)
	}
	askN := func(n int) map[string]int {
		return Count(n, func() string {
			name, _ := e.ask(t, f, local)
			if local.Port() != 0 {
				e.FlushConntrack(t) // same 5-tuple again: make it a new connection
			}
			return name
		})
	}
	c := askN(6)
	if len(c) != 1 {
		t.Fatalf("persistence %s: flows of one key spread over %v", f.Persistence, c)
	}
	var first string
	for b := range c {
		first = b
	}
	// Other keys still spread (rr): another source address or port.
	if f.Persistence&(model.KeySrcIP|model.KeySrcPort) != 0 {
		others := map[string]bool{}
		var addrs []netip.Addr
		if f.Persistence&model.KeySrcPort == 0 {
			addrs = e.ClientAddrs(t, 6)
		}
		for i := range 6 {
			var l netip.AddrPort
			if f.Persistence&model.KeySrcPort != 0 {
				l = netip.AddrPortFrom(src, uint16(42100+i))
			} else {
				l = netip.AddrPortFrom(addrs[i], 0)
			}
			n, _ := e.ask(t, f, l)
			others[n] = true
		}
		if len(others) < 2 {
			t.Errorf("6 other keys all went to %v, want rr to spread them", others)
		}
	}
	// An unrelated change of the farm (another backend's weight) keeps
	// the sessions.
	g := f.Clone()
	for i := range g.Backends {
		if g.Backends[i].Name != first {
			g.Backends[i].Weight = 2
			break
		}
	}
	e.Put(t, g)
	if c := askN(3); c[first] != 3 {
		t.Errorf("after an unrelated change flows went to %v, want all on %s", c, first)
	}
	g = g.Clone()
	for i := range g.Backends {
		if g.Backends[i].Name == first {
			g.Backends[i].State = model.StateDown
		}
	}
	e.Put(t, g)
	c = askN(6)
	if len(c) != 1 || c[first] != 0 {
		t.Errorf("after %s went down: flows went to %v, want one other backend", first, c)
	}
}

// quickTCPFrom: whether a TCP connection from local to the address is
// accepted within timeout.
func (e *Env) quickTCPFrom(local netip.Addr, to netip.AddrPort, timeout time.Duration) bool {
	c, err := testutil.DialTCPFrom(e.Client.NS, netip.AddrPortFrom(local, 0), to, timeout)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// sendUDP sends payload from a new socket and waits at most timeout for an
// answer; it reports whether one came.
func (e *Env) sendUDP(to netip.AddrPort, payload []byte, timeout time.Duration) bool {
	var c *net.UDPConn
	err := testutil.Do(e.Client.NS, func() error {
		var err error
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		return err
	})
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(payload); err != nil {
		return false
	}
	buf := make([]byte, 512)
	_, err = c.Read(buf)
	return err == nil
}

// runNewRTLimit: 5 new flows per second (or 300 a minute), burst 5, per
// client. 40 new flows (UDP, or TCP connections) from one client within
// about a second: some answered (burst + rate), the excess dropped. A
// second client meanwhile is not limited (its own count); after a pause
// the first one's new flows pass again.
func runNewRTLimit(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	e.Put(t, f)
	flow := func(a netip.Addr, wait time.Duration) bool {
		if f.Protocol == model.ProtoTCP {
			return e.quickTCPFrom(a, e.vipPort(f), wait)
		}
		return e.quickUDPFrom(a, e.vipPort(f), wait)
	}
	start := time.Now()
	ok := 0
	for range 40 {
		if flow(c[0], 25*time.Millisecond) {
			ok++
		}
	}
	el := time.Since(start)
	max := 5 + 1 + int(5*el.Seconds()+0.999) + 2
	t.Logf("new-rtlimit %d/%s burst 5: %d of 40 answered in %v", f.NewRTLimit, f.NewRTUnit, ok, el)
	if ok < 5 || ok > max {
		t.Errorf("new-rtlimit %d/%s burst 5: %d of 40 new flows from %s answered in %v, want 5 to %d",
			f.NewRTLimit, f.NewRTUnit, ok, c[0], el, max)
	}
	// c[1]'s burst right after c[0] spent its own: one count for the
	// farm would drop most of it.
	got := 0
	for range 5 {
		if flow(c[1], time.Second) {
			got++
		}
	}
	if got < 5 {
		t.Errorf("client %s (a burst of its own): %d of 5 new flows answered, want 5", c[1], got)
	}
	time.Sleep(1200 * time.Millisecond)
	if !flow(c[0], time.Second) {
		t.Errorf("after a pause a new flow from %s was dropped", c[0])
	}
}

// runNewRTLimitKept: a client that spent its burst of new-rtlimit (2 a
// minute, burst 2) is still limited after a change of the farm (a backend's
// weight: the eBPF plane writes a new generation), as nft's per-farm set
// keeps its clients; another client still has its own burst.
func runNewRTLimitKept(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	e.Put(t, f)
	ok := 0
	for range 4 {
		if e.quickTCPFrom(c[0], e.vipPort(f), 500*time.Millisecond) {
			ok++
		}
	}
	if ok != 2 {
		t.Fatalf("new-rtlimit 2/minute burst 2: %d of 4 new connections from %s answered, want 2", ok, c[0])
	}
	f.Backends[0].Weight++
	e.Put(t, f)
	if e.quickTCPFrom(c[0], e.vipPort(f), 500*time.Millisecond) {
		t.Errorf("after a change of the farm, a new connection from %s (its burst spent) was answered: the change reset its rate state", c[0])
	}
	if !e.quickTCPFrom(c[1], e.vipPort(f), time.Second) {
		t.Errorf("after a change of the farm, client %s (its burst unspent) was refused", c[1])
	}
}

// runEstConnLimit: with est-connlimit 3, three connections held open pass,
// the fourth is dropped; closing one lets a new one in.
func runEstConnLimit(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 3 {
		c, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), time.Second)
		if err != nil {
			t.Fatalf("connection %d of 3: %v", i+1, err)
		}
		if _, err := testutil.ReadLine(c, time.Second); err != nil {
			t.Fatalf("connection %d of 3: %v", i+1, err)
		}
		held = append(held, c)
	}
	if c, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), 700*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("fourth connection accepted, want it dropped by est-connlimit 3")
	}
	held[0].Close()
	held = held[1:]
	deadline := time.Now().Add(3 * time.Second)
	for {
		c, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), 500*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after closing one of 3: new connection still refused: %v", err)
		}
	}
}

// runTCPStrict: the VIP is also a local address of the LB (as on many
// LBs), so a segment conntrack calls invalid (SYN+FIN) is not balanced but
// reaches the LB's own TCP stack, which answers with a reset. First
// without tcp-strict, to show the probe works; then with it: no answer,
// while normal connections still pass.
func runTCPStrict(t *testing.T, e *Env, f model.Farm) {
	e.LB.AddAddr(t, netip.PrefixFrom(f.VirtualAddr, 32))
	loose := f.Clone()
	loose.TCPStrict = false
	e.Put(t, loose)
	l, err := testutil.ListenTCPSegments(e.Client.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	probe := func(port uint16) bool {
		src := netip.AddrPortFrom(e.Client.IPv4, port)
		if err := testutil.SendTCPSegment(e.Client.NS, src, e.vipPort(f), testutil.TCPSyn|testutil.TCPFin, 1); err != nil {
			t.Fatal(err)
		}
		flags, ok := l.Wait(e.vipPort(f), port, 700*time.Millisecond)
		return ok && flags&testutil.TCPRst != 0
	}
	if !probe(45001) {
		t.Fatalf("without tcp-strict: no reset for SYN+FIN, the probe cannot show a drop")
	}
	e.Put(t, f)
	if probe(45002) {
		t.Errorf("with tcp-strict: SYN+FIN (invalid) got an answer, want it dropped")
	}
	if name, _ := e.ask(t, f, netip.AddrPort{}); name != "b0" {
		t.Errorf("with tcp-strict: normal connection answered by %q", name)
	}
}

// established counts the TCP connections of the backend server on BPort
// that are established.
func (e *Env) established(t *testing.T, b testutil.Host) int {
	out := testutil.Run(t, b.Name, "ss", "-Htn", "state", "established", fmt.Sprintf("( sport = :%d )", BPort))
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n
}

// runRstRTLimit: 30 connections are aborted at once (each sends a reset).
// With rst-rtlimit 5/s burst 5 about the first 5 resets pass and the
// backend closes those connections; the rest are dropped, so the backend
// still holds them.
func runRstRTLimit(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	const n = 30
	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		c, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c.(*net.TCPConn))
		if _, err := testutil.ReadLine(c, time.Second); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	if got := e.established(t, e.Backends[0]); got != n {
		t.Fatalf("backend holds %d connections, want %d", got, n)
	}
	for _, c := range conns {
		_ = c.SetLinger(0) // close sends a reset
		c.Close()
	}
	conns = nil
	time.Sleep(300 * time.Millisecond)
	left := e.established(t, e.Backends[0])
	t.Logf("rst-rtlimit 5/s burst 5: %d of %d resets dropped", left, n)
	if left < n-15 || left > n-3 {
		t.Errorf("after %d resets at once the backend still holds %d connections, want %d to %d (about 5 resets pass)", n, left, n-15, n-3)
	}
}

// kernelHelperName is the name conntrack shows for a helper on a protocol.
func kernelHelperName(h model.Helper, p model.Protocol) string {
	if h == model.HelperH323 {
		if p == model.ProtoUDP {
			return "RAS"
		}
		return "Q.931"
	}
	return h.String()
}

// runHelperAttached: a connection through the farm carries the farm's
// conntrack helper (conntrack -L shows helper=NAME), and traffic passes.
// Except for snmp: under NAT, nf_nat_snmp_basic decodes every packet and
// drops what is not SNMP, so the client sends a real SNMPv1 GetRequest and
// the backend's non-SNMP answer is dropped: there only the helper is
// checked.
func runHelperAttached(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	if f.Helper == model.HelperSNMP {
		e.sendUDP(e.vipPort(f), snmpGet, 300*time.Millisecond)
	} else if name, _ := e.ask(t, f, netip.AddrPort{}); name != "b0" {
		t.Fatalf("answer from %q", name)
	}
	want := "helper=" + kernelHelperName(f.Helper, f.Protocol)
	out, err := testutil.RunErr(e.LB.Name, "conntrack", "-L", "-p", f.Protocol.String())
	if err != nil && !strings.Contains(out, "flow entries") {
		t.Fatal(err)
	}
	if !strings.Contains(out, want) {
		t.Errorf("conntrack entries do not carry %s:\n%s", want, out)
	}
}

// snmpGet is an SNMPv1 GetRequest for sysDescr.0, community "public".
var snmpGet = []byte{
	0x30, 0x26, 0x02, 0x01, 0x00, 0x04, 0x06, 'p', 'u', 'b', 'l', 'i', 'c',
	0xa0, 0x19, 0x02, 0x01, 0x01, 0x02, 0x01, 0x00, 0x02, 0x01, 0x00,
	0x30, 0x0e, 0x30, 0x0c, 0x06, 0x08, 0x2b, 0x06, 0x01, 0x02, 0x01, 0x01, 0x01, 0x00, 0x05, 0x00,
}

// runFwmark: the user's own firewall marks TCP to 10.99.0.50:80 with 7 (an
// nftables rule at prerouting, mangle priority, the IPVS -f setup); the
// farm keyed by mark 7 balances it (snat), and unmarked traffic to the
// same address is not handled.
func runFwmark(t *testing.T, e *Env, f model.Farm) {
	dst := testutil.VIP4(50)
	for _, cmd := range [][]string{
		{"nft", "add", "table", "ip", "user"},
		{"nft", "add", "chain", "ip", "user", "pre", "{ type filter hook prerouting priority mangle; }"},
		{"nft", "add", "rule", "ip", "user", "pre", "ip", "daddr", dst.String(), "tcp", "dport", "80", "meta", "mark", "set", "7"},
	} {
		testutil.Run(t, e.LB.Name, cmd...)
	}
	e.Put(t, f)
	seen := map[string]bool{}
	for range 4 {
		name, from := e.AskTCP(t, netip.AddrPort{}, netip.AddrPortFrom(dst, 80))
		seen[name] = true
		if from.Addr() != e.LBBack4 {
			t.Errorf("mark farm (snat): backend saw %s, want %s", from, e.LBBack4)
		}
	}
	if len(seen) != 2 {
		t.Errorf("marked connections reached %v, want both backends", seen)
	}
	if c, err := testutil.DialTCP(e.Client.NS, netip.AddrPortFrom(dst, 81), 500*time.Millisecond); err == nil {
		c.Close()
		t.Errorf("unmarked port 81 answered, want no service")
	}
}

// runBackendMark: connections to a backend with a mark leave the LB with
// that mark (marks.go), so the user's policy routing and egress rules can
// use it; none to the other backend carries it; both backends still
// serve. Where the plane's flows are in conntrack (nft), they carry it
// there too (mark=256), for the user's reply rules.
func runBackendMark(t *testing.T, e *Env, f model.Farm) {
	b0, b1 := f.Backends[0].Addr, f.Backends[1].Addr
	m := e.countMarks(t, "ip daddr "+b0.String()+" meta mark 0x100", "ip daddr "+b1.String()+" meta mark 0x100")
	e.Put(t, f)
	c := Count(6, func() string { n, _ := e.ask(t, f, netip.AddrPort{}); return n })
	if c["b0"] != 3 || c["b1"] != 3 {
		t.Errorf("rr with a marked backend: %v, want 3 each", c)
	}
	if n := m.packets(t); n[0] < 3 || n[1] != 0 {
		t.Errorf("packets leaving with mark 0x100: %d to the marked backend (want at least one per connection, 3), %d to the other (want 0)", n[0], n[1])
	}
	if n := e.markedConntrack(t, "src="+b0.String()+" ", "mark=256"); n != 0 && n != 3 {
		t.Errorf("%d conntrack entries to the marked backend, want 3 (or none: flows tracked outside conntrack)", n)
	}
}

// runLog: each new connection of a farm with log is logged (to NFLOG group
// LogGroup, or where Plane.ConnLog reads) once for each hook of its log,
// with nftlb's prefix for that hook (its log-prefix with KNAME, TYPE and
// FNAME expanded: "conf-log-IN-logged ", "conf-log-FWD-logged "), and the
// logged packet is addressed to the backend that answered.
func runLog(t *testing.T, e *Env, f model.Farm) {
	wait := e.logWaiter(t)
	e.Put(t, f)
	prefixes := plan.FarmLogPrefixes(&f)
	if len(prefixes) != 2 || prefixes[1] != "conf-log-FWD-"+f.Name+" " {
		t.Fatalf("the farm's log prefixes: %q", prefixes)
	}
	for range 2 {
		name, _ := e.ask(t, f, netip.AddrPort{})
		var want netip.Addr
		for _, b := range f.Backends {
			if b.Name == name {
				want = b.Addr
			}
		}
		// The connection's lines, in the order of the hooks.
		for _, prefix := range prefixes {
			entry, err := wait(prefix, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if entry.Prefix != prefix {
				t.Errorf("log prefix %q, want %q", entry.Prefix, prefix)
			}
			if entry.Dst != want || entry.Src != e.Client.IPv4 {
				t.Errorf("logged packet %s -> %s, want %s -> %s (the backend that answered, %s)", entry.Src, entry.Dst, e.Client.IPv4, want, name)
			}
		}
	}
}

// runStateless: stateless DNAT both ways. The backend sees the client's
// address, the client gets its answers from the VIP (its socket accepts
// nothing else), flows spread over the backends, and the LB keeps no
// conntrack entry for them.
func runStateless(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	seen := map[string]bool{}
	// The hash of a random source port sends 12 flows to one of 2 backends
	// once in 2,048 runs; asking on (up to 64 flows) until every backend
	// answered keeps the check without the flake.
	flows := 0
	for ; flows < 12 || (flows < 64 && len(seen) < len(e.Backends)); flows++ {
		name, from := e.ask(t, f, netip.AddrPort{})
		seen[name] = true
		if from.Addr() != e.Client.Addr(e.v6) {
			t.Errorf("stlsdnat: backend saw %s, want the client's %s", from, e.Client.Addr(e.v6))
		}
	}
	if len(seen) != len(e.Backends) {
		t.Errorf("%d flows reached %v, want every backend", flows, seen)
	}
	out, _ := testutil.RunErr(e.LB.Name, "conntrack", "-L")
	if strings.Contains(out, f.VirtualAddr.String()) {
		t.Errorf("stateless farm left conntrack entries:\n%s", out)
	}
}

// runBackendConnLimit: b0 has est-connlimit 2, b1 none; rr alternates.
// Of 6 connections held open, the third one scheduled to b0 (the fifth) is
// dropped, the others pass. Closing one of b0's lets a new one reach b0.
func runBackendConnLimit(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	var onB0 []net.Conn
	c := map[string]int{}
	for i := range 6 {
		// Shorter than the first SYN retransmission (1 s): a dropped
		// connection fails instead of being scheduled again.
		conn, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), 700*time.Millisecond)
		if err != nil {
			c["dropped"]++
			if i != 4 {
				t.Errorf("connection %d dropped, want only the fifth (b0's third)", i+1)
			}
			continue
		}
		held = append(held, conn)
		line, err := testutil.ReadLine(conn, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		name, _, _ := testutil.ParseReply(line)
		c[name]++
		if name == "b0" {
			onB0 = append(onB0, conn)
		}
	}
	if c["b0"] != 2 || c["b1"] != 3 || c["dropped"] != 1 {
		t.Fatalf("6 connections: %v, want b0 2, b1 3, dropped 1", c)
	}
	onB0[0].Close()
	time.Sleep(200 * time.Millisecond)
	// rr: the next one goes to b0 (slot after the last to b1).
	conn, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), 700*time.Millisecond)
	if err != nil {
		t.Fatalf("after closing one of b0's connections a new one was dropped: %v", err)
	}
	held = append(held, conn)
	line, _ := testutil.ReadLine(conn, time.Second)
	if name, _, _ := testutil.ParseReply(line); name != "b0" {
		t.Errorf("new connection went to %q, want b0", name)
	}
}

// runPersistTTL: persist-ttl 1 s. New connections within the ttl stay on
// the client's backend; after the ttl without one, the client is
// scheduled again (rr: the next backend).
func runPersistTTL(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	first, _ := e.ask(t, f, netip.AddrPort{})
	// 4 x 400 ms outlasts the ttl: only the renewal by each new
	// connection keeps the session.
	for range 4 {
		time.Sleep(400 * time.Millisecond)
		if n, _ := e.ask(t, f, netip.AddrPort{}); n != first {
			t.Fatalf("within the ttl the client went to %s, first to %s", n, first)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	if n, _ := e.ask(t, f, netip.AddrPort{}); n == first {
		t.Errorf("after the ttl the client still went to %s, want it scheduled again (rr: another backend)", n)
	}
}

// runLC: least connection over connections held open. Three connections
// go one to each backend (ties: the first); with b1's closed, b1 has the
// fewest and takes the next one, then b0 (a tie again). Round robin would
// send those two to b0 and b1.
func runLC(t *testing.T, e *Env, f model.Farm) {
	e.Put(t, f)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	open := func() (net.Conn, string) {
		t.Helper()
		c, err := testutil.DialTCP(e.Client.NS, e.vipPort(f), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		line, err := testutil.ReadLine(c, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		name, _, err := testutil.ParseReply(line)
		if err != nil {
			t.Fatal(err)
		}
		return c, name
	}
	var on1 net.Conn
	var got []string
	for range 3 {
		c, name := open()
		if name == "b1" {
			on1 = c
		}
		got = append(got, name)
	}
	if strings.Join(got, " ") != "b0 b1 b2" {
		t.Fatalf("lc: 3 held connections went to %v, want b0 b1 b2", got)
	}
	on1.Close()
	// The close is counted when its FIN passes: give it a moment.
	time.Sleep(300 * time.Millisecond)
	got = nil
	for range 2 {
		_, name := open()
		got = append(got, name)
	}
	if strings.Join(got, " ") != "b1 b0" {
		t.Errorf("lc: after b1's connection closed, the next two went to %v, want b1 b0", got)
	}
}
