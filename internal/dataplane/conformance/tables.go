package conformance

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// Scenarios of named tables used by farms as policies (nftlb's blacklists
// and whitelists). A plane that keeps tables implements
// dataplane.TablePlane; one that does not refuses the farm's "policies" in
// Check (list the scenarios in Plane.Refuses).

func init() {
	// Registered here so the tables' scenarios live in their own file.
	scenarios = append(scenarios,
		scenario{name: "policy-blacklist", farm: policyFarm, run: runBlacklist},
		scenario{name: "policy-whitelist", farm: policyFarm, run: runWhitelist},
		scenario{name: "policy-nested-prefixes", farm: policyFarm, run: runNestedPrefixes},
		scenario{name: "policy-swap", farm: policyFarm, run: runPolicySwap},
		scenario{name: "policy-blacklist-ipv6", v6: true, farm: policyFarm, run: runBlacklist},
		scenario{name: "policy-blacklist-stlsdnat", farm: policyFarmStateless, run: runBlacklist},
		scenario{name: "policy-two-policies", farm: policyFarm, run: runTwoPolicies},
		scenario{name: "policy-counters", farm: policyFarmUDP, run: runPolicyCounters},
		scenario{name: "policy-log", farm: policyFarm, run: runPolicyLog},
		scenario{name: "table-limit", farm: policyFarmUDP, run: runTableLimit},
		scenario{name: "table-mark", farm: policyFarm, run: runTableMark, attach: attachMarkTable},
		scenario{name: "table-dscp", farm: policyFarm, run: runTableDSCP, attach: attachDSCPTable},
		scenario{name: "table-dscp-ipv6", v6: true, farm: policyFarm, run: runTableDSCP, attach: attachDSCPTable},
		scenario{name: "policy-port", farm: policyFarm, run: runPolicyPort},
		scenario{name: "policy-mac", farm: policyFarm, run: runPolicyMAC},
		scenario{name: "policy-iface", farm: policyFarm, run: runPolicyIface, attach: attachIfaceTable},
		scenario{name: "policy-flow", farm: policyFarm, run: runPolicyFlow},
		scenario{name: "source-table", backends: 2, farm: sourceTableFarm, run: runSourceTable},
		scenario{name: "source-table-udp", backends: 2, farm: sourceTableFarmUDP, run: runSourceTable},
		scenario{name: "source-table-own", backends: 2, farm: sourceTableOwnFarm, run: runSourceTableOwn},
		scenario{name: "source-table-hairpin", backends: 2, hairpin: true, farm: sourceTableHairpinFarm, run: runSourceTableHairpin},
		scenario{name: "source-table-filters", backends: 2, farm: sourceTableFarm, run: runSourceTableFilters},
		scenario{name: "source-table-queue", backends: 2, farm: queuedDefaultFarm, run: runSourceTableQueue},
	)
}

// policyFarm is a snat farm with the policy "pol" attached.
func policyFarm(e *Env) model.Farm {
	f := e.Farm("pol-farm", model.ProtoTCP)
	f.Policies = []model.PolicyRef{{Name: "pol"}}
	return f
}

// policyFarmStateless is policyFarm in mode stlsdnat: no conntrack entry
// keeps its check, every packet is checked (the eBPF plane through its
// per-CPU copy of the farm's policies).
func policyFarmStateless(e *Env) model.Farm {
	f := policyFarm(e)
	f.Mode = model.ModeStlsDNAT
	f.Scheduler, f.SchedParam = model.SchedHash, model.KeySrcIP|model.KeySrcPort
	return f
}

// policyFarmUDP is policyFarm over UDP (one datagram is one packet).
func policyFarmUDP(e *Env) model.Farm {
	f := e.Farm("pol-farm", model.ProtoUDP)
	f.Policies = []model.PolicyRef{{Name: "pol"}}
	return f
}

// tableSet is the tables a scenario has given the plane, as the engine
// would keep them: IDs and slots assigned, the last applied versions.
type tableSet struct {
	tp     dataplane.TablePlane
	tables map[string]*model.Table
	nextID uint16
}

func (e *Env) tablePlane(t testing.TB) *tableSet {
	t.Helper()
	tp, ok := e.DP.(dataplane.TablePlane)
	if !ok {
		t.Fatalf("%s accepts farms with policies but does not implement dataplane.TablePlane", e.plane.Name)
	}
	return &tableSet{tp: tp, tables: map[string]*model.Table{}}
}

