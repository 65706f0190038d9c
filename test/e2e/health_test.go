package e2e

import (
	"fmt"
	"net"
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
			// waitList waits until be2's line of `xlb list -n` ends with want.
			waitList := func(want string) {
				t.Helper()
				var out string
				for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					out = e.mustCLI("list", "-n")
					for _, line := range strings.Split(out, "\n") {
						if strings.Contains(line, "10.200.0.12:8080 ") && strings.HasSuffix(line, want) {
							return
						}
					}
				}
				t.Fatalf("be2's line of xlb list -n never ended with %q:\n%s", want, out)
			}
			waitList(" up health up")
			e.requireAllBackends(addr, 9)
			be2 := e.topo.Backends[1]
			fault := func(on bool) { t.Helper(); refuseSYNs(t, be2.Name, 8080, on) }
			// holdBE2 opens connections until one reaches be2, and keeps it.
			holdBE2 := func() net.Conn {
				t.Helper()
				for range 10 {
					c, err := testutil.DialTCP(e.topo.Client.NS, addr, 2*time.Second)
					if err != nil {
						t.Fatal(err)
					}
					line, err := testutil.ReadLine(c, 2*time.Second)
					if err == nil && strings.HasPrefix(line, "backend-2 ") {
						t.Cleanup(func() { c.Close() })
						return c
					}
					c.Close()
				}
				t.Fatal("no connection reached be2")
				return nil
			}
			kept := holdBE2()
			fault(true)
			waitList(" up health down weight 0 (connect refused)")
			// Found down: every new connection succeeds, none on be2.
			got, err := e.answers(addr, 30)
			if err != nil {
				t.Fatalf("a new connection failed after detection: %v (answers %v)", err, got)
			}
			if got["backend-2"] != 0 || got["backend-1"] == 0 || got["backend-3"] == 0 {
				t.Errorf("answers after detection: %v", got)
			}
			// on-down keep (the default): the established connection goes on.
			echo(t, kept, "still there")
			// The configuration is untouched: a dump has weight 1, state up.
			if dump := e.mustCLI("farm", "show", "web"); !strings.Contains(dump, `"health": "down"`) || strings.Contains(dump, `"state": "down"`) {
				t.Errorf("farm show:\n%s", dump)
			}
			fault(false)
			waitList(" up health up")
			e.requireAllBackends(addr, 9)

			// on-down flush: the established connection is cut.
			e.mustCLI("farm", "set", "web", "--on-down", "flush")
			waitList(" up health up")
			cut := holdBE2()
			fault(true)
			waitList(" up health down weight 0 (connect refused)")
			fmt.Fprintf(cut, "hello\n")
			if line, err := testutil.ReadLine(cut, 2*time.Second); err == nil {
				t.Errorf("on-down flush: the connection to the down backend still answers %q", line)
			}
			fault(false)
			waitList(" up health up")
			t.Logf("%s: answers while be2 was down: %v", plane, got)
		})
	}
}

// refuseSYNs makes a backend's port answer new connections (SYNs) with a
// reset, as a killed server's does, while established ones go on (on), or
// stops it (off): an nft table "fault" in the backend's namespace ns.
func refuseSYNs(t *testing.T, ns string, port int, on bool) {
	t.Helper()
	if !on {
		testutil.Run(t, ns, "nft", "delete", "table", "inet", "fault")
		return
	}
	testutil.Run(t, ns, "nft", "add", "table", "inet", "fault")
	testutil.Run(t, ns, "nft", "add", "chain", "inet", "fault", "in", "{ type filter hook input priority 0; }")
	testutil.Run(t, ns, "nft", "add", "rule", "inet", "fault", "in", "tcp", "dport", fmt.Sprint(port), "tcp", "flags", "&", "(syn|ack)", "==", "syn", "reject", "with", "tcp", "reset")
}
