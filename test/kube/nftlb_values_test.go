package kube_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// nftlbKey is kube-nftlb's annotation prefix.
const nftlbKey = "service.kubernetes.io/kube-nftlb-load-balancer-"

// TestKubeNftlbValues: every annotation value kube-nftlb's README documents
// (mode, persistence, scheduler, helper, log), written with kube-nftlb's
// own keys, on the nft plane with real traffic: each Service is served, and
// where the value changes where connections go or what address a backend
// sees, that is checked. A value xlb cannot do (hash-dstmac, from
// kube-nftlb's test notes) and the README's own typo (persistence
// "symhash") serve with the defaults and an Event.
func TestKubeNftlbValues(t *testing.T) {
	e := newEnv(t, 3)
	e.startServers()

	// Where connections from one client go: the set of backends that
	// answered n TCP connections (each from a new source port).
	one := func(got map[string]int) bool { return len(got) == 1 }
	all := func(got map[string]int) bool { return keys(got) == "b0,b1,b2" }
	even := func(got map[string]int) bool { return all(got) && got["b0"] == 4 && got["b1"] == 4 && got["b2"] == 4 }
	spread := func(got map[string]int) bool { return len(got) > 1 }
	type tcase struct {
		name  string
		ann   map[string]string
		farm  func(f *model.Farm) bool
		where func(map[string]int) bool // nil: any
		sees  string                    // "client", "lb" or "" (not checked)
		event string                    // a Warning Event reason expected
		udp   bool                      // check the udp port's farm and traffic
	}
	cases := []tcase{
		{"mode-snat", map[string]string{"mode": "snat"}, func(f *model.Farm) bool { return f.Mode == model.ModeSNAT }, even, "lb", "", false},
		{"mode-dnat", map[string]string{"mode": "dnat"}, func(f *model.Farm) bool { return f.Mode == model.ModeDNAT }, even, "client", "", false},
		{"persist-srcip", map[string]string{"persistence": "srcip"}, func(f *model.Farm) bool { return f.Persistence == model.KeySrcIP }, one, "", "", false},
		{"persist-srcport", map[string]string{"persistence": "srcport"}, func(f *model.Farm) bool { return f.Persistence == model.KeySrcPort }, all, "", "", false},
		{"persist-srcmac", map[string]string{"persistence": "srcmac"}, func(f *model.Farm) bool { return f.Persistence == model.KeySrcMAC }, one, "", "", false},
		{"persist-srcip-srcport", map[string]string{"persistence": "srcip-srcport"}, func(f *model.Farm) bool { return f.Persistence == model.KeySrcIP|model.KeySrcPort }, all, "", "", false},
		{"persist-srcip-dstport", map[string]string{"persistence": "srcip-dstport"}, func(f *model.Farm) bool { return f.Persistence == model.KeySrcIP|model.KeyDstPort }, one, "", "", false},
		{"persist-srcip-sp-srcport", map[string]string{"persistence": "srcip srcport"}, func(f *model.Farm) bool { return f.Persistence == model.KeySrcIP|model.KeySrcPort }, all, "", "", false},
		{"sched-rr", map[string]string{"scheduler": "rr"}, func(f *model.Farm) bool { return f.Scheduler == model.SchedRR }, even, "", "", false},
		{"sched-symhash", map[string]string{"scheduler": "symhash"}, func(f *model.Farm) bool { return f.Scheduler == model.SchedSymhash }, nil, "", "", false},
		{"sched-hash-srcip", map[string]string{"scheduler": "hash-srcip"}, func(f *model.Farm) bool {
			return f.Scheduler == model.SchedHash && f.SchedParam == model.KeySrcIP
		}, one, "", "", false},
		{"sched-hash-srcip-srcport", map[string]string{"scheduler": "hash-srcip-srcport"}, func(f *model.Farm) bool {
			return f.Scheduler == model.SchedHash && f.SchedParam == model.KeySrcIP|model.KeySrcPort
		}, spread, "", "", false},
		{"log-none", map[string]string{"log": "none"}, func(f *model.Farm) bool { return f.Log == 0 }, even, "", "", false},
		{"log-output", map[string]string{"log": "output"}, func(f *model.Farm) bool { return f.Log == model.LogOutput }, even, "", "", false},
		{"log-forward", map[string]string{"log": "forward"}, func(f *model.Farm) bool { return f.Log == model.LogForward }, even, "", "", false},
		// Not possible: the defaults serve, with an Event.
		{"sched-hash-dstmac", map[string]string{"scheduler": "hash-dstmac"}, func(f *model.Farm) bool { return f.Scheduler == model.SchedRR }, even, "", kube.ReasonInvalidAnnotation, false},
		{"persist-symhash", map[string]string{"persistence": "symhash"}, func(f *model.Farm) bool { return f.Persistence == 0 }, even, "", kube.ReasonInvalidAnnotation, false},
	}
	for _, h := range []string{"none", "amanda", "ftp", "h323", "irc", "netbios-ns", "pptp", "sane", "sip", "snmp", "tftp"} {
		probe := model.NewFarm("probe")
		if err := probe.SetField("helper", h); err != nil {
			t.Fatal(err)
		}
		want := probe.Helper
		// A Service's ports of the protocol the helper handles get it
		// (DNS-like Services have a TCP and a UDP port).
		udp := !want.Handles(model.ProtoTCP)
		cases = append(cases, tcase{"helper-" + h, map[string]string{"helper": h}, func(f *model.Farm) bool { return f.Helper == want }, nil, "", "", udp})
	}

	addrs := map[string]netip.AddrPort{}
	for _, c := range cases {
		s := service(c.name, corev1.ServiceTypeClusterIP)
		s.Annotations = map[string]string{}
		for k, v := range c.ann {
			s.Annotations[nftlbKey+k] = v
		}
		svc := e.createService(s)
		e.setEndpoints(c.name, false, ready(0, 1, 2))
		addrs[c.name] = netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cip := addrs[c.name].Addr()
			port := "tcp"
			if c.udp {
				port = "udp"
			}
			f := e.waitFarm(kube.FarmName(e.ns, c.name, port, kube.KindCluster, cip), hasBackends(3))
			if !c.farm(f) {
				t.Errorf("farm %s", f.AppendJSON(nil))
			}
			got := spreadT(t, e, addrs[c.name], c.udp, 12)
			if c.where != nil && !c.where(got) {
				t.Errorf("12 connections from one client went to %v", got)
			}
			if c.sees != "" {
				reply, err := testutil.AskTCP(e.Client.NS, addrs[c.name])
				if err != nil {
					t.Fatal(err)
				}
				want := e.Client.IPv4
				if c.sees == "lb" {
					want = e.LBBack4
				}
				if _, from, _ := testutil.ParseReply(reply); from.Addr() != want {
					t.Errorf("backend saw %s, want %s", from, want)
				}
			}
			if c.event != "" {
				ev := e.waitEvent(c.name, c.event)
				for _, v := range c.ann {
					if !strings.Contains(ev.Message, v) {
						t.Errorf("event %q does not name the value %q", ev.Message, v)
					}
				}
			}
		})
	}
}