// put creates or replaces a table with these entries (keys as text).
func (s *tableSet) put(t testing.TB, name string, v model.ListVerdict, keys ...string) {
	t.Helper()
	tb := model.NewTable(name, model.TableAddr)
	tb.Verdict = v
	s.putTable(t, tb, keys...)
}

// putTable creates or replaces tb (its ID and slot given here) with these
// entries ("KEY" or "KEY VALUE").
func (s *tableSet) putTable(t testing.TB, tb model.Table, keys ...string) {
	t.Helper()
	name := tb.Name
	old := s.tables[name]
	if old != nil {
		tb.ID, tb.Slot = old.ID, old.Slot
	} else {
		s.nextID++
		tb.ID, tb.Slot = s.nextID, uint32(s.nextID)
	}
	for _, k := range keys {
		key, val, hasVal := strings.Cut(k, " ")
		e, err := tb.ParseEntry(model.EntryInput{Key: key, Value: val, ValueSet: hasVal}, 0)
		if err != nil {
			t.Fatal(err)
		}
		tb.PutEntry(e)
	}
	d := plan.TableDiff{Tables: []plan.TableChange{{Old: old, New: &tb}}}
	if old == nil {
		d.Slots = []plan.SlotChange{{Slot: tb.Slot, New: &tb}}
	} else {
		sc := plan.SlotChange{Slot: tb.Slot, Old: old, New: &tb}
		old.Entries("", func(e model.TableEntry) bool {
			if _, ok := tb.Entry(e.Key); !ok {
				sc.Del = append(sc.Del, e)
			}
			return true
		})
		tb.Entries("", func(e model.TableEntry) bool {
			if _, ok := old.Entry(e.Key); !ok {
				sc.Put = append(sc.Put, e)
			}
			return true
		})
		d.Slots = []plan.SlotChange{sc}
	}
	s.apply(t, d)
	s.tables[name] = &tb
}

// swap exchanges the entries of two tables, as the engine's swap does.
func (s *tableSet) swap(t testing.TB, a, b string) {
	t.Helper()
	ta, tb := s.tables[a], s.tables[b]
	na, nb := ta.WithEntriesOf(tb), tb.WithEntriesOf(ta)
	s.apply(t, plan.TableDiff{Tables: []plan.TableChange{{Old: ta, New: &na}, {Old: tb, New: &nb}}})
	s.tables[a], s.tables[b] = &na, &nb
}

func (s *tableSet) apply(t testing.TB, d plan.TableDiff) {
	t.Helper()
	if err := s.tp.ApplyTables(context.Background(), d); err != nil {
		t.Fatalf("apply tables: %v", err)
	}
}

// putFarm applies a farm with policies: tables' side first, then the farm.
func (s *tableSet) putFarm(t testing.TB, e *Env, f model.Farm) {
	t.Helper()
	nf := f.Clone()
	s.apply(t, plan.TableDiff{Farms: []plan.FarmChange{{Old: e.prev[f.Name], New: &nf}}})
	e.Put(t, f)
}

// answers reports whether a TCP connection from local to the farm gets
// an answer within timeout.
func (e *Env) answers(f model.Farm, local netip.Addr, timeout time.Duration) bool {
	c, err := testutil.DialTCPFrom(e.Client.NS, netip.AddrPortFrom(local, 0), e.vipPort(f), timeout)
	if err != nil {
		return false
	}
	defer c.Close()
	_, err = testutil.ReadLine(c, time.Second)
	return err == nil
}

// expect asks the farm from each client. A client that must be dropped
// gets one attempt (any answer is a failure); a client that must be served
// gets three, each long enough for a SYN retransmission: on a loaded CI
// machine, with every package's tests running at once, a first SYN from a
// fresh IPv6 address (neighbour discovery on the way back) once took more
// than 700 ms, and a dropped first SYN says nothing about the policy.
func (e *Env) expect(t *testing.T, f model.Farm, what string, want map[netip.Addr]bool) {
	t.Helper()
	for a, ok := range want {
		got := e.answers(f, a, 700*time.Millisecond)
		for try := 1; ok && !got && try < 3; try++ {
			got = e.answers(f, a, 2*time.Second)
		}
		if got != ok {
			t.Errorf("%s: client %s answered %v, want %v", what, a, got, ok)
		}
	}
}

func prefixOf(a netip.Addr, bits int) string {
	p, _ := a.Prefix(bits)
	return p.String()
}

