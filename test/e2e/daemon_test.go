// Package e2e drives the real xlb binary: a daemon in the LB namespace of a
// client -> lb -> backends topology, the CLI against its API, and real TCP
// traffic from the client, as a user would.
package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

const testKey = "e2e-test-key"

var (
	buildOnce sync.Once
	xlbPath   string
	buildErr  error
)

// xlbBinary builds cmd/xlb once per test run, or takes the one
// XLB_E2E_BIN names (bench/ha/run.sh builds it once, outside the
// privileged-test lock, for all its runs).
func xlbBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("XLB_E2E_BIN"); p != "" {
			xlbPath = p
			return
		}
		dir, err := os.MkdirTemp("", "xlb-e2e-bin")
		if err != nil {
			buildErr = err
			return
		}
		xlbPath = filepath.Join(dir, "xlb")
		out, err := exec.Command("go", "build", "-o", xlbPath, "../../cmd/xlb").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return xlbPath
}

// lbEnv is a topology with an xlb daemon in its LB namespace.
type lbEnv struct {
	t       *testing.T
	topo    *testutil.Topology
	bin     string
	state   string
	daemon  *exec.Cmd
	logFile string
	args    []string // extra daemon flags (e.g. the data plane's)
}

func newEnv(t *testing.T) *lbEnv { return newEnvWith(t, nil) }

// newEnvWith is newEnv with extra daemon flags.
func newEnvWith(t *testing.T, args []string) *lbEnv {
	testutil.RequireRoot(t)
	e := &lbEnv{t: t, bin: xlbBinary(t), state: t.TempDir(), args: args}
	e.topo = testutil.NewTopology(t, testutil.TopologyOptions{Backends: 3})
	for i, b := range e.topo.Backends {
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), fmt.Sprintf("backend-%d", i+1))
	}
	e.logFile = filepath.Join(t.TempDir(), "daemon.log")
	e.start()
	t.Cleanup(func() {
		e.kill()
		if t.Failed() {
			log, _ := os.ReadFile(e.logFile)
			t.Logf("daemon log:\n%s", log)
		}
	})
	return e
}

func (e *lbEnv) start() {
	e.t.Helper()
	logf, err := os.OpenFile(e.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		e.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", e.topo.LB.Name, e.bin, "daemon",
		"--listen", "127.0.0.1:5555", "--state-dir", e.state, "--log-level", "debug"}, e.args...)...)
	cmd.Env = append(os.Environ(), "XLB_KEY="+testKey)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.daemon = cmd
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := e.cli("farm", "list"); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatal("daemon did not answer within 10s")
}

// kill stops the daemon with SIGKILL: no cleanup of any kind runs.
func (e *lbEnv) kill() {
	if e.daemon == nil {
		return
	}
	e.daemon.Process.Signal(syscall.SIGKILL)
	e.daemon.Wait()
	e.daemon = nil
}

// cli runs `xlb args...` in the LB namespace.
func (e *lbEnv) cli(args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", e.topo.LB.Name, e.bin}, args...)...)
	cmd.Env = append(os.Environ(), "XLB_KEY="+testKey, "XLB_API=http://127.0.0.1:5555")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("xlb %s: %v: %s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func (e *lbEnv) mustCLI(args ...string) string {
	e.t.Helper()
	out, err := e.cli(args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *lbEnv) nftList() string {
	e.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", e.topo.LB.Name, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		e.t.Fatalf("nft list: %v: %s", err, out)
	}
	return string(out)
}

func (e *lbEnv) addWebFarm(vip netip.Addr) {
	e.mustCLI("farm", "add", "web", "--vip", vip.String(), "--ports", "80", "--proto", "tcp", "--mode", "snat", "--sched", "rr")
	for i, b := range e.topo.Backends {
		e.mustCLI("backend", "add", "web", fmt.Sprintf("be%d", i+1), "--ip", b.IPv4.String(), "--port", "8080")
	}
}

// answers sends n new connections to addr and counts the backends that answered.
func (e *lbEnv) answers(addr netip.AddrPort, n int) (map[string]int, error) {
	got := map[string]int{}
	for range n {
		reply, err := testutil.AskTCP(e.topo.Client.NS, addr)
		if err != nil {
			return got, err
		}
		name, _, err := testutil.ParseReply(reply)
		if err != nil {
			return got, err
		}
		got[name]++
	}
	return got, nil
}

// requireAllBackends makes at least n connections through addr, and more
// (up to 10 n) until every backend has answered one: a hashing scheduler
// sends each new connection (a new source port) to a backend at random,
// so with n connections and 3 backends one gets none with probability
// 3 (2/3)^n, 8 % at n = 9. Every connection must be answered.
func (e *lbEnv) requireAllBackends(addr netip.AddrPort, n int) {
	e.t.Helper()
	got, err := e.answers(addr, n)
	for tries := n; err == nil && len(got) < len(e.topo.Backends) && tries < 10*n; tries++ {
		var more map[string]int
		more, err = e.answers(addr, 1)
		for k, v := range more {
			got[k] += v
		}
	}
	if err != nil {
		e.t.Fatalf("request through %s: %v (answers so far %v)", addr, err, got)
	}
	for i := range e.topo.Backends {
		if got[fmt.Sprintf("backend-%d", i+1)] == 0 {
			e.t.Fatalf("backend-%d got no connection of %d or more: %v", i+1, n, got)
		}
	}
}

// echo checks that an established connection still carries data both ways.
func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
		t.Fatalf("write on long-lived connection: %v", err)
	}
	line, err := testutil.ReadLine(c, 3*time.Second)
	if err != nil || line != msg {
		t.Fatalf("long-lived connection: got %q, %v; want echo %q", line, err, msg)
	}
}

