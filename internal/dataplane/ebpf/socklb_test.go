package ebpf

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.AskMain() // the socket-LB tests' client processes
	os.Exit(m.Run())
}

// answeredBy checks that every answer came through and that each socket
// saw peer (getpeername / recvfrom) while the backend saw from; it counts
// answers per backend.
func answeredBy(t *testing.T, answers []testutil.Answer, peer netip.AddrPort, from netip.Addr) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i, a := range answers {
		if a.Err != "" {
			t.Fatalf("request %d to %s: %s", i, peer, a.Err)
		}
		if a.Peer != peer.String() {
			t.Errorf("request %d: the socket says its peer is %s, want the service address %s", i, a.Peer, peer)
		}
		name, seen, err := testutil.ParseReply(a.Reply)
		if err != nil {
			t.Fatal(err)
		}
		if seen.Addr() != from {
			t.Errorf("request %d: backend %s saw source %s, want %s", i, name, seen, from)
		}
		counts[name]++
	}
	return counts
}

// cgroupPrograms returns how many programs are attached to the cgroup dir
// at each socket hook.
func cgroupPrograms(t *testing.T, dir string) map[string]int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	out := map[string]int{}
	var objs sockObjects
	for _, h := range objs.hooks() {
		r, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: h.attach})
		if err != nil {
			t.Fatalf("query %s programs of %s: %v", h.name, dir, err)
		}
		out[h.name] = len(r.Programs)
	}
	return out
}

