package nftlb

import (
	"strings"
	"testing"

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
// replies keep the backend's port as their source port.) So traffic is
// compared with nftlb's design, not its output: the conformance scenarios
// mode-stlsdnat-ingress* show xlb's. The test fails if a later nftlb
// programs the farm: then compare traffic.
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
		"fwd to @ll,48,48 . ip daddr . meta l4proto . th dport map @l2fwd4",
		"fwd to @ll,48,48 . ip saddr . meta l4proto . th sport map @l2fwd4",
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
