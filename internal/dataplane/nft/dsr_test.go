package nft

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// flatHost is one namespace on the flat segment of a dsr test.
type flatHost struct {
	name   string
	ns     netns.NsHandle
	v4, v6 netip.Addr
}

// flatL2 is the layout DSR is made for: client, LB and backends on one
// Ethernet segment (a bridge in a namespace of its own). The LB holds the
// VIPs on its eth0, so the client resolves them to the LB's MAC; the
// backends hold them on lo with arp_ignore=1 and arp_announce=2 (and IPv6
// answers neighbour solicitations only for addresses of the receiving
// interface), so only the LB answers for them.
type flatL2 struct {
	client, lb flatHost
	backends   []flatHost
	vip4, vip6 netip.Addr
}

func newFlatL2(t *testing.T, backends int) *flatL2 {
	t.Helper()
	testutil.RequireRoot(t)
	_, sw := testutil.NewNetNS(t)
	swh, err := netlink.NewHandleAt(sw)
	if err != nil {
		t.Fatal(err)
	}
	defer swh.Close()
	if err := swh.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}); err != nil {
		t.Fatal(err)
	}
	br, err := swh.LinkByName("br0")
	if err != nil {
		t.Fatal(err)
	}
	if err := swh.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	l := &flatL2{vip4: netip.MustParseAddr("10.50.0.100"), vip6: netip.MustParseAddr("fd00:50::100")}
	n := 0
	host := func(last int) flatHost {
		name, h := testutil.NewNetNS(t)
		fh := flatHost{name: name, ns: h,
			v4: netip.AddrFrom4([4]byte{10, 50, 0, byte(last)}),
			v6: netip.MustParseAddr(fmt.Sprintf("fd00:50::%x", last))}
		port := fmt.Sprintf("p%d", n)
		n++
		if err := swh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index},
			PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h))}); err != nil {
			t.Fatalf("veth for %s: %v", name, err)
		}
		pl, err := swh.LinkByName(port)
		if err != nil {
			t.Fatal(err)
		}
		if err := swh.LinkSetUp(pl); err != nil {
			t.Fatal(err)
		}
		hh, err := netlink.NewHandleAt(h)
		if err != nil {
			t.Fatal(err)
		}
		defer hh.Close()
		eth, err := hh.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []netip.Prefix{netip.PrefixFrom(fh.v4, 24), netip.PrefixFrom(fh.v6, 64)} {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
			if err := hh.AddrAdd(eth, a); err != nil {
				t.Fatalf("address %s on %s: %v", p, name, err)
			}
		}
		if err := hh.LinkSetUp(eth); err != nil {
			t.Fatal(err)
		}
		return fh
	}
	l.client = host(2)
	l.lb = host(1)
	for i := range backends {
		l.backends = append(l.backends, host(11+i))
	}
	// The LB holds the VIPs (clients find them by ARP / ND).
	testutil.Run(t, l.lb.name, "ip", "addr", "add", l.vip4.String()+"/32", "dev", "eth0")
	testutil.Run(t, l.lb.name, "ip", "addr", "add", l.vip6.String()+"/128", "dev", "eth0", "nodad")
	for i, b := range l.backends {
		for _, s := range []string{"net/ipv4/conf/all/arp_ignore=1", "net/ipv4/conf/all/arp_announce=2"} {
			k, v, _ := strings.Cut(s, "=")
			if err := testutil.WriteSysctl(b.ns, k, v); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Run(t, b.name, "ip", "addr", "add", l.vip4.String()+"/32", "dev", "lo")
		testutil.Run(t, b.name, "ip", "addr", "add", l.vip6.String()+"/128", "dev", "lo", "nodad")
		name := fmt.Sprintf("b%d", i)
		for _, vip := range []netip.Addr{l.vip4, l.vip6} {
			testutil.StartTCPServer(t, b.ns, netip.AddrPortFrom(vip, 80), name)
			testutil.StartUDPServer(t, b.ns, netip.AddrPortFrom(vip, 53), name)
		}
	}
	return l
}

