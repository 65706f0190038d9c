package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestHealthCheck, on both data planes: a backend whose port starts
// refusing connections (as a killed server's does: RST) is found down by
// the daemon's tcp check, shown so in `xlb list`, and takes no new
// connection once found; when it answers again it comes back. Bounds on
// waiting are generous: bench/health measures detection times.
func TestHealthCheck(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			var e *lbEnv
			if plane == "ebpf" {
				e, _ = newEBPFEnv(t)
			} else {
				e = newEnv(t)
			}
			vip := testutil.VIP4(1)
			e.addWebFarm(vip)
			e.mustCLI("farm", "set", "web", "--check", "tcp", "--inter", "200ms", "--timeout", "200ms", "--rise", "2", "--fall", "2")
			addr := netip.AddrPortFrom(vip, 80)
			waitList := func(want string) string {
				t.Helper()
				var out string
				for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					if out = e.mustCLI("list", "-n"); strings.Contains(out, want) {
						return out
					}
				}
				t.Fatalf("xlb list -n never showed %q:\n%s", want, out)
				return ""
			}
			waitList("10.200.0.12:8080               Masq    1      up health up")
			e.requireAllBackends(addr, 9)
			// be2's port refuses connections: a reset for every SYN.
			be2 := e.topo.Backends[1]
			testutil.Run(t, be2.Name, "nft", "add", "table", "inet", "fault")
			testutil.Run(t, be2.Name, "nft", "add", "chain", "inet", "fault", "in", "{ type filter hook input priority 0; }")
			testutil.Run(t, be2.Name, "nft", "add", "rule", "inet", "fault", "in", "tcp", "dport", "8080", "reject", "with", "tcp", "reset")
			waitList("10.200.0.12:8080               Masq    1      up health down weight 0 (connect refused)")
			// Found down: every new connection succeeds, none on be2.
			got, err := e.answers(addr, 30)
			if err != nil {
				t.Fatalf("a new connection failed after detection: %v (answers %v)", err, got)
			}
			if got["backend-2"] != 0 || got["backend-1"] == 0 || got["backend-3"] == 0 {
				t.Errorf("answers after detection: %v", got)
			}
			// The configuration is untouched: a dump has weight 1, state up.
			if dump := e.mustCLI("farm", "show", "web"); !strings.Contains(dump, `"health": "down"`) || strings.Contains(dump, `"state": "down"`) {
				t.Errorf("farm show:\n%s", dump)
			}
			testutil.Run(t, be2.Name, "nft", "delete", "table", "inet", "fault")
			waitList("10.200.0.12:8080               Masq    1      up health up")
			e.requireAllBackends(addr, 9)
			t.Logf("%s: answers while be2 was down: %v", plane, got)
		})
	}
}
