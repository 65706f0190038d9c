package conformance

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// Marks, shown where a user's rules read them: an nftables counter in the
// LB's bridge postrouting hook (br0 holds the backends' ports) counts the
// packets that leave for the backends with a mark. Every packet the bridge
// transmits passes it, whether the stack routed it there or an eBPF program
// redirected it; not the netdev egress hook, which the kernel skips for a
// packet redirected from tc ingress (nf_skip_egress). What
// both planes give: the first packet of each connection to a marked
// backend, or from a client a mark table matches, leaves with the mark
// (the nft plane sets meta mark there and keeps the mark as ct mark; the
// eBPF plane keeps it in its conntrack entry and sets it on every packet of
// the flow, so policy routing and egress rules see it all along).

func init() {
	scenarios = append(scenarios,
		scenario{name: "mark-backend-udp", backends: 2, farm: func(e *Env) model.Farm {
			f := e.Farm("bmark", model.ProtoUDP)
			f.Backends[0].Mark = 0x100
			return f
		}, run: runBackendMark},
		scenario{name: "mark-precedence", backends: 2, farm: func(e *Env) model.Farm {
			f := policyFarm(e)
			f.Backends[0].Mark = 0x100
			return f
		}, run: runMarkPrecedence},
	)
}

// markCounters is an nft table "bridge xlbtest-marks" in the LB's
// namespace counting the packets br0 sends, one counter per rule.
type markCounters struct {
	e     *Env
	rules []string
}

// countMarks adds one counting rule per entry of rules (nft match
// expressions, e.g. "ip daddr 10.200.0.11 meta mark 0x100"), each
// commented with its index.
func (e *Env) countMarks(t testing.TB, rules ...string) *markCounters {
	t.Helper()
	ns := e.LB.Name
	testutil.Run(t, ns, "nft", "add", "table", "bridge", "xlbtest-marks")
	testutil.Run(t, ns, "nft", "add", "chain", "bridge", "xlbtest-marks", "out",
		"{ type filter hook postrouting priority 0; }")
	for i, r := range rules {
		args := append([]string{"nft", "add", "rule", "bridge", "xlbtest-marks", "out"}, strings.Fields(r)...)
		args = append(args, "counter", "comment", fmt.Sprintf("\"r%d\"", i))
		testutil.Run(t, ns, args...)
	}
	t.Cleanup(func() { _, _ = testutil.RunErr(ns, "nft", "delete", "table", "bridge", "xlbtest-marks") })
	return &markCounters{e: e, rules: rules}
}

var counterRe = regexp.MustCompile(`counter packets (\d+) bytes \d+ comment "r(\d+)"`)

// packets returns each rule's packet count.
func (m *markCounters) packets(t testing.TB) []int {
	t.Helper()
	out := testutil.Run(t, m.e.LB.Name, "nft", "list", "chain", "bridge", "xlbtest-marks", "out")
	n := make([]int, len(m.rules))
	for _, g := range counterRe.FindAllStringSubmatch(out, -1) {
		i, _ := strconv.Atoi(g[2])
		n[i], _ = strconv.Atoi(g[1])
	}
	return n
}

// runMarkPrecedence: a client a mark table gives 42 opens connections to a
// farm whose backend b0 has mark 0x100: the backend's mark wins, so the
// first packet of each connection to b0 (its SYN) leaves with 0x100, never
// with 42; another client's connections carry no table mark.
func runMarkPrecedence(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.putTable(t, valueTable(t, "pol", "mark"), c[0].String()+" 42")
	b0 := f.Backends[0].Addr.String()
	syn := "tcp flags & (syn | ack) == syn"
	m := e.countMarks(t,
		"ip daddr "+b0+" "+syn+" meta mark 0x100",
		"ip daddr "+b0+" "+syn+" meta mark 42",
		"meta mark 42")
	ts.putFarm(t, e, f)
	// The other client first: nothing it sends may carry the table's mark.
	for range 4 {
		e.AskTCP(t, netip.AddrPortFrom(c[1], 0), e.vipPort(f))
	}
	if n := m.packets(t); n[2] != 0 {
		t.Errorf("%d packets of a client the table does not hold left with its mark 42, want 0", n[2])
	}
	seen := map[string]int{}
	for range 4 {
		n, _ := e.AskTCP(t, netip.AddrPortFrom(c[0], 0), e.vipPort(f))
		seen[n]++
	}
	n := m.packets(t)
	if n[0] < seen["b0"] || seen["b0"] == 0 {
		t.Errorf("SYNs to the marked backend with its mark 0x100: %d, want one per connection to it (%v)", n[0], seen)
	}
	if n[1] != 0 {
		t.Errorf("SYNs to the marked backend with the table's mark 42: %d, want 0 (the backend's mark comes first)", n[1])
	}
}

// markedConntrack checks the LB's conntrack entries whose line contains
// sel: each must carry want ("mark=256"). It returns how many there are: a
// plane that keeps its flows in conntrack (nft) lists them, one whose
// program tracks flows itself (eBPF) lists none.
func (e *Env) markedConntrack(t testing.TB, sel, want string) int {
	t.Helper()
	out := testutil.Run(t, e.LB.Name, "conntrack", "-L", "-p", "tcp")
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, sel) {
			continue
		}
		m := "mark=0"
		if i := strings.Index(l, "mark="); i >= 0 {
			m = strings.Fields(l[i:])[0]
		}
		if m != want {
			t.Errorf("conntrack entry %q has %s, want %s", l, m, want)
		}
		n++
	}
	return n
}