// farm returns a dsr farm on vip:port over the backends.
func (l *flatL2) farm(name string, vip netip.Addr, port uint16, proto model.Protocol, s model.Scheduler, keys model.HashKey) model.Farm {
	f := model.NewFarm(name)
	f.VirtualAddr = vip
	if vip.Is6() {
		f.Family = model.FamilyIPv6
	}
	f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
	f.Protocol, f.Mode, f.Scheduler, f.SchedParam = proto, model.ModeDSR, s, keys
	for i, b := range l.backends {
		bk := model.NewBackend(fmt.Sprintf("b%d", i))
		bk.Addr = b.v4
		if vip.Is6() {
			bk.Addr = b.v6
		}
		f.Backends = append(f.Backends, bk)
	}
	return f
}

// replyCounter counts, on the LB's eth0, packets from the VIPs: the
// backends' replies, if any reached the LB.
func (l *flatL2) replyCounter(t *testing.T) func() int {
	t.Helper()
	testutil.Run(t, l.lb.name, "nft", "add", "table", "netdev", "probe")
	testutil.Run(t, l.lb.name, "nft", "add", "chain", "netdev", "probe", "c", "{ type filter hook ingress device eth0 priority -500; }")
	testutil.Run(t, l.lb.name, "nft", "add", "rule", "netdev", "probe", "c", "ip", "saddr", l.vip4.String(), "counter")
	testutil.Run(t, l.lb.name, "nft", "add", "rule", "netdev", "probe", "c", "ip6", "saddr", l.vip6.String(), "counter")
	re := regexp.MustCompile(`counter packets (\d+)`)
	return func() int {
		out := testutil.Run(t, l.lb.name, "nft", "list", "chain", "netdev", "probe", "c")
		sum := 0
		for _, m := range re.FindAllStringSubmatch(out, -1) {
			n, _ := strconv.Atoi(m[1])
			sum += n
		}
		return sum
	}
}

func apply(t *testing.T, p dataplane.Dataplane, prev map[string]*model.Farm, farms ...model.Farm) error {
	t.Helper()
	var d plan.Diff
	for i := range farms {
		f := farms[i].Clone()
		if err := f.Validate(); err != nil {
			t.Fatalf("farm %s: %v", f.Name, err)
		}
		if err := p.Check(&f); err != nil {
			t.Fatalf("farm %s: %v", f.Name, err)
		}
		d.Changes = append(d.Changes, plan.FarmChange{Old: prev[f.Name], New: &f})
	}
	if err := p.Apply(context.Background(), d); err != nil {
		return err
	}
	for _, c := range d.Changes {
		prev[c.New.Name] = c.New
	}
	return nil
}