// runBlacklist: a blacklisted client is dropped, another is served; after
// its entry is deleted it is served again.
func runBlacklist(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.put(t, "pol", model.ListDeny, c[0].String())
	ts.putFarm(t, e, f)
	e.expect(t, f, "blacklist", map[netip.Addr]bool{c[0]: false, c[1]: true})
	ts.put(t, "pol", model.ListDeny)
	e.expect(t, f, "entry deleted", map[netip.Addr]bool{c[0]: true, c[1]: true})
}

// runWhitelist: only the listed client is served.
func runWhitelist(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.put(t, "pol", model.ListAllow, c[1].String())
	ts.putFarm(t, e, f)
	e.expect(t, f, "whitelist", map[netip.Addr]bool{c[0]: false, c[1]: true})
	// The farm without the policy serves everyone again.
	f.Policies = nil
	ts.putFarm(t, e, f)
	e.expect(t, f, "policy detached", map[netip.Addr]bool{c[0]: true, c[1]: true})
}

// runNestedPrefixes: a table holding a prefix and a longer one inside it
// (as ipfw allows) denies both; taking either away leaves the other in
// force.
func runNestedPrefixes(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	wide := prefixOf(c[0], 16)
	ts.put(t, "pol", model.ListDeny, wide, c[0].String())
	ts.putFarm(t, e, f)
	e.expect(t, f, "/16 and /32", map[netip.Addr]bool{c[0]: false, c[1]: false})
	ts.put(t, "pol", model.ListDeny, c[0].String())
	e.expect(t, f, "/32 only", map[netip.Addr]bool{c[0]: false, c[1]: true})
	ts.put(t, "pol", model.ListDeny, wide)
	e.expect(t, f, "/16 only", map[netip.Addr]bool{c[0]: false, c[1]: false})
}

// runPolicySwap: the farm's blacklist swapped with another table denies
// the other table's clients from then on.
func runPolicySwap(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.put(t, "pol", model.ListDeny, c[0].String())
	ts.put(t, "next", model.ListNone, c[1].String())
	ts.putFarm(t, e, f)
	e.expect(t, f, "before swap", map[netip.Addr]bool{c[0]: false, c[1]: true})
	ts.swap(t, "pol", "next")
	e.expect(t, f, "after swap", map[netip.Addr]bool{c[0]: true, c[1]: false})
	ts.swap(t, "pol", "next")
	e.expect(t, f, "swapped back", map[netip.Addr]bool{c[0]: false, c[1]: true})
}

// runTwoPolicies: a whitelist of a prefix and a blacklist of one address
// in it: the prefix's other clients are served.
func runTwoPolicies(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 3)
	ts := e.tablePlane(t)
	ts.put(t, "pol", model.ListAllow, prefixOf(c[0], 24))
	ts.put(t, "bl", model.ListDeny, c[1].String())
	f.Policies = append(f.Policies, model.PolicyRef{Name: "bl"})
	ts.putFarm(t, e, f)
	e.expect(t, f, "whitelist and blacklist", map[netip.Addr]bool{c[0]: true, c[1]: false, c[2]: true})
}

// sendUDPFrom sends n datagrams of size bytes from local to the farm, from one
// socket, and reads no answer.
func (e *Env) sendUDPFrom(t testing.TB, f model.Farm, local netip.Addr, n, size int) {
	t.Helper()
	err := testutil.Do(e.Client.NS, func() error {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, 0)), net.UDPAddrFromAddrPort(e.vipPort(f)))
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, size)
		for range n {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send %d datagrams from %s: %v", n, local, err)
	}
}

