package nftlb

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestSideBySideStlsIngress: a stlsdnat farm with nftlb's iface, oface and
// ether-addr (its stateless DNAT at netdev ingress, forwarding frames at
// layer 2 both ways), posted to both daemons, each in a namespace with the
// two interfaces (veths, up: the clients' cli0 holds the VIP, the
// backends' bck0 their network).
//
// Both answer success and GET prints the farm alike (nftlb 1.0.7 prints no
// iface, oface or ether-addr, xlb prints them: extraXlb). What each
// programs differs, and this is nftlb 1.0.7's own failure, recorded here
// as seen: it builds the rules nftlb's design calls for (an ingress chain
// on iface whose farm chain learns `update @map-<farm>-back { ip saddr :
// ether saddr }`, rewrites `ip daddr` and `th dport`, sets the backend's
// MAC and does `fwd to <oface>`; an ingress chain on oface whose reverse
// chain sets `ip saddr` to the VIP and the client's MAC and does `fwd to
// <iface>`), but adds the reverse element to the map of iface
// (proto-services-dnat-<iface>) instead of oface's, so its batch fails
// ("No such file or directory; did you mean map
// 'proto-services-dnat-<oface>'"), it deletes its netdev table and
// programs nothing: no traffic passes through nftlb. (Its map of clients'
// MACs also takes persist-ttl as its timeout, not responsettl, and its
// replies keep the backend's port as their source port.) So traffic over
// two segments is xlb's alone (conformance mode-stlsdnat-ingress*), and
// compared with nftlb's on one arm, where nftlb works
// (TestSideBySideStlsIngressTraffic). The test fails if a later nftlb
// programs this farm: then compare traffic over two segments too.
func TestSideBySideStlsIngress(t *testing.T) {
	nftlb, xlb := startPeers(t)
	for _, p := range []*peer{nftlb, xlb} {
		for _, c := range [][]string{
			{"ip", "link", "add", "cli0", "type", "veth", "peer", "name", "cli1"},
			{"ip", "link", "add", "bck0", "address", "02:00:00:00:00:b0", "type", "veth", "peer", "name", "bck1"},
			{"ip", "addr", "add", "10.0.7.1/24", "dev", "cli0"},
			{"ip", "addr", "add", "10.1.0.1/24", "dev", "bck0"},
			{"ip", "link", "set", "cli0", "up"}, {"ip", "link", "set", "cli1", "up"},
			{"ip", "link", "set", "bck0", "up"}, {"ip", "link", "set", "bck1", "up"},
		} {
			testutil.Run(t, p.nsName, c...)
		}
	}
	farm := `{"farms":[{"name":"sti","family":"ipv4","virtual-addr":"10.0.7.1","virtual-ports":"53","protocol":"udp","mode":"stlsdnat",
		"iface":"cli0","oface":"bck0","ether-addr":"02:00:00:00:00:b0","scheduler":"hash","sched-param":"srcip","responsettl":"30","state":"up",
		"backends":[{"name":"s1","ip-addr":"10.1.0.41","ether-addr":"02:00:00:00:00:41","port":"5353","state":"up"},
		{"name":"s2","ip-addr":"10.1.0.42","ether-addr":"02:00:00:00:00:42","port":"5353","state":"up"}]}]}`
	run(t, nftlb, xlb, []step{
		same("a stlsdnat farm at ingress", "POST", "/farms", farm),
		get("/farms/sti"), get("/farms"),
	})
	// xlb's GET carries the fields back.
	g := xlb.do(t, "GET", "/farms/sti", "")
	for _, w := range []string{`"iface":"cli0"`, `"oface":"bck0"`, `"ether-addr":"02:00:00:00:00:b0"`, `"ether-addr":"02:00:00:00:00:41"`, `"responsettl":"30"`} {
		if !strings.Contains(g.body, w) {
			t.Errorf("xlb's GET lacks %s:\n%s", w, g.body)
		}
	}
	n := normRules(testutil.Run(t, nftlb.nsName, "nft", "list", "ruleset"))
	if strings.Contains(n, "hook ingress") || strings.Contains(n, "fwd to") {
		t.Errorf("nftlb 1.0.7 programmed the stlsdnat farm at ingress, which it failed to do when this test was written: compare traffic now\n%s", n)
	}
	x := normRules(testutil.Run(t, xlb.nsName, "nft", "list", "ruleset"))
	for _, w := range []string{
		`hook ingress device "cli0"`, `hook ingress device "bck0"`,
		`iifname != "cli0" accept`, `iifname != "bck0" accept`,
		"ip daddr set jhash ip saddr mod", "th dport set 5353",
		"ip saddr set 10.0.7.1 th sport set 53",
		"flags dynamic,timeout timeout 30s",
		"10.1.0.41 : 02:00:00:00:00:41", "10.1.0.42 : 02:00:00:00:00:42",
		"goto l2to", "goto l2back",
		"fwd to ip daddr . meta l4proto . th dport map @l2to4",
		"fwd to ip saddr . meta l4proto . th sport map @l2back4",
	} {
		if !strings.Contains(x, w) {
			t.Errorf("xlb's ruleset lacks %q:\n%s", w, x)
		}
	}
	// Bad input: nftlb answers success to each (and programs nothing
	// that could work); xlb says what is wrong and changes nothing.
	before := xlb.do(t, "GET", "/farms", "")
	var steps []step
	for _, c := range []struct{ name, body, with, why string }{
		{"an iface that does not exist", `"iface":"nope0","oface":"bck0"`, `"iface" value "nope0": no such interface`,
			"nftlb keeps the farm and programs nothing for it"},
		{"oface without iface", `"oface":"bck0"`, `"oface" value "bck0": needs iface in mode stlsdnat`,
			"nftlb takes the interface holding the VIP; xlb's stlsdnat without iface is routed by the kernel, so it asks"},
		{"a malformed ether-addr", `"iface":"cli0","ether-addr":"02:00:00:00:00:0g"`, `"ether-addr" value "02:00:00:00:00:0g"`,
			"nftlb keeps a malformed MAC"},
	} {
		steps = append(steps, refused(c.name, `{"farms":[{"name":"bad","virtual-addr":"10.0.7.1","virtual-ports":"54","protocol":"udp",
			"mode":"stlsdnat","scheduler":"hash",`+c.body+`,"backends":[{"name":"s1","ip-addr":"10.1.0.41","ether-addr":"02:00:00:00:00:41","port":"5353"}]}]}`,
			c.with, c.why)...)
	}
	run(t, nftlb, xlb, steps)
	if after := xlb.do(t, "GET", "/farms", ""); after.body != before.body {
		t.Errorf("refused farms changed xlb's farms:\nbefore:\n%s\nafter:\n%s", before.body, after.body)
	}
	if y := normRules(testutil.Run(t, xlb.nsName, "nft", "list", "ruleset")); y != x {
		t.Errorf("refused farms changed xlb's ruleset:\nbefore:\n%s\nafter:\n%s", x, y)
	}
}