// A connection survives kill -9 of the daemon and its restart; new
// connections keep being balanced while the daemon is down and after.
func TestConnectionSurvivesKill9AndRestart(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(1), 80)
	e.addWebFarm(vip.Addr())
	e.requireAllBackends(vip, 30)

	conn, err := testutil.DialTCP(e.topo.Client.NS, vip, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := testutil.ReadLine(conn, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	echo(t, conn, "before")

	e.kill()
	echo(t, conn, "daemon-down")
	e.requireAllBackends(vip, 30)

	e.start()
	echo(t, conn, "after-restart")
	e.requireAllBackends(vip, 30)
	if out := e.mustCLI("list", "-n"); !strings.Contains(out, vip.Addr().String()) || strings.Count(out, "->") < 4 {
		t.Errorf("xlb list -n after restart:\n%s", out)
	}
}

// Every acknowledged change is still there after kill -9, in the saved state
// and in the kernel.
func TestAcknowledgedChangeSurvivesKill9(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(2), 80)
	e.addWebFarm(vip.Addr())
	e.mustCLI("backend", "set", "web", "be3", "--state", "off")
	e.kill() // right after the acknowledgement
	e.start()
	got, err := e.answers(vip, 30)
	if err != nil {
		t.Fatal(err)
	}
	if got["backend-3"] != 0 || got["backend-1"] == 0 || got["backend-2"] == 0 {
		t.Errorf("after kill -9 and restart, be3 (set off before the kill) must get nothing: %v", got)
	}
}

// Rules deleted by hand come back when the daemon starts.
func TestRestartRepairsDrift(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(3), 80)
	e.addWebFarm(vip.Addr())
	want := e.nftList()
	e.kill()
	if out, err := exec.Command("ip", "netns", "exec", e.topo.LB.Name, "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("delete table by hand: %v: %s", err, out)
	}
	if _, err := testutil.AskTCP(e.topo.Client.NS, vip); err == nil {
		t.Fatal("traffic still balanced with the table deleted: the test cannot see a repair")
	}
	e.start()
	e.requireAllBackends(vip, 30)
	if got := e.nftList(); normalize(got) != normalize(want) {
		t.Errorf("kernel after repair differs from before:\n--- before\n%s\n--- after\n%s", want, got)
	}
}

// Parts of a listing that legitimately change when the rules are re-created:
// counters, and the generation suffix of a farm's backend map (a farm's map is
// replaced under a new name so a packet never sees a half-updated map).
var (
	countersRe = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	mapGenRe   = regexp.MustCompile(`(m-[0-9a-f]{16})-[a-z0-9]+`)
)

func normalize(s string) string {
	return mapGenRe.ReplaceAllString(withoutCounters(s), "$1")
}

// withoutCounters is an nft listing with its counters' values left out.
func withoutCounters(s string) string {
	return countersRe.ReplaceAllString(s, "counter")
}