// runPolicyCounters: exactly N datagrams from a blacklisted client are
// counted by the entry that matched them, N packets and N IP datagrams'
// bytes, and nothing else is counted; the most specific entry counts.
func runPolicyCounters(t *testing.T, e *Env, f model.Farm) {
	cr, ok := e.DP.(dataplane.TableCounterReader)
	if !ok {
		t.Fatalf("%s enforces policies but keeps no per-entry counters (dataplane.TableCounterReader)", e.plane.Name)
	}
	c := e.ClientAddrs(t, 3) // c[0] and c[1] are in c[0]'s /31 (or /127), c[2] is not
	ts := e.tablePlane(t)
	ts.put(t, "pol", model.ListDeny, c[0].String(), prefixOf(c[0], c[0].BitLen()-1))
	ts.putFarm(t, e, f)
	const n, payload = 7, 100
	e.sendUDPFrom(t, f, c[0], n, payload)
	hdr := 20 + 8
	if c[0].Is6() {
		hdr = 40 + 8
	}
	host := model.AddrKey(netip.PrefixFrom(c[0], c[0].BitLen()))
	var got dataplane.TableCounters
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if got, err = cr.TableCounters(context.Background(), ts.tables["pol"]); err != nil {
			t.Fatal(err)
		}
		if got[host].Packets >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := dataplane.EntryCounters{Packets: n, Bytes: n * uint64(hdr+payload)}
	if got[host] != want || len(got) != 1 {
		t.Errorf("counters after %d datagrams of %d bytes from %s: %v, want only %s: %+v", n, payload, c[0], got, c[0], want)
	}
	// A client the list does not hold is served and counted nowhere.
	if name, _ := e.AskUDP(t, netip.AddrPortFrom(c[2], 0), e.vipPort(f)); name == "" {
		t.Error("the other client was not served")
	}
	if got, _ := cr.TableCounters(context.Background(), ts.tables["pol"]); len(got) != 1 || got[host] != want {
		t.Errorf("counters after a served client: %v, want only %s: %+v", got, c[0], want)
	}
}

// logWaiter returns what waits for the plane's next log line containing a
// substring: NFLOG group LogGroup, or Plane.ConnLog.
func (e *Env) logWaiter(t *testing.T) func(string, time.Duration) (testutil.NFLogEntry, error) {
	if e.plane.ConnLog != nil {
		return e.plane.ConnLog(t, "/run/netns/"+e.LB.Name)
	}
	return testutil.ListenNFLOG(t, e.LB.NS, LogGroup).Wait
}

// runPolicyLog: a blacklist with a log-prefix logs each packet it drops,
// with the prefix, the client's address and the VIP.
func runPolicyLog(t *testing.T, e *Env, f model.Farm) {
	wait := e.logWaiter(t)
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	tb := model.NewTable("pol", model.TableAddr)
	tb.Verdict, tb.LogPrefix = model.ListDeny, "polbl-drop "
	ts.putTable(t, tb, c[0].String())
	ts.putFarm(t, e, f)
	e.expect(t, f, "blacklist with log-prefix", map[netip.Addr]bool{c[0]: false, c[1]: true})
	entry, err := wait("polbl-drop", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(entry.Prefix, tb.LogPrefix) || entry.Src != c[0] || entry.Dst != f.VirtualAddr {
		t.Errorf("logged drop %q %s -> %s, want prefix %q, %s -> %s", entry.Prefix, entry.Src, entry.Dst, tb.LogPrefix, c[0], f.VirtualAddr)
	}
}

// valueTable is a table without verdict whose entries' values a farm
// applies (valtype as given).
func valueTable(t testing.TB, name, valtype string) model.Table {
	tb := model.NewTable(name, model.TableAddr)
	v, err := model.ParseValueFields(valtype)
	if err != nil {
		t.Fatal(err)
	}
	tb.Values = v
	return tb
}

// quickUDPFrom sends one datagram from local (a new socket) and reports
// whether an answer came within timeout.
func (e *Env) quickUDPFrom(local netip.Addr, to netip.AddrPort, timeout time.Duration) bool {
	_, err := testutil.AskUDPWithin(e.Client.NS, netip.AddrPortFrom(local, 0), to, timeout)
	return err == nil
}

// runTableLimit: a table without verdict, valtype limit, attached to the
// farm: its entry's clients get 5 new flows a second (burst 5), counted
// per entry; a client the table does not hold is not limited, nor one
// whose more specific entry has no limit.
func runTableLimit(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 3)
	ts := e.tablePlane(t)
	ts.putTable(t, valueTable(t, "pol", "limit"), prefixOf(c[0], c[0].BitLen()-2)+" 5", c[1].String()+" 0")
	ts.putFarm(t, e, f)
	start := time.Now()
	ok := 0
	for range 40 {
		if e.quickUDPFrom(c[0], e.vipPort(f), 25*time.Millisecond) {
			ok++
		}
	}
	el := time.Since(start)
	max := 5 + 1 + int(5*el.Seconds()+0.999) + 2
	t.Logf("limit 5/s: %d of 40 new flows answered in %v", ok, el)
	if ok < 5 || ok > max {
		t.Errorf("limit 5/s burst 5: %d of 40 new flows from %s answered in %v, want 5 to %d", ok, c[0], el, max)
	}
	// c[1]: its /32 entry (limit 0) is more specific than the limited
	// prefix: not limited. c[2]: in no entry.
	for _, a := range []netip.Addr{c[1], c[2]} {
		got := 0
		for range 20 {
			if e.quickUDPFrom(a, e.vipPort(f), time.Second) {
				got++
			}
		}
		if got < 19 {
			t.Errorf("client %s (not limited): %d of 20 new flows answered", a, got)
		}
	}
	time.Sleep(1200 * time.Millisecond)
	if !e.quickUDPFrom(c[0], e.vipPort(f), time.Second) {
		t.Errorf("after a pause a new flow from %s was dropped", c[0])
	}
}