// oneArm puts p's namespace (the LB) on one Ethernet segment with a client
// (10.0.1.2, routed through the LB's 10.0.1.1) and a backend (10.0.2.11,
// routed through the LB's 10.0.2.1) serving UDP 53 and TCP 80. The LB
// holds the VIP 10.0.1.100 and does not forward IP: what reaches the
// backend was forwarded at layer 2. It returns the client's namespace and
// the LB's and the backend's MACs.
func oneArm(t *testing.T, p *peer) (client netns.NsHandle, lbMAC, beMAC string) {
	t.Helper()
	sw, _ := testutil.NewNetNS(t)
	testutil.Run(t, sw, "ip", "link", "add", "br0", "type", "bridge")
	testutil.Run(t, sw, "ip", "link", "set", "br0", "up")
	cl, clh := testutil.NewNetNS(t)
	be, beh := testutil.NewNetNS(t)
	for i, n := range []string{cl, p.nsName, be} {
		port := fmt.Sprintf("p%d", i)
		testutil.Run(t, sw, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n)
		testutil.Run(t, sw, "ip", "link", "set", port, "master", "br0")
		testutil.Run(t, sw, "ip", "link", "set", port, "up")
		testutil.Run(t, n, "ip", "link", "set", "eth0", "up")
	}
	testutil.Run(t, cl, "ip", "addr", "add", "10.0.1.2/24", "dev", "eth0")
	testutil.Run(t, cl, "ip", "route", "add", "default", "via", "10.0.1.1")
	for _, a := range []string{"10.0.1.1/24", "10.0.2.1/24", "10.0.1.100/32"} {
		testutil.Run(t, p.nsName, "ip", "addr", "add", a, "dev", "eth0")
	}
	if err := testutil.WriteSysctl(p.ns, "net/ipv4/ip_forward", "0"); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, be, "ip", "addr", "add", "10.0.2.11/24", "dev", "eth0")
	testutil.Run(t, be, "ip", "route", "add", "default", "via", "10.0.2.1")
	testutil.StartUDPServer(t, beh, netip.MustParseAddrPort("0.0.0.0:53"), "be")
	testutil.StartTCPServer(t, beh, netip.MustParseAddrPort("0.0.0.0:80"), "be")
	mac := func(n string) string {
		out := testutil.Run(t, n, "cat", "/sys/class/net/eth0/address")
		return strings.TrimSpace(out)
	}
	return clh, mac(p.nsName), mac(be)
}

