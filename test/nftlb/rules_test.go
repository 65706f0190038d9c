package nftlb

import (
	"regexp"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// ruleCase is one farm field both daemons take: the same requests to
// both, then what each programs in its namespace's nftables (nftlb's own
// table, xlb's tables) is read back with `nft list ruleset` and checked
// for the statement that does the field's work, and GET prints the same.
type ruleCase struct {
	name    string
	farm    string // farm fields after name, address and ports
	backend string // backend fields after name, address, port and state
	// then: farm fields posted after the backends (nftlb 1.0.7 answers
	// 404 to static sessions that name backends of the same request).
	then string
	// both: statements both rulesets hold (normalized, see normRules);
	// nftlbHas/xlbHas: statements of one side (the same work, spelled
	// otherwise); absent: what neither may hold.
	both, nftlbHas, xlbHas, absent []string
}

var (
	countersRE = regexp.MustCompile(`counter packets \d+ bytes \d+ ?`)
	setRefRE   = regexp.MustCompile(`add @[A-Za-z0-9_.-]+ \{`)
	spacesRE   = regexp.MustCompile(`\s+`)
)

// normRules is a ruleset with counters dropped, the names of the
// per-client sets replaced by SET and whitespace collapsed.
func normRules(s string) string {
	s = countersRE.ReplaceAllString(s, "")
	s = setRefRE.ReplaceAllString(s, "add @SET {")
	return spacesRE.ReplaceAllString(s, " ")
}

// TestSideBySideRules: nftlb's limits, verdicts, log prefixes (the limits'
// and the farm's own), log-rtlimit,
// limits-ttl, rate units, mode local, backend source-addr, static sessions
// and queue, each
// sent to Debian's nftlb and to xlb, with what each programs compared.
func TestSideBySideRules(t *testing.T) {
	nftlb, xlb := startPeers(t)
	linkPeers(t, nftlb, xlb)
	cases := []ruleCase{
		{name: "new-rtlimit per client, in minutes, with a log prefix and limits-ttl",
			farm: `"new-rtlimit":"10/minute","new-rtlimit-burst":"3","new-rtlimit-log-prefix":"NEWPFX","limits-ttl":"60"`,
			both: []string{`add @SET { ip saddr limit rate over 10/minute burst 3 packets } log prefix "NEWPFX" drop`, "flags dynamic,timeout timeout 1m"}},
		{name: "est-connlimit per client, nftlb's default prefix",
			farm: `"est-connlimit":"7"`,
			both: []string{`add @SET { ip saddr ct count over 7 } log prefix "est-connlimit-f " drop`}},
		{name: "rst-rtlimit per client, in hours",
			farm: `"rst-rtlimit":"3/hour","rst-rtlimit-burst":"2"`,
			both: []string{`tcp flags rst add @SET { ip saddr limit rate over 3/hour burst 2 packets } log prefix "rst-rtlimit-f " drop`}},
		{name: "tcp-strict with a prefix of nftlb's tokens",
			farm: `"tcp-strict":"on","tcp-strict-log-prefix":"X-FNAME-KNAME "`,
			both: []string{`ct state invalid log prefix "X-f-tcp-strict " drop`}},
		{name: "verdict drop: no log",
			farm: `"new-rtlimit":"3/second","verdict":"drop"`,
			both: []string{`add @SET { ip saddr limit rate over 3/second } drop`}, absent: []string{`"new-rtlimit-f "`}},
		{name: "verdict log accept: logged, let through",
			farm: `"new-rtlimit":"3/second","verdict":"log accept"`,
			both: []string{`add @SET { ip saddr limit rate over 3/second } log prefix "new-rtlimit-f " `}, absent: []string{`"new-rtlimit-f " drop`}},
		{name: "log-rtlimit: the log lines are rate-limited, the drop is not",
			farm:     `"new-rtlimit":"3/second","log-rtlimit":"2/second"`,
			both:     []string{`limit rate 2/second log prefix "new-rtlimit-f " drop`},
			nftlbHas: []string{`add @SET { ip saddr limit rate over 3/second } jump {`},
			xlbHas:   []string{`add @SET { ip saddr limit rate over 3/second } jump v-`}},
		// A farm's own log lines: nftlb's prefixes, its tokens expanded
		// (KNAME "log", TYPE the hook, FNAME the farm; default
		// "TYPE-FNAME "), one line per hook. nftlb writes the input line
		// in its nat chain and the forward line in its forward chain; xlb
		// writes both in the farm's log chain (docs/nftlb-compat.md).
		{name: "log input, nftlb's default prefix",
			farm: `"mode":"snat","log":"input"`,
			both: []string{`log prefix "IN-f "`}, absent: []string{`"FWD-f "`, "xlb farm="}},
		{name: "log forward",
			farm: `"mode":"snat","log":"forward"`,
			both: []string{`log prefix "FWD-f "`}, absent: []string{`"IN-f "`}},
		{name: "log input and forward with nftlb's tokens",
			farm: `"mode":"snat","log":"input forward","log-prefix":"X-KNAME-TYPE-FNAME "`,
			both: []string{`log prefix "X-log-IN-f "`, `log prefix "X-log-FWD-f "`}},
		{name: "mode local: nothing forwarded",
			farm:   `"mode":"local"`,
			absent: []string{"10.1.0.1", "10.1.0.2"}},
		{name: "backend source-addr",
			farm: `"mode":"snat"`, backend: `"source-addr":"10.1.0.254"`,
			nftlbHas: []string{"map services-back-m { type mark : ipv4_addr elements = { 0x00000001 : 10.1.0.254, 0x00000002 : 10.1.0.254 } }",
				"snat to ct mark map @services-back-m"},
			xlbHas: []string{"10.0.0.1 . tcp . 80 . 10.1.0.1 : 10.1.0.254", "10.0.0.1 . tcp . 80 . 10.1.0.2 : 10.1.0.254",
				"snat ip to ct original ip daddr . meta l4proto . ct original proto-dst . ip daddr map @snatb4"}},
		// Static sessions: nftlb keeps them in a map of its own, looked
		// up first (its ids are its backend marks); xlb too (ids are
		// its backend ids, see persist.go).
		{name: "static sessions",
			farm: `"persistence":"srcip","persist-ttl":"300"`,
			then: `"sessions":[{"client":"10.0.0.9","backend":"b2"},{"client":"10.0.0.10","backend":"b1"}]`,
			nftlbHas: []string{"ct mark set ip saddr map @static-sessions-f accept",
				"elements = { 10.0.0.9 : 0x80000002, 10.0.0.10 : 0x80000001 }"},
			xlbHas: []string{"ct mark set ip saddr map @s-", "10.0.0.9 : 0x", "10.0.0.10 : 0x"}},
		// A second address: its keys go to the farm's one chain in both.
		{name: "a second address",
			farm:     `"addresses":[{"name":"f-addr","family":"ipv4","ip-addr":"10.0.0.1","ports":"80","protocol":"tcp"},{"name":"f2","family":"ipv4","ip-addr":"10.0.0.2","ports":"443","protocol":"tcp"}]`,
			nftlbHas: []string{"tcp . 10.0.0.1 . 80 : goto nat-f", "tcp . 10.0.0.2 . 443 : goto nat-f"},
			xlbHas:   []string{"10.0.0.1 . tcp . 80 : goto f-", "10.0.0.2 . tcp . 443 : goto f-"}},
		// intra-connect: nftlb hooks output only when on; xlb's output
		// chain always looks up the farms, after a set of the keys of
		// those with intra-connect off.
		{name: "intra-connect off: the LB host's own connections untranslated",
			farm:   `"intra-connect":"off"`,
			xlbHas: []string{"@nolocal4 accept", "set nolocal4 { type ipv4_addr . inet_proto . inet_service flags interval elements = { 10.0.0.1 . tcp . 80 }"},
			absent: []string{"output-nat-proto-services"}},
		{name: "intra-connect on: the LB host's own connections balanced",
			farm: `"intra-connect":"on"`,
			nftlbHas: []string{"output-nat-proto-services { type inet_proto . ipv4_addr . inet_service : verdict elements = { tcp . 10.0.0.1 . 80 : goto nat-f }",
				"type nat hook output priority -100; policy accept; ip protocol . ip daddr . th dport vmap @output-nat-proto-services"},
			xlbHas: []string{"type nat hook output priority -100; policy accept; ip daddr . meta l4proto . th dport @nolocal4 accept"},
			absent: []string{"set nolocal4 { type ipv4_addr . inet_proto . inet_service flags interval elements"}},
		// Debian's nftlb 1.0.7 emits `tcp flags syn queue num 3 bypass`,
		// which this kernel (no nft_queue) rejects: nftlb answers
		// success and programs nothing for the farm. xlb programs the
		// queue through nft_compat (TestQueue shows it with traffic).
		{name: "queue",
			farm:   `"queue":"3"`,
			xlbHas: []string{"queue num 3 bypass"}},
	}
	for _, c := range cases {
		farm := `{"farms":[{"name":"f","virtual-addr":"10.0.0.1","virtual-ports":"80",` + c.farm + `}]}`
		backends := `{"farms":[{"name":"f","backends":[{"name":"b1","ip-addr":"10.1.0.1","port":"80","state":"up"` + comma(c.backend) +
			`},{"name":"b2","ip-addr":"10.1.0.2","port":"80","state":"up"` + comma(c.backend) + `}]}]}`
		run(t, nftlb, xlb, []step{
			same(c.name+": the farm", "POST", "/farms", farm),
			same(c.name+": its backends", "POST", "/farms", backends),
			get("/farms/f"),
		})
		if c.then != "" {
			run(t, nftlb, xlb, []step{
				same(c.name+": then", "POST", "/farms", `{"farms":[{"name":"f",`+c.then+`}]}`),
				get("/farms/f"), get("/farms/f/sessions"),
			})
		}
		rules := map[*peer]string{}
		for _, p := range []*peer{nftlb, xlb} {
			rules[p] = normRules(testutil.Run(t, p.nsName, "nft", "list", "ruleset"))
		}
		check := func(p *peer, want []string) {
			for _, w := range want {
				if !strings.Contains(rules[p], w) {
					t.Errorf("%s: %s's ruleset lacks %q:\n%s", c.name, p.name, w, rules[p])
				}
			}
		}
		check(nftlb, c.both)
		check(xlb, c.both)
		check(nftlb, c.nftlbHas)
		check(xlb, c.xlbHas)
		for _, p := range []*peer{nftlb, xlb} {
			for _, a := range c.absent {
				if strings.Contains(withoutCounters(rules[p]), a) {
					t.Errorf("%s: %s's ruleset holds %q:\n%s", c.name, p.name, a, rules[p])
				}
			}
		}
		run(t, nftlb, xlb, []step{same(c.name+": delete", "DELETE", "/farms/f", "")})
	}
}

func comma(fields string) string {
	if fields == "" {
		return ""
	}
	return "," + fields
}

// withoutCounters is a normalized ruleset without xlb's counters table
// (per-backend traffic counters: it lists every backend of a farm, also
// of one that forwards nothing).
func withoutCounters(rules string) string {
	start := strings.Index(rules, "table inet xlb-counters {")
	if start < 0 {
		return rules
	}
	end := strings.Index(rules[start+1:], "table ")
	if end < 0 {
		return rules[:start]
	}
	return rules[:start] + rules[start+1+end:]
}