// attachMarkTable applies runTableMark's table, then the farm using it.
func attachMarkTable(t *testing.T, e *Env, f model.Farm) error {
	return attachValueTable(t, e, f, "mark", "42")
}

// attachValueTable applies a table "pol" of valtype valtype, holding the
// scenario's first client with value, and the farm attaching it; it
// returns the plane's error.
func attachValueTable(t *testing.T, e *Env, f model.Farm, valtype, value string) error {
	c := e.ClientAddrs(t, 1)
	ts := e.tablePlane(t)
	ts.putTable(t, valueTable(t, "pol", valtype), c[0].String()+" "+value)
	nf := f.Clone()
	return ts.tp.ApplyTables(context.Background(), plan.TableDiff{Farms: []plan.FarmChange{{New: &nf}}})
}

// runTableMark: a table without verdict, valtype mark, attached to the
// farm: its entry's clients' connections leave the LB with the mark
// (marks.go); other clients' do not. Where the plane's flows are in
// conntrack (nft), they carry it there too (mark=42).
func runTableMark(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.putTable(t, valueTable(t, "pol", "mark"), c[0].String()+" 42")
	m := e.countMarks(t, "meta mark 42")
	ts.putFarm(t, e, f)
	e.expect(t, f, "mark table, other client", map[netip.Addr]bool{c[1]: true})
	if n := m.packets(t); n[0] != 0 {
		t.Errorf("%d packets of a client the table does not hold left with mark 42, want 0", n[0])
	}
	e.expect(t, f, "mark table, client in it", map[netip.Addr]bool{c[0]: true})
	if n := m.packets(t); n[0] == 0 {
		t.Errorf("no packet of the table's client left with its mark 42")
	}
	e.markedConntrack(t, "src="+c[0].String()+" ", "mark=42")
	e.markedConntrack(t, "src="+c[1].String()+" ", "mark=0")
}

func attachDSCPTable(t *testing.T, e *Env, f model.Farm) error {
	return attachValueTable(t, e, f, "dscp", "46")
}

// runTableDSCP: a table without verdict, valtype dscp, attached to the
// farm: its entry's client's packets leave the LB with DSCP 46 (EF), and
// are served (the rewritten IPv4 header's checksum holds); another
// client's leave with their own (0).
func runTableDSCP(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.putTable(t, valueTable(t, "pol", "dscp"), c[0].String()+" 46")
	ip := "ip"
	if e.v6 {
		ip = "ip6"
	}
	m := e.countMarks(t, ip+" dscp 46")
	ts.putFarm(t, e, f)
	e.expect(t, f, "dscp table, other client", map[netip.Addr]bool{c[1]: true})
	if n := m.packets(t); n[0] != 0 {
		t.Errorf("%d packets left with DSCP 46 for a client the table does not hold, want 0", n[0])
	}
	e.expect(t, f, "dscp table, client in it", map[netip.Addr]bool{c[0]: true})
	if n := m.packets(t); n[0] == 0 {
		t.Errorf("no packet of the table's client left with its DSCP 46")
	}
}

// typedTable is a policy table of type typ ("number", "flow:src-ip,dst-port").
func typedTable(t testing.TB, name, typ string, v model.ListVerdict) model.Table {
	tt, ff, err := model.ParseTableType(typ)
	if err != nil {
		t.Fatal(err)
	}
	tb := model.NewTable(name, tt)
	tb.Flow, tb.Verdict = ff, v
	return tb
}

