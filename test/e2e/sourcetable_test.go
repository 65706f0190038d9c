package e2e

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// Farms chosen by source table through the daemon (API, engine, store and
// the data plane): two farms on one VIP and port, a client in the source
// table reaching the source farm's backend and another the default
// farm's; a second default farm is refused and changes nothing; after
// kill -9 and a restart both are served as before (saved, reconciled).
func TestSourceTableDaemon(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			var e *lbEnv
			if plane == "ebpf" {
				e, _ = newEBPFEnv(t)
			} else {
				e = newEnv(t)
			}
			testSourceTable(t, e)
		})
	}
}

func testSourceTable(t *testing.T, e *lbEnv) {
	vip := netip.AddrPortFrom(testutil.VIP4(32), 80)
	inside, outside := deniedAddr(0), deniedAddr(1)
	for _, a := range []netip.Addr{inside, outside} {
		e.topo.Client.AddAddr(t, netip.PrefixFrom(a, 24))
	}
	e.mustCLI("table", "create", "inside", "type", "addr")
	e.mustCLI("table", "inside", "add", inside.String())
	farm := func(name, table string, backend int) string {
		b := e.topo.Backends[backend]
		src := ""
		if table != "" {
			src = fmt.Sprintf(`"source-table":%q,`, table)
		}
		return fmt.Sprintf(`{"farms":[{"name":%q,"virtual-addr":%q,"virtual-ports":"80","protocol":"tcp","mode":"snat",%s
			"backends":[{"name":"be","ip-addr":%q,"port":"8080"}]}]}`, name, vip.Addr(), src, b.IPv4)
	}
	for _, body := range []string{farm("web", "", 0), farm("web-in", "inside", 2)} {
		if code, out := e.api("POST", "/farms", body); code != 200 {
			t.Fatalf("POST /farms %s: %d %s", body, code, out)
		}
	}
	expect := func(what string) {
		t.Helper()
		for from, want := range map[netip.Addr]string{inside: "backend-3", outside: "backend-1"} {
			var got string
			for try := 0; try < 20 && got != want; try++ {
				if try > 0 {
					time.Sleep(100 * time.Millisecond)
				}
				reply, err := testutil.AskTCPFrom(e.topo.Client.NS, netip.AddrPortFrom(from, 0), vip)
				if err != nil {
					got = err.Error()
					continue
				}
				got, _, _ = testutil.ParseReply(reply)
			}
			if got != want {
				t.Errorf("%s: client %s reached %q, want %s", what, from, got, want)
				if !strings.Contains(strings.Join(e.args, " "), "ebpf") {
					t.Logf("ruleset:\n%s", e.nftList())
				}
			}
		}
	}
	expect("two farms on one key")
	if !strings.Contains(strings.Join(e.args, " "), "ebpf") {
		// Drift: the farms' tables deleted by another program; the
		// repair puts the source farm back as what it is (a farm
		// chosen by source table), not as a second farm on the key.
		for _, m := range regexp.MustCompile(`(?m)^table inet (xlb-[0-9a-f]{2}) \{`).FindAllStringSubmatch(e.nftList(), -1) {
			e.nft("delete", "table", "inet", m[1])
		}
		if _, ok := e.askWithin(vip, 3*time.Second); !ok {
			t.Fatalf("no traffic within 3 s after the farms' tables were deleted; kernel:\n%s", e.nftList())
		}
		expect("after a drift repair")
	}
	code, out := e.api("POST", "/farms", farm("web2", "", 1))
	if code < 400 || !strings.Contains(out, "farms may share it only when all but one choose their clients by source-table") {
		t.Errorf("a second default farm: %d %s", code, out)
	}
	if code, _ := e.api("GET", "/farms/web2", ""); code == 200 {
		t.Error("the refused farm was kept")
	}
	e.kill()
	e.start()
	expect("after kill -9 and a restart")
	e.mustCLI("table", "inside", "delete", inside.String())
	e.mustCLI("table", "inside", "add", outside.String())
	for from, want := range map[netip.Addr]string{inside: "backend-1", outside: "backend-3"} {
		reply, err := testutil.AskTCPFrom(e.topo.Client.NS, netip.AddrPortFrom(from, 0), vip)
		if got, _, _ := testutil.ParseReply(reply); err != nil || got != want {
			t.Errorf("table changed: client %s reached %q (%v), want %s", from, got, err, want)
		}
	}
}