// TestKubeNftlbStlsdnat: mode stlsdnat picks a backend for every packet,
// so with no scheduler annotation the scheduler is a flow hash (srcip
// srcport): every packet of a connection reaches the same backend, and
// connections spread. Backends see the client's address.
//
// It runs apart from TestKubeNftlbValues because the nft plane rewrites
// every packet coming from a stlsdnat farm's backend address and port back
// to the farm's address, before conntrack: the replies of the same
// endpoints to another Service's connections would be rewritten too (see
// docs/kube-proxy.md).
func TestKubeNftlbStlsdnat(t *testing.T) {
	e := newEnv(t, 3)
	e.startServers()
	s := service("stls", corev1.ServiceTypeClusterIP)
	s.Annotations = map[string]string{nftlbKey + "mode": "stlsdnat"}
	svc := e.createService(s)
	e.setEndpoints("stls", false, ready(0, 1, 2))
	cip := netip.MustParseAddr(svc.Spec.ClusterIP)
	f := e.waitFarm(kube.FarmName(e.ns, "stls", "tcp", kube.KindCluster, cip), hasBackends(3))
	if f.Mode != model.ModeStlsDNAT || f.Scheduler != model.SchedHash || f.SchedParam != model.KeySrcIP|model.KeySrcPort {
		t.Errorf("farm %s", f.AppendJSON(nil))
	}
	to := netip.AddrPortFrom(cip, 80)
	if got := spreadT(t, e, to, false, 12); len(got) < 2 {
		t.Errorf("12 connections went to %v, want a spread (flow hash)", got)
	}
	if got := e.spread(to, true, 6); len(got) == 0 {
		t.Errorf("udp: no answer")
	}
	reply, err := testutil.AskTCP(e.Client.NS, to)
	if err != nil {
		t.Fatal(err)
	}
	if _, from, _ := testutil.ParseReply(reply); from.Addr() != e.Client.IPv4 {
		t.Errorf("stlsdnat: backend saw %s, want the client's %s", from, e.Client.IPv4)
	}
}