// Bad input through the CLI gets an error naming the field, and changes
// neither the kernel nor the saved state.
func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(4), 80)
	e.addWebFarm(vip.Addr())
	kernel := e.nftList()
	saved := e.mustCLI("dump")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"farm", "set", "web", "--sched", "fastest"}, []string{"scheduler", "fastest", "rr"}},
		{[]string{"backend", "add", "web", "be9", "--ip", "10.200.0.300"}, []string{"ip-addr", "10.200.0.300"}},
		{[]string{"backend", "add", "web", "be9", "--ip", "fd00::9"}, []string{"ip-addr", "family"}},
		{[]string{"farm", "add", "other", "--vip", vip.Addr().String(), "--ports", "80"}, []string{"already served", "web"}},
		{[]string{"farm", "del", "nosuchfarm"}, []string{"nosuchfarm", "does not exist"}},
		// Combinations valid field by field but not together.
		{[]string{"farm", "set", "web", "--helper", "tftp"}, []string{"helper", "tftp", "protocol udp", "has protocol tcp"}},
		{[]string{"farm", "set", "web", "--mode", "stlsdnat", "--persistence", "srcip"}, []string{"persistence", "srcip", "stlsdnat"}},
		{[]string{"farm", "set", "web", "--mode", "dsr"}, []string{"port", "8080", "dsr"}},
		{[]string{"farm", "set", "web", "--mode", "stlsdnat"}, []string{"scheduler", "rr", "hash, symhash or maglev"}},
	} {
		out, err := e.cli(c.args...)
		if err == nil {
			t.Errorf("xlb %v accepted:\n%s", c.args, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("xlb %v: error %q does not mention %q", c.args, strings.TrimSpace(out), w)
			}
		}
	}
	if got := e.nftList(); withoutCounters(got) != withoutCounters(kernel) {
		t.Errorf("kernel changed by rejected input:\n--- before\n%s\n--- after\n%s", kernel, got)
	}
	if got := e.mustCLI("dump"); got != saved {
		t.Errorf("state changed by rejected input")
	}
}

// Deleting a farm stops new connections to its VIP.
func TestDeleteFarmStopsTraffic(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(5), 80)
	e.addWebFarm(vip.Addr())
	e.requireAllBackends(vip, 9)
	e.mustCLI("farm", "del", "web")
	if reply, err := testutil.AskTCP(e.topo.Client.NS, vip); err == nil {
		t.Errorf("deleted farm still answered: %q", reply)
	}
}

// TestSessionsAPI: a farm with persistence lists its sessions over the API
// and deletes one client's.
func TestSessionsAPI(t *testing.T) {
	e := newEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(5), 80)
	e.addWebFarm(vip.Addr())
	e.mustCLI("farm", "set", "web", "--persistence", "srcip", "--persist-ttl", "120")
	got, err := e.answers(vip, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("one client with persistence reached %v", got)
	}
	var backend string
	for b := range got {
		backend = b
	}
	hc := testutil.HTTPClient(e.topo.LB.NS)
	call := func(method, path string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(method, "http://127.0.0.1:5555"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Key", testKey)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Header
	}
	client := e.topo.Client.IPv4.String()
	status, body, _ := call("GET", "/farms/web/sessions")
	// The servers answer "backend-N"; the farm's backends are be1..be3 on
	// the same hosts.
	want := fmt.Sprintf(`{"client":"%s","backend":"be%s"`, client, strings.TrimPrefix(backend, "backend-"))
	if status != 200 || !strings.Contains(body, want) {
		t.Fatalf("GET sessions: %d %s, want %s", status, body, want)
	}
	// nftlb's reply; the count is in a header.
	if status, body, h := call("DELETE", "/farms/web/sessions/"+client); status != 200 || body != `{"response": "success"}` || h.Get("X-Xlb-Sessions-Deleted") != "1" {
		t.Fatalf("DELETE session: %d %s %v", status, body, h)
	}
	if status, body, _ := call("GET", "/farms/web/sessions"); status != 200 || !strings.Contains(body, `"sessions":[]`) {
		t.Fatalf("GET sessions after delete: %d %s", status, body)
	}
	// DELETE /farms/web/sessions flushes every session.
	if _, err := e.answers(vip, 1); err != nil {
		t.Fatal(err)
	}
	if status, body, _ := call("GET", "/farms/web/sessions"); status != 200 || !strings.Contains(body, client) {
		t.Fatalf("GET sessions before the flush: %d %s", status, body)
	}
	if status, body, h := call("DELETE", "/farms/web/sessions"); status != 200 || body != `{"response": "success"}` || h.Get("X-Xlb-Sessions-Deleted") != "1" {
		t.Fatalf("flush sessions: %d %s %v", status, body, h)
	}
	if status, body, _ := call("GET", "/farms/web/sessions"); status != 200 || !strings.Contains(body, `"sessions":[]`) {
		t.Fatalf("GET sessions after the flush: %d %s", status, body)
	}
}
