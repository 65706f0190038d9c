package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

const limitsLogGroup = 9

// newLogEnv is newEnv with farm logs (and limit logs) sent to NFLOG group
// limitsLogGroup.
func newLogEnv(t *testing.T, backends int) *env {
	t.Helper()
	testutil.RequireRoot(t)
	topo := testutil.NewTopology(t, testutil.TopologyOptions{Backends: backends})
	p, err := New(context.Background(), testLogger(), Options{NetNS: topo.LB.NS, LogGroup: limitsLogGroup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &env{Topology: topo, p: p}
}

// TestClientLimitsListing: the rules of nftlb's limits as nft lists them,
// next to what Debian's nftlb 1.0.7 emits for the same farm (in the
// comments): per client, in nftlb's units, with its verdict and prefixes.
func TestClientLimitsListing(t *testing.T) {
	e := newEnv(t, 2, false)
	t.Parallel()
	prev := map[string]*model.Farm{}
	f := e.farm("lim", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	f.NewRTLimit, f.NewRTUnit, f.NewRTBurst, f.NewRTLogPrefix = 10, model.PerMinute, 3, "NEWPFX"
	f.EstConnLimit = 7
	f.RstRTLimit, f.RstRTUnit, f.RstRTBurst = 3, model.PerHour, 2
	f.TCPStrict, f.TCPStrictLogPrefix = true, "X-FNAME-KNAME "
	f.LimitsTTL = 60
	f.Backends[0].EstConnLimit, f.Backends[0].EstConnLogPrefix = 4, "BPFX"
	f.Backends[1].EstConnLimit = 4
	e.put(t, prev, f)
	h := nameHash("lim")
	out := e.nft(t, "list", "table", "inet", "xlb")
	for _, want := range []string{
		// nftlb: add @new-rtlimit-f { ip saddr limit rate over 10/minute burst 5 packets } log prefix "NEWPFX" drop
		"add @nl-" + h + "-4-60 { ip saddr limit rate over 10/minute burst 3 packets } counter packets 0 bytes 0 log prefix \"NEWPFX\" drop",
		// nftlb: add @est-connlimit-f { ip saddr ct count over 7 } log prefix "est-connlimit-f " drop
		"add @el-" + h + "-4 { ip saddr ct count over 7 } counter packets 0 bytes 0 log prefix \"est-connlimit-lim \" drop",
		// nftlb: tcp flags rst add @rst-rtlimit-f { ip saddr limit rate over 3/hour burst 2 packets } log prefix "rst-rtlimit-f " drop
		"tcp flags rst add @rl-" + h + "-4-60 { ip saddr limit rate over 3/hour burst 2 packets } counter packets 0 bytes 0 log prefix \"rst-rtlimit-lim \" drop",
		// nftlb: ct state invalid log prefix "X-f-tcp-strict " drop
		"ct state invalid counter packets 0 bytes 0 log prefix \"X-lim-tcp-strict \" drop",
		// nftlb: ct mark 0x80000001 ct count over 4 log prefix "BPFX" drop
		"log prefix \"BPFX\" drop",
		"log prefix \"est-connlimit-lim-b1 \" drop",
		"timeout 1m",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}

	// The verdict: log only (let through), then drop only.
	f.Verdict = model.VerdictLog | model.VerdictAccept
	e.put(t, prev, f)
	out = e.nft(t, "list", "table", "inet", "xlb")
	if !strings.Contains(out, "log prefix \"NEWPFX\"\n") || strings.Contains(out, "\"NEWPFX\" drop") {
		t.Errorf("verdict log accept: want a log without drop:\n%s", out)
	}
	f.Verdict = model.VerdictDrop
	e.put(t, prev, f)
	out = e.nft(t, "list", "table", "inet", "xlb")
	if strings.Contains(out, "NEWPFX") || !strings.Contains(out, "burst 3 packets } counter packets 0 bytes 0 drop") {
		t.Errorf("verdict drop: want a drop without log:\n%s", out)
	}
	// log-rtlimit: the log goes to a chain of its own, rate-limited; the
	// drop stays.
	f.Verdict, f.LogRTLimit, f.LogRTUnit = model.DefaultVerdict, 5, model.PerMinute
	e.put(t, prev, f)
	out = e.nft(t, "list", "table", "inet", "xlb")
	for _, want := range []string{
		"burst 3 packets } counter packets 0 bytes 0 jump v-" + h + "-n",
		"chain v-" + h + "-n {\n\t\tlimit rate 5/minute log prefix \"NEWPFX\"\n\t\tdrop\n\t}",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log-rtlimit: listing lacks %q:\n%s", want, out)
		}
	}
	// Back to no limits: the sets and verdict chains go.
	g := e.farm("lim", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	e.put(t, prev, g)
	out = e.nft(t, "list", "table", "inet", "xlb")
	for _, gone := range []string{"nl-", "el-", "rl-", "chain v-"} {
		if strings.Contains(out, gone) {
			t.Errorf("without limits the table still holds %q:\n%s", gone, out)
		}
	}
	// Reconcile from an empty plane rebuilds the same objects.
	e.put(t, prev, f)
	before := e.nft(t, "list", "table", "inet", "xlb")
	if err := e.p.Reconcile(context.Background(), []*model.Farm{prev["lim"]}); err != nil {
		t.Fatal(err)
	}
	if after := e.nft(t, "list", "table", "inet", "xlb"); strings.Count(after, "chain v-") != strings.Count(before, "chain v-") ||
		!strings.Contains(after, "add @nl-"+h) {
		t.Errorf("after Reconcile:\n%s\nbefore:\n%s", after, before)
	}
	e.del(t, prev, "lim")
	if out := e.nft(t, "list", "table", "inet", "xlb"); strings.Contains(out, "chain v-") || strings.Contains(out, "set nl-") {
		t.Errorf("after delete:\n%s", out)
	}
}

// TestClientLimitsTraffic: new-rtlimit and est-connlimit count per client,
// as nftlb's: one client over the limit is dropped (and logged with the
// limit's prefix) while another client of the same farm passes; the
// verdict "log accept" lets the client through and still logs; limits-ttl
// is how long a client's state lasts.
func TestClientLimitsTraffic(t *testing.T) {
	e := newLogEnv(t, 1)
	e.startServers(t, 8080)
	second := netip.MustParseAddr("10.100.0.3")
	e.Client.AddAddr(t, netip.PrefixFrom(second, 24))
	nflog := testutil.ListenNFLOG(t, e.LB.NS, limitsLogGroup)
	prev := map[string]*model.Farm{}
	vip := testutil.VIP4(1)
	f := e.farm("rate", vip, 53, model.ProtoUDP, 8080)
	f.NewRTLimit, f.NewRTBurst = 5, 5
	f.LimitsTTL = 2
	e.put(t, prev, f)
	to := netip.AddrPortFrom(vip, 53)
	flood := func(from netip.Addr, n int) int {
		ok := 0
		for i := range n {
			if _, err := testutil.AskUDPWithin(e.Client.NS, netip.AddrPortFrom(from, uint16(30000+i)), to, 100*time.Millisecond); err == nil {
				ok++
			}
		}
		return ok
	}
	start := time.Now()
	ok := flood(e.Client.IPv4, 30)
	el := time.Since(start)
	if maxOK := 5 + int(5*el.Seconds()+0.999) + 2; ok < 5 || ok > maxOK {
		t.Fatalf("client A: %d of 30 new flows answered in %v, want 5 to %d (5/second burst 5)", ok, el, maxOK)
	}
	if _, err := nflog.Wait("new-rtlimit-rate ", 2*time.Second); err != nil {
		t.Errorf("no log line with nftlb's default prefix \"new-rtlimit-rate \": %v", err)
	}
	// Client B is not limited by A's flood.
	if got := flood(second, 5); got != 5 {
		t.Errorf("client B: %d of 5 answered right after A's flood, want 5 (limits are per client)", got)
	}
	// limits-ttl 2: the client's element in the set lasts 2 s.
	set := "nl-" + nameHash("rate") + "-4-2"
	if out := e.nft(t, "list", "table", "inet", "xlb"); !strings.Contains(out, "set "+set+" {") || !strings.Contains(out, e.Client.IPv4.String()+" limit rate over 5/second expires") {
		t.Errorf("set %s lacks client A with an expiry:\n%s", set, out)
	}
	time.Sleep(3 * time.Second)
	if out := e.nft(t, "list", "table", "inet", "xlb"); strings.Contains(out, e.Client.IPv4.String()) {
		t.Errorf("after limits-ttl 2s client A is still in %s:\n%s", set, out)
	}

	// Verdict "log accept": over the limit, logged and let through.
	f.Verdict = model.VerdictLog | model.VerdictAccept
	f.NewRTLogPrefix = "OVER-FNAME "
	e.put(t, prev, f)
	if got := flood(e.Client.IPv4, 20); got != 20 {
		t.Errorf("verdict log accept: %d of 20 answered, want all", got)
	}
	if _, err := nflog.Wait("OVER-rate ", 2*time.Second); err != nil {
		t.Errorf("verdict log accept: no log line \"OVER-rate \": %v", err)
	}

	// est-connlimit 2 per client: A's third connection is dropped, B's
	// first passes.
	c := e.farm("conn", vip, 80, model.ProtoTCP, 8080)
	c.EstConnLimit = 2
	e.put(t, prev, c)
	tcp := netip.AddrPortFrom(vip, 80)
	for i := range 2 {
		conn, err := testutil.DialTCP(e.Client.NS, tcp, time.Second)
		if err != nil {
			t.Fatalf("client A connection %d: %v", i+1, err)
		}
		if _, err := testutil.ReadLine(conn, time.Second); err != nil {
			t.Fatalf("client A connection %d: %v", i+1, err)
		}
		defer conn.Close()
	}
	if conn, err := testutil.DialTCP(e.Client.NS, tcp, 700*time.Millisecond); err == nil {
		conn.Close()
		t.Errorf("client A's third connection accepted, want it dropped by est-connlimit 2")
	}
	if _, err := testutil.AskTCPFrom(e.Client.NS, netip.AddrPortFrom(second, 0), tcp); err != nil {
		t.Errorf("client B's first connection: %v (limits are per client)", err)
	}
	if _, err := nflog.Wait("est-connlimit-conn ", 2*time.Second); err != nil {
		t.Errorf("no log line \"est-connlimit-conn \": %v", err)
	}
}