// answersFrom reports whether a TCP connection from local (address and
// port) to the farm is answered, as expect does: one try when it must be
// dropped, three when it must be served.
func (e *Env) expectFrom(t *testing.T, f model.Farm, what string, local netip.AddrPort, want bool) {
	t.Helper()
	try := func(timeout time.Duration) bool {
		c, err := testutil.DialTCPFrom(e.Client.NS, local, e.vipPort(f), timeout)
		if err != nil {
			return false
		}
		defer c.Close()
		_, err = testutil.ReadLine(c, time.Second)
		return err == nil
	}
	got := try(700 * time.Millisecond)
	for i := 1; want && !got && i < 3; i++ {
		time.Sleep(100 * time.Millisecond) // the port's earlier socket may linger
		got = try(2 * time.Second)
	}
	if got != want {
		t.Errorf("%s: client %s answered %v, want %v", what, local, got, want)
	}
}

// runPolicyPort: a number table as a blacklist matches the client's source
// port: a connection from that port is dropped, one from another served.
func runPolicyPort(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 1)
	ts := e.tablePlane(t)
	ts.putTable(t, typedTable(t, "pol", "number", model.ListDeny), "40123", "70000")
	ts.putFarm(t, e, f)
	e.expectFrom(t, f, "denied source port", netip.AddrPortFrom(c[0], 40123), false)
	e.expectFrom(t, f, "other source port", netip.AddrPortFrom(c[0], 40124), true)
	// The entry counted the dropped SYN (and its retransmissions).
	if cr, ok := e.DP.(dataplane.TableCounterReader); ok {
		cs, err := cr.TableCounters(context.Background(), ts.tables["pol"])
		if err != nil {
			t.Fatal(err)
		}
		if n := cs[model.NumberKey(40123)].Packets; n == 0 || len(cs) != 1 {
			t.Errorf("counters of the number table: %v, want packets on 40123 only", cs)
		}
	}
}

// runPolicyMAC: a mac table as a blacklist matches the client's Ethernet
// address (every address of the client); a list without it serves it.
func runPolicyMAC(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.putTable(t, typedTable(t, "pol", "mac", model.ListDeny), e.Client.MAC(t).String())
	ts.putFarm(t, e, f)
	e.expect(t, f, "client's MAC denied", map[netip.Addr]bool{c[0]: false, c[1]: false})
	ts.putTable(t, typedTable(t, "pol", "mac", model.ListDeny), "02:00:00:00:00:99")
	e.expect(t, f, "another MAC denied", map[netip.Addr]bool{c[0]: true, c[1]: true})
	ts.putTable(t, typedTable(t, "pol", "mac", model.ListAllow), e.Client.MAC(t).String())
	e.expect(t, f, "client's MAC allowed", map[netip.Addr]bool{c[0]: true})
}

// attachIfaceTable applies runPolicyIface's table, then the farm using it.
func attachIfaceTable(t *testing.T, e *Env, f model.Farm) error {
	ts := e.tablePlane(t)
	ts.putTable(t, typedTable(t, "pol", "iface", model.ListDeny), e.LB.Link)
	nf := f.Clone()
	return ts.tp.ApplyTables(context.Background(), plan.TableDiff{Farms: []plan.FarmChange{{New: &nf}}})
}

// runPolicyIface: an iface table as a blacklist matches the interface the
// packet came in on: the LB's client-side interface listed, the client is
// dropped; another name listed, it is served.
func runPolicyIface(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 1)
	ts := e.tablePlane(t)
	ts.putTable(t, typedTable(t, "pol", "iface", model.ListDeny), e.LB.Link)
	ts.putFarm(t, e, f)
	e.expect(t, f, "ingress interface denied", map[netip.Addr]bool{c[0]: false})
	ts.putTable(t, typedTable(t, "pol", "iface", model.ListDeny), "nosuch0")
	e.expect(t, f, "another interface denied", map[netip.Addr]bool{c[0]: true})
}

// runPolicyFlow: a flow table over (src-ip, proto, dst-port) as a
// blacklist drops the listed client to the farm's port, not another.
func runPolicyFlow(t *testing.T, e *Env, f model.Farm) {
	c := e.ClientAddrs(t, 2)
	ts := e.tablePlane(t)
	ts.putTable(t, typedTable(t, "pol", "flow:src-ip,proto,dst-port", model.ListDeny),
		c[0].String()+",tcp,"+strconv.Itoa(VPort), c[1].String()+",udp,"+strconv.Itoa(VPort))
	ts.putFarm(t, e, f)
	e.expect(t, f, "flow denied", map[netip.Addr]bool{c[0]: false, c[1]: true})
}
