package nftlb

import (
	"regexp"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestSideBySidePriority: nftlb's backend priority rule. A farm of two
// backends of priority 1 and a spare of priority 2, then the backends of
// level 1 going down one by one and coming back: both daemons print the
// same farm priority and backend states ("available" for the spare on
// standby), and program the same backends into the kernel.
func TestSideBySidePriority(t *testing.T) {
	nftlb, xlb := startPeers(t)
	linkPeers(t, nftlb, xlb)
	backends := func(states ...string) string {
		var b strings.Builder
		b.WriteString(`{"farms":[{"name":"f","backends":[`)
		for i, st := range states {
			if i > 0 {
				b.WriteString(",")
			}
			prio := "1"
			if i == 2 {
				prio = "2"
			}
			b.WriteString(`{"name":"b` + string(rune('1'+i)) + `","ip-addr":"10.1.0.` + string(rune('1'+i)) + `","port":"80","priority":"` + prio + `","state":"` + st + `"}`)
		}
		b.WriteString(`]}]}`)
		return b.String()
	}
	run(t, nftlb, xlb, []step{
		same("the farm", "POST", "/farms", `{"farms":[{"name":"f","virtual-addr":"10.0.0.1","virtual-ports":"80","mode":"dnat"}]}`),
		same("its backends", "POST", "/farms", backends("up", "up", "up")),
	})
	for _, c := range []struct {
		name    string
		states  []string
		serving []string // backend addresses in the kernel
		idle    []string
	}{
		{"all up: the spare stands by", []string{"up", "up", "up"}, []string{"10.1.0.1", "10.1.0.2"}, []string{"10.1.0.3"}},
		{"one of level 1 down: level 2, the spare serves", []string{"down", "up", "up"}, []string{"10.1.0.2", "10.1.0.3"}, []string{"10.1.0.1"}},
		{"both down: level 3", []string{"down", "down", "up"}, []string{"10.1.0.3"}, []string{"10.1.0.1", "10.1.0.2"}},
		{"one back", []string{"up", "down", "up"}, []string{"10.1.0.1", "10.1.0.3"}, []string{"10.1.0.2"}},
		{"one off", []string{"up", "off", "up"}, []string{"10.1.0.1", "10.1.0.3"}, []string{"10.1.0.2"}},
		{"all back", []string{"up", "up", "up"}, []string{"10.1.0.1", "10.1.0.2"}, []string{"10.1.0.3"}},
	} {
		run(t, nftlb, xlb, []step{same(c.name, "POST", "/farms", backends(c.states...)), get("/farms/f")})
		for _, p := range []*peer{nftlb, xlb} {
			rules := withoutCounters(normRules(testutil.Run(t, p.nsName, "nft", "list", "ruleset")))
			if p == nftlb {
				// nftlb schedules over backend marks (b1 is 0x1, ...)
				// and keeps the dnat entries of backends off (their
				// connections go on): the scheduler's map is what serves.
				sched := schedRE.FindString(rules)
				rules = ""
				for _, m := range markRE.FindAllStringSubmatch(sched, -1) {
					rules += "10.1.0." + m[1] + " "
				}
			}
			for _, a := range c.serving {
				if !strings.Contains(rules, a+" ") {
					t.Errorf("%s: %s's ruleset lacks %s:\n%s", c.name, p.name, a, rules)
				}
			}
			for _, a := range c.idle {
				if strings.Contains(rules, a+" ") {
					t.Errorf("%s: %s's ruleset holds %s:\n%s", c.name, p.name, a, rules)
				}
			}
		}
	}
}

var (
	schedRE = regexp.MustCompile(`numgen inc mod \d+ map \{[^}]*\}`)
	markRE  = regexp.MustCompile(`0x0000000(\d)`)
)

// linkPeers gives both namespaces the same links: nftlb programs a farm
// only when it finds the VIP's interface and a route to each backend.
func linkPeers(t *testing.T, peers ...*peer) {
	t.Helper()
	for _, p := range peers {
		for _, cmd := range [][]string{
			{"ip", "link", "add", "d0", "type", "veth", "peer", "name", "d0p"},
			{"ip", "link", "add", "d1", "type", "veth", "peer", "name", "d1p"},
			{"ip", "addr", "add", "10.0.0.1/24", "dev", "d0"},
			{"ip", "addr", "add", "10.1.0.254/24", "dev", "d1"},
			{"ip", "link", "set", "d0", "up"}, {"ip", "link", "set", "d0p", "up"},
			{"ip", "link", "set", "d1", "up"}, {"ip", "link", "set", "d1p", "up"},
		} {
			testutil.Run(t, p.nsName, cmd...)
		}
	}
}

// TestSideBySideUnusedAddress: an address object no farm uses (nftlb's
// README: "create a new address", then "assign an address to a farm").
// Both keep it ("used": "0") and program nothing for it: the rulesets are
// the same before and after, for an IPv4 and an IPv6 address. A farm that
// then names it serves on it in both; once no farm uses it, it is gone in
// both. xlb keeps it across a restart.
func TestSideBySideUnusedAddress(t *testing.T) {
	nftlb, xlb := startPeers(t)
	rules := func(p *peer) string { return normRules(testutil.Run(t, p.nsName, "nft", "list", "ruleset")) }
	before := map[*peer]string{nftlb: rules(nftlb), xlb: rules(xlb)}
	run(t, nftlb, xlb, []step{
		same("create a new address (README)", "POST", "/addresses", `{"addresses":[{"name":"lone4","family":"ipv4","ip-addr":"10.0.9.1","ports":"80","protocol":"tcp"}]}`),
		same("an IPv6 one", "POST", "/addresses", `{"addresses":[{"name":"lone6","family":"ipv6","ip-addr":"fd00::9:1","ports":"53","protocol":"udp"}]}`),
		get("/addresses"), get("/addresses/lone4"), get("/farms"),
		same("change an unused address", "POST", "/addresses", `{"addresses":[{"name":"lone6","ports":"53,5353"}]}`),
		get("/addresses/lone6"),
	})
	for _, p := range []*peer{nftlb, xlb} {
		if after := rules(p); after != before[p] {
			t.Errorf("%s programmed something for unused addresses:\nbefore: %.2000s\nafter:  %.2000s", p.name, before[p], after)
		}
	}
	if r := xlb.do(t, "GET", "/addresses/lone4", ""); !strings.Contains(r.body, `"used":"0"`) {
		t.Errorf("xlb's unused address: %s", r.body)
	}
	// xlb keeps them across a restart.
	xlb = restartXlb(t, xlb)
	before[xlb] = rules(xlb) // its new namespace, before any farm
	run(t, nftlb, xlb, []step{
		get("/addresses"),
		same("assign an address to a farm (README)", "POST", "/farms", `{"farms":[{"name":"f","mode":"snat","addresses":[{"name":"lone4"}],
			"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":"80"}]}]}`),
		get("/farms/f"), get("/addresses"),
	})
	want := map[*peer]string{nftlb: "tcp . 10.0.9.1 . 80 : goto nat-f", xlb: "10.0.9.1 . tcp . 80 : goto "}
	for _, p := range []*peer{nftlb, xlb} {
		if r := rules(p); !strings.Contains(r, want[p]) {
			t.Errorf("%s does not serve farm f on the address it named (%q): %.2000s", p.name, want[p], r)
		}
	}
	run(t, nftlb, xlb, []step{
		same("delete an unused address", "DELETE", "/addresses/lone6", ""),
		get("/addresses"),
		same("delete it again", "DELETE", "/addresses/lone6", ""),
		// The farm keeps the address: when the farm goes, so does it.
		same("delete the farm", "DELETE", "/farms/f", ""),
		get("/addresses"),
		same("another unused address", "POST", "/addresses", `{"addresses":[{"name":"lone7","family":"ipv4","ip-addr":"10.0.9.7","ports":"80","protocol":"tcp"}]}`),
		same("delete every farm", "DELETE", "/farms", ""),
		get("/addresses"),
	})
	for _, p := range []*peer{nftlb, xlb} {
		if after := rules(p); after != before[p] {
			t.Errorf("%s's ruleset after the farm went differs from before it came", p.name)
		}
	}
}