// TestSideBySideStlsIngressTraffic: one arm (iface and oface the same
// interface), where nftlb 1.0.7 programs stlsdnat at ingress (its element
// then lands in the right map): the same farms posted to both, UDP and
// TCP through each, with the LB's IP forwarding off. The backend sees the
// client's address and the client gets its answers from the VIP, through
// nftlb and through xlb alike. The backends serve on the virtual ports:
// nftlb's replies keep the backend's port as their source.
func TestSideBySideStlsIngressTraffic(t *testing.T) {
	nftlb, xlb := startPeers(t)
	for _, p := range []*peer{nftlb, xlb} {
		client, lbMAC, beMAC := oneArm(t, p)
		var farms []string
		for _, c := range []struct{ name, port, proto string }{{"stu", "53", "udp"}, {"stt", "80", "tcp"}} {
			farms = append(farms, `{"name":"`+c.name+`","family":"ipv4","virtual-addr":"10.0.1.100","virtual-ports":"`+c.port+`","protocol":"`+c.proto+`",
				"mode":"stlsdnat","iface":"eth0","oface":"eth0","ether-addr":"`+lbMAC+`","scheduler":"hash","sched-param":"srcip","responsettl":"30","state":"up",
				"backends":[{"name":"s1","ip-addr":"10.0.2.11","ether-addr":"`+beMAC+`","port":"`+c.port+`","state":"up"}]}`)
		}
		if r := p.do(t, "POST", "/farms", `{"farms":[`+strings.Join(farms, ",")+`]}`); r.status != 200 {
			t.Fatalf("%s: %d %s", p.name, r.status, r.body)
		}
		for _, ask := range []struct {
			proto string
			f     func(netns.NsHandle, netip.AddrPort) (string, error)
			port  uint16
		}{{"udp", testutil.AskUDP, 53}, {"tcp", testutil.AskTCP, 80}} {
			got, err := ask.f(client, netip.AddrPortFrom(netip.MustParseAddr("10.0.1.100"), ask.port))
			if err != nil {
				t.Errorf("%s, %s to the VIP: %v\n%s", p.name, ask.proto, err, testutil.Run(t, p.nsName, "nft", "list", "ruleset"))
				continue
			}
			if _, from, err := testutil.ParseReply(got); err != nil || from.Addr() != netip.MustParseAddr("10.0.1.2") {
				t.Errorf("%s, %s: backend saw %s (%v), want the client's 10.0.1.2", p.name, ask.proto, from, err)
			}
		}
	}
}