// TestKubeNftlbDSR: mode dsr on a cluster IP, on the nft plane. The
// frame is forwarded at netdev ingress of the interface the Pods' (here:
// the client's) traffic arrives on, named by xlb.io/iface (or the proxy's
// PodInterface), with only its MAC addresses rewritten; the backends hold
// the cluster IP on lo (kube-nftlb added it there itself) and answer the
// client directly, seeing its address.
func TestKubeNftlbDSR(t *testing.T) {
	e := newEnv(t, 3)
	s := service("dsr", corev1.ServiceTypeClusterIP)
	// dsr does not rewrite the port: the Service port is the target port.
	s.Spec.Ports = []corev1.ServicePort{{Name: "tcp", Port: 8080, Protocol: corev1.ProtocolTCP}}
	s.Annotations = map[string]string{nftlbKey + "mode": "dsr", "xlb.io/iface": e.LB.Link}
	svc := e.createService(s)
	cip := netip.MustParseAddr(svc.Spec.ClusterIP)
	for _, b := range e.Backends {
		for _, kv := range []string{"net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2"} {
			testutil.Run(t, b.Name, "sysctl", "-q", "-w", kv)
		}
		testutil.Run(t, b.Name, "ip", "addr", "add", cip.String()+"/32", "dev", "lo")
	}
	e.startServers()
	e.setEndpoints("dsr", false, ready(0, 1, 2))
	f := e.waitFarm(kube.FarmName(e.ns, "dsr", "tcp", kube.KindCluster, cip), hasBackends(3))
	if f.Mode != model.ModeDSR || f.Iface != e.LB.Link || f.Scheduler != model.SchedHash {
		t.Errorf("farm %s", f.AppendJSON(nil))
	}
	to := netip.AddrPortFrom(cip, 8080)
	got := spreadT(t, e, to, false, 12)
	if len(got) < 2 {
		t.Errorf("12 connections went to %v, want a spread (flow hash)", got)
	}
	reply, err := testutil.AskTCP(e.Client.NS, to)
	if err != nil {
		t.Fatal(err)
	}
	if _, from, _ := testutil.ParseReply(reply); from.Addr() != e.Client.IPv4 {
		t.Errorf("dsr: backend saw %s, want the client's %s", from, e.Client.IPv4)
	}
	// Without an interface the farm cannot be placed: the defaults
	// (dnat) serve, with an Event naming iface.
	s2 := service("dsr-noiface", corev1.ServiceTypeClusterIP)
	s2.Annotations = map[string]string{nftlbKey + "mode": "dsr"}
	svc2 := e.createService(s2)
	e.setEndpoints("dsr-noiface", false, ready(0))
	cip2 := netip.MustParseAddr(svc2.Spec.ClusterIP)
	f2 := e.waitFarm(kube.FarmName(e.ns, "dsr-noiface", "tcp", kube.KindCluster, cip2), hasBackends(1))
	if f2.Mode != model.ModeDNAT {
		t.Errorf("dsr without an interface: farm %s, want the default dnat", f2.AppendJSON(nil))
	}
	if got := e.spread(netip.AddrPortFrom(cip2, 80), false, 3); keys(got) != "b0" {
		t.Errorf("dsr without an interface: answers %v, want b0 (defaults)", got)
	}
	if ev := e.waitEvent("dsr-noiface", kube.ReasonRejected); !strings.Contains(ev.Message, "iface") {
		t.Errorf("event %q does not name iface", ev.Message)
	}
}

// spreadT is env.spread, failing t (a subtest) rather than the test that
// made the env.
func spreadT(t *testing.T, e *env, addr netip.AddrPort, udp bool, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for range n {
		ask := testutil.AskTCP
		if udp {
			local := netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(udpSourcePort.Add(1)))
			ask = func(ns netns.NsHandle, to netip.AddrPort) (string, error) { return testutil.AskUDPFrom(ns, local, to) }
		}
		got, err := ask(e.Client.NS, addr)
		if err != nil {
			t.Fatalf("ask %s: %v", addr, err)
		}
		name, _, err := testutil.ParseReply(got)
		if err != nil {
			t.Fatal(err)
		}
		out[name]++
	}
	return out
}