// TestSocketLB: processes of the node itself (the LB namespace), in the
// cgroup given to the plane, reach services through the socket programs:
// connect() and sendmsg() go to a backend, getpeername() and recvfrom()
// show the service address, and the tc program does no NAT for any of it
// (its new-flow and conntrack counters stay put). Processes outside the
// group, and those of the group in another namespace, are left alone. A
// restart updates the links in place; Destroy detaches everything.
func TestSocketLB(t *testing.T) {
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3, IPv6: true})
	var tcp4, tcp6, udp4 []string
	for i, b := range topo.Backends {
		name := fmt.Sprintf("be%d", i)
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), name)
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv6, 8080), name)
		testutil.StartUDPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8053), name)
		tcp4 = append(tcp4, netip.AddrPortFrom(b.IPv4, 8080).String())
		tcp6 = append(tcp6, netip.AddrPortFrom(b.IPv6, 8080).String())
		udp4 = append(udp4, netip.AddrPortFrom(b.IPv4, 8053).String())
	}
	cg := testutil.NewCgroup(t)
	pin := mountBPFFS(t)
	opts := Options{NetNS: topo.LB.NS, PinPath: pin, ConnTableSize: 16384, SocketCgroup: cg.Dir}
	p, err := New(context.Background(), testLogger(t), opts)
	if err != nil {
		t.Fatalf("new ebpf plane: %v", err)
	}
	defer func() {
		if p != nil {
			p.Close()
		}
	}()

	web4 := netip.AddrPortFrom(testutil.VIP4(21), 80)
	web6 := netip.AddrPortFrom(testutil.VIP6(21), 80)
	dns := netip.AddrPortFrom(testutil.VIP4(22), 53)
	empty := netip.AddrPortFrom(testutil.VIP4(23), 80)
	farms := []*model.Farm{
		farm(t, "web4", web4.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR, tcp4...),
		farm(t, "web6", web6.Addr().String(), 80, model.ProtoTCP, model.ModeSNAT, model.SchedRR, tcp6...),
		farm(t, "dns", dns.Addr().String(), 53, model.ProtoUDP, model.ModeDNAT, model.SchedRR, udp4...),
		farm(t, "empty", empty.Addr().String(), 80, model.ProtoTCP, model.ModeDNAT, model.SchedRR),
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	if got := cgroupPrograms(t, cg.Dir); fmt.Sprint(got) != "map[connect4:1 connect6:1 getpeername4:1 getpeername6:1 recvmsg4:1 recvmsg6:1 sendmsg4:1 sendmsg6:1]" {
		t.Fatalf("programs attached to the cgroup: %v", got)
	}
	tc0, _ := p.Stats()

	// TCP over IPv4 and IPv6: every connection to a backend of its own
	// (rr), from the node's own address (no snat: the node talks to the
	// backend itself), the socket showing the service address.
	const n = 30
	checkSpread(t, answeredBy(t, cg.Ask(t, topo.LB.Name, testutil.AskTCPMode, web4, n), web4, topo.LBBack4), n, 3)
	checkSpread(t, answeredBy(t, cg.Ask(t, topo.LB.Name, testutil.AskTCPMode, web6, n), web6, topo.LBBack6), n, 3)

	// UDP: one unconnected socket's datagrams stay on one backend (as
	// conntrack would keep its flow); each new socket takes the next.
	seen := map[string]bool{}
	for range 3 {
		counts := answeredBy(t, cg.Ask(t, topo.LB.Name, testutil.AskUDPMode, dns, 5), dns, topo.LBBack4)
		if len(counts) != 1 {
			t.Errorf("one socket's datagrams went to %v, want one backend", counts)
		}
		for name := range counts {
			seen[name] = true
		}
	}
	if len(seen) != 3 {
		t.Errorf("three sockets reached %v, want three backends (rr)", seen)
	}
	counts := answeredBy(t, cg.Ask(t, topo.LB.Name, testutil.AskUDPConnMode, dns, 5), dns, topo.LBBack4)
	if len(counts) != 1 {
		t.Errorf("a connected socket's datagrams went to %v, want one backend", counts)
	}

	// A service without backends refuses the connection.
	a := cg.Ask(t, topo.LB.Name, testutil.AskTCPMode, empty, 1)[0]
	if !strings.Contains(a.Err, "connection refused") {
		t.Errorf("connect to a service without backends: %+v, want connection refused", a)
	}

	tc1, _ := p.Stats()
	for _, c := range []string{"new_flow", "ct_fwd", "ct_reply", "no_backend"} {
		if tc1[c] != tc0[c] {
			t.Errorf("tc program counter %s went from %d to %d: the node's own connections took the per-packet path", c, tc0[c], tc1[c])
		}
	}
	ss, err := p.SockStats()
	if err != nil {
		t.Fatal(err)
	}
	// 60 TCP connections, 3x5 datagrams sent unconnected (3 choices, 12
	// of them sticky), one connected UDP socket.
	if ss["xlate"] != 2*n+15+1 || ss["sticky"] != 12 || ss["refused"] != 1 {
		t.Errorf("socket counters %v, want xlate %d, sticky 12, refused 1", ss, 2*n+16)
	}
	t.Logf("tc counters %v; socket counters %v", tc1, ss)

	// Not in the group: this test process, in the LB namespace, is not
	// balanced at the socket (the LB namespace has no route to the VIP).
	if s, err := testutil.AskTCP(topo.LB.NS, web4); err == nil {
		t.Errorf("a process outside the cgroup reached the service at the socket: %q", s)
	}
	// In the group but in another namespace: the client's connections
	// take the tc path (dnat: the backend sees the client).
	answeredBy(t, cg.Ask(t, topo.Client.Name, testutil.AskTCPMode, web4, 3), web4, topo.Client.IPv4)
	ss2, _ := p.SockStats()
	if ss2["xlate"] != ss["xlate"] || ss2["other_netns"] == ss["other_netns"] {
		t.Errorf("socket counters after other processes: %v (before %v): want xlate unchanged, other_netns up", ss2, ss)
	}

	// A restart gives the pinned links the new programs: still one
	// program per hook, and the node's connections keep working.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p, err = New(context.Background(), testLogger(t), opts)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatal(err)
	}
	if got := cgroupPrograms(t, cg.Dir); got["connect4"] != 1 || got["recvmsg6"] != 1 {
		t.Fatalf("after a restart, programs attached to the cgroup: %v", got)
	}
	checkSpread(t, answeredBy(t, cg.Ask(t, topo.LB.Name, testutil.AskTCPMode, web4, 9), web4, topo.LBBack4), 9, 3)

	// Destroy detaches the socket programs and removes their pins.
	err = p.Destroy()
	p = nil
	if err != nil {
		t.Fatal(err)
	}
	for hook, k := range cgroupPrograms(t, cg.Dir) {
		if k != 0 {
			t.Errorf("after Destroy, %d programs at %s", k, hook)
		}
	}
	entries, _ := os.ReadDir(pin)
	for _, e := range entries {
		t.Errorf("after Destroy, pin %s is left", e.Name())
	}
}