// TestDSRFlatL2 sends TCP and UDP, over IPv4 and IPv6, from a client to
// VIPs held by the LB, on one Ethernet segment. The LB forwards each
// request to a backend by MAC (interfaces and MACs found by the plane);
// the backend sees the client's own address and answers it directly: no
// reply passes the LB. The spread follows the scheduler: rr over UDP
// datagrams, hash srcip over TCP connections.
func TestDSRFlatL2(t *testing.T) {
	l := newFlatL2(t, 3)
	p := newPlane(t, l.lb.ns)
	replies := l.replyCounter(t)
	prev := map[string]*model.Farm{}
	for _, v6 := range []bool{false, true} {
		vip, client := l.vip4, l.client.v4
		if v6 {
			vip, client = l.vip6, l.client.v6
		}
		fam := pick(v6, "ipv4", "ipv6")
		udp := l.farm("dsr-udp-"+fam, vip, 53, model.ProtoUDP, model.SchedRR, 0)
		tcp := l.farm("dsr-tcp-"+fam, vip, 80, model.ProtoTCP, model.SchedHash, model.KeySrcIP)
		if err := apply(t, p, prev, udp, tcp); err != nil {
			t.Fatalf("apply: %v", err)
		}
		count := map[string]int{}
		for range 30 {
			got, err := testutil.AskUDP(l.client.ns, netip.AddrPortFrom(vip, 53))
			if err != nil {
				t.Fatalf("%s udp: %v", fam, err)
			}
			name, from, err := testutil.ParseReply(got)
			if err != nil {
				t.Fatal(err)
			}
			if from.Addr() != client {
				t.Errorf("%s udp: backend saw %s, want the client's %s", fam, from, client)
			}
			count[name]++
		}
		for i := range l.backends {
			if c := count[fmt.Sprintf("b%d", i)]; c < 8 || c > 12 {
				t.Errorf("%s udp rr: b%d answered %d of 30, want 10 ± 2 (all: %v)", fam, i, c, count)
			}
		}
		// hash srcip: one client address always lands on one backend;
		// several addresses spread.
		seen := map[string]bool{}
		for i := range 6 {
			src := netip.AddrFrom4([4]byte{10, 50, 0, byte(30 + i)})
			bits := 24
			if v6 {
				src, bits = netip.MustParseAddr(fmt.Sprintf("fd00:50::%x", 0x30+i)), 64
			}
			testutil.Run(t, l.client.name, "ip", "addr", "add", netip.PrefixFrom(src, bits).String(), "dev", "eth0", "nodad")
			first := ""
			for range 3 {
				got, err := testutil.AskTCPFrom(l.client.ns, netip.AddrPortFrom(src, 0), netip.AddrPortFrom(vip, 80))
				if err != nil {
					t.Fatalf("%s tcp from %s: %v", fam, src, err)
				}
				name, from, err := testutil.ParseReply(got)
				if err != nil {
					t.Fatal(err)
				}
				if from.Addr() != src {
					t.Errorf("%s tcp: backend saw %s, want %s", fam, from, src)
				}
				if first == "" {
					first = name
				} else if name != first {
					t.Errorf("%s tcp hash srcip: %s went to %s, then %s", fam, src, first, name)
				}
			}
			seen[first] = true
		}
		if len(seen) < 2 {
			t.Errorf("%s tcp hash srcip: 6 client addresses all went to %v", fam, seen)
		}
	}
	if n := replies(); n != 0 {
		t.Errorf("the LB saw %d packets from the VIPs: replies must go from the backends to the client directly", n)
	}
	out := testutil.Run(t, l.lb.name, "nft", "list", "table", "netdev", DefaultTable)
	for _, want := range []string{"hook ingress device \"eth0\"", "fwd to", "ether saddr set", "ether daddr set"} {
		if !strings.Contains(out, want) {
			t.Errorf("netdev table lacks %q:\n%s", want, out)
		}
	}

	// Reconcile rebuilds the same and keeps traffic flowing; deleting the
	// farms removes the device chain.
	var farms []*model.Farm
	for _, f := range prev {
		farms = append(farms, f)
	}
	if err := p.Reconcile(context.Background(), farms); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if _, err := testutil.AskUDP(l.client.ns, netip.AddrPortFrom(l.vip4, 53)); err != nil {
		t.Errorf("after reconcile: %v", err)
	}
	var d plan.Diff
	for _, f := range prev {
		d.Changes = append(d.Changes, plan.FarmChange{Old: f})
	}
	if err := p.Apply(context.Background(), d); err != nil {
		t.Fatalf("delete: %v", err)
	}
	out = testutil.Run(t, l.lb.name, "nft", "list", "table", "netdev", DefaultTable)
	if strings.Contains(out, "hook ingress") || strings.Contains(out, "chain d-") {
		t.Errorf("deleted farms left chains behind:\n%s", out)
	}
}

// TestDSRResolveErrors: when an interface or a MAC cannot be found the
// change is refused with an error naming the field, and the kernel is
// left as it was. Set explicitly (nftlb's iface, oface, ether-addr), the
// lookups are skipped.
func TestDSRResolveErrors(t *testing.T) {
	l := newFlatL2(t, 1)
	p := newPlane(t, l.lb.ns)
	prev := map[string]*model.Farm{}
	testutil.Run(t, l.lb.name, "ip", "route", "add", "10.60.0.0/24", "via", l.client.v4.String())
	ruleset := func() string { return testutil.Run(t, l.lb.name, "nft", "list", "ruleset") }
	before := ruleset()
	cases := []struct {
		name string
		edit func(f *model.Farm)
		want []string
	}{
		{"no neighbour", func(f *model.Farm) {
			f.Backends[0].Addr = netip.MustParseAddr("10.50.0.99")
		}, []string{`backend "b0"`, `"ether-addr"`, "10.50.0.99", "no neighbour entry on eth0", "set ether-addr"}},
		{"no such iface", func(f *model.Farm) { f.Iface = "nope0" }, []string{`"iface"`, `"nope0"`, "no such interface"}},
		{"no such oface", func(f *model.Farm) { f.Oface = "nope1" }, []string{`"oface"`, `"nope1"`, "no such interface"}},
		{"behind a gateway", func(f *model.Farm) {
			f.Backends[0].Addr = netip.MustParseAddr("10.60.0.5")
		}, []string{`backend "b0"`, `"ip-addr"`, "gateway 10.50.0.2", "own link"}},
		{"vip nowhere", func(f *model.Farm) {
			f.VirtualAddr = netip.MustParseAddr("10.70.0.1")
		}, []string{`"iface"`, "no interface holds 10.70.0.1", "set iface"}},
	}
	for _, c := range cases {
		f := l.farm("bad", l.vip4, 53, model.ProtoUDP, model.SchedRR, 0)
		c.edit(&f)
		err := apply(t, p, prev, f)
		if err == nil {
			t.Errorf("%s: applied", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
		if after := ruleset(); after != before {
			t.Errorf("%s: refused change altered the kernel:\n%s\n%s", c.name, before, after)
		}
	}

	// Everything given: no lookups needed, and the frames carry the
	// given source MAC.
	bmac := linkMAC(t, l.backends[0].ns, "eth0")
	f := l.farm("given", l.vip4, 53, model.ProtoUDP, model.SchedRR, 0)
	f.Iface, f.Oface = "eth0", "eth0"
	f.EtherAddr = model.EtherAddr{0x02, 0xaa, 0, 0, 0, 1}
	copy(f.Backends[0].EtherAddr[:], bmac)
	if err := apply(t, p, prev, f); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if _, err := testutil.AskUDP(l.client.ns, netip.AddrPortFrom(l.vip4, 53)); err != nil {
		t.Errorf("udp through a farm with iface, oface and ether-addrs given: %v", err)
	}
	if out := testutil.Run(t, l.lb.name, "nft", "list", "table", "netdev", DefaultTable); !strings.Contains(out, "ether saddr set 02:aa:00:00:00:01") {
		t.Errorf("farm ether-addr not used:\n%s", out)
	}

	// On start-up (Reconcile) one bad farm does not keep the others out:
	// a backend without a MAC is left out, a farm without its interface
	// is not programmed, the rest is.
	partial := l.farm("partial", l.vip4, 80, model.ProtoTCP, model.SchedHash, model.KeySrcIP|model.KeySrcPort)
	ghost := partial.Backends[0]
	ghost.Name, ghost.Addr = "ghost", netip.MustParseAddr("10.50.0.99")
	partial.Backends = append(partial.Backends, ghost)
	noIface := l.farm("noiface", l.vip4, 55, model.ProtoUDP, model.SchedRR, 0)
	noIface.Iface = "gone0"
	if err := p.Reconcile(context.Background(), []*model.Farm{prev["given"], &partial, &noIface}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	out := testutil.Run(t, l.lb.name, "nft", "list", "table", "netdev", DefaultTable)
	if !strings.Contains(out, farmDsr+nameHash("partial")) || strings.Contains(out, farmDsr+nameHash("noiface")) {
		t.Errorf("after reconcile want partial's chain and no noiface chain:\n%s", out)
	}
	for range 4 {
		got, err := testutil.AskTCP(l.client.ns, netip.AddrPortFrom(l.vip4, 80))
		if err != nil || !strings.HasPrefix(got, "b0 ") {
			t.Errorf("partial farm: %q, %v; want b0, its reachable backend", got, err)
		}
	}
	if _, err := testutil.AskUDP(l.client.ns, netip.AddrPortFrom(l.vip4, 53)); err != nil {
		t.Errorf("given farm after reconcile: %v", err)
	}
}

func linkMAC(t *testing.T, ns netns.NsHandle, name string) net.HardwareAddr {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lk, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return lk.Attrs().HardwareAddr
}

// TestDSRModeChange: a farm moving into and out of mode dsr moves between
// the inet and netdev tables in one Apply each, leaving nothing behind.
func TestDSRModeChange(t *testing.T) {
	l := newFlatL2(t, 2)
	p := newPlane(t, l.lb.ns)
	prev := map[string]*model.Farm{}
	f := l.farm("moving", l.vip4, 53, model.ProtoUDP, model.SchedRR, 0)
	f.Mode = model.ModeDNAT
	if err := apply(t, p, prev, f); err != nil {
		t.Fatalf("dnat: %v", err)
	}
	f.Mode = model.ModeDSR
	if err := apply(t, p, prev, f); err != nil {
		t.Fatalf("dnat -> dsr: %v", err)
	}
	if _, err := testutil.AskUDP(l.client.ns, netip.AddrPortFrom(l.vip4, 53)); err != nil {
		t.Errorf("dsr after dnat: %v", err)
	}
	if out := testutil.Run(t, l.lb.name, "nft", "list", "table", "inet", DefaultTable); hasFarmRules(out, "moving") {
		t.Errorf("dsr farm left its inet chain:\n%s", out)
	}
	f.Mode = model.ModeDNAT
	if err := apply(t, p, prev, f); err != nil {
		t.Fatalf("dsr -> dnat: %v", err)
	}
	out := testutil.Run(t, l.lb.name, "nft", "list", "table", "netdev", DefaultTable)
	if strings.Contains(out, "chain d-") || strings.Contains(out, "hook ingress") || strings.Contains(out, "10.50.0.100") {
		t.Errorf("dnat farm left dsr objects:\n%s", out)
	}
	if out := testutil.Run(t, l.lb.name, "nft", "list", "table", "inet", DefaultTable); !hasFarmRules(out, "moving") {
		t.Errorf("dnat farm has no inet chain:\n%s", out)
	}
}

// TestDSRSchedulers: weight, symhash and maglev dsr farms carry traffic to
// every backend and nft lists them.
func TestDSRSchedulers(t *testing.T) {
	l := newFlatL2(t, 2)
	p := newPlane(t, l.lb.ns)
	prev := map[string]*model.Farm{}
	w := l.farm("w", l.vip4, 53, model.ProtoUDP, model.SchedWeight, 0)
	w.Backends[1].Weight = 3
	sym := l.farm("sym", l.vip4, 80, model.ProtoTCP, model.SchedSymhash, model.KeySrcIP|model.KeySrcPort)
	mag := l.farm("mag", l.vip6, 80, model.ProtoTCP, model.SchedMaglev, 0)
	if err := apply(t, p, prev, w, sym, mag); err != nil {
		t.Fatal(err)
	}
	ask := func(proto string, to netip.AddrPort) map[string]int {
		seen := map[string]int{}
		for range 40 {
			var got string
			var err error
			if proto == "udp" {
				got, err = testutil.AskUDP(l.client.ns, to)
			} else {
				got, err = testutil.AskTCP(l.client.ns, to)
			}
			if err != nil {
				t.Fatalf("%s %s: %v", proto, to, err)
			}
			name, _, _ := testutil.ParseReply(got)
			seen[name]++
		}
		return seen
	}
	if c := ask("udp", netip.AddrPortFrom(l.vip4, 53)); c["b1"] < 20 || c["b0"] == 0 {
		t.Errorf("weight 1:3 over 40 datagrams: %v", c)
	}
	for _, to := range []netip.AddrPort{netip.AddrPortFrom(l.vip4, 80), netip.AddrPortFrom(l.vip6, 80)} {
		if c := ask("tcp", to); c["b0"] == 0 || c["b1"] == 0 {
			t.Errorf("tcp %s: %v, want both backends", to, c)
		}
	}
	out := testutil.Run(t, l.lb.name, "nft", "list", "table", "netdev", DefaultTable)
	for _, want := range []string{"numgen random mod 4", "symhash mod 2", "jhash ip6 saddr . ip6 daddr . th sport . th dport mod 251"} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}
}

// TestDSRDual: a family dual dsr farm forwards each VIP to the backends of
// its family.
func TestDSRDual(t *testing.T) {
	l := newFlatL2(t, 2)
	p := newPlane(t, l.lb.ns)
	f := l.farm("dual", l.vip4, 80, model.ProtoTCP, model.SchedHash, model.KeySrcIP|model.KeySrcPort)
	f.Family, f.VirtualAddr2 = model.FamilyDual, l.vip6
	for i, b := range l.backends {
		b6 := model.NewBackend(fmt.Sprintf("b%d-v6", i))
		b6.Addr = b.v6
		f.Backends = append(f.Backends, b6)
	}
	if err := apply(t, p, map[string]*model.Farm{}, f); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []netip.Addr{l.vip4, l.vip6} {
		client := l.client.v4
		if vip.Is6() {
			client = l.client.v6
		}
		seen := map[string]bool{}
		for range 16 {
			got, err := testutil.AskTCP(l.client.ns, netip.AddrPortFrom(vip, 80))
			if err != nil {
				t.Fatalf("%s: %v", vip, err)
			}
			name, from, _ := testutil.ParseReply(got)
			seen[name] = true
			if from.Addr() != client {
				t.Errorf("%s: backend saw %s, want %s", vip, from, client)
			}
		}
		if !seen["b0"] || !seen["b1"] {
			t.Errorf("%s: answers from %v, want b0 and b1", vip, seen)
		}
	}
}
