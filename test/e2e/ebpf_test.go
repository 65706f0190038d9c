package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// mountBPFFS mounts a bpf file system of the test's own on a temporary
// directory (so pins never collide with other tests or a real daemon, and
// they outlive the daemon's `ip netns exec` mount namespace), and unmounts
// it at cleanup, which drops every pin left.
func mountBPFFS(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "xlb-e2e-bpffs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		t.Fatalf("mount bpffs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return filepath.Join(dir, "xlb")
}

func newEBPFEnv(t *testing.T, extra ...string) (*lbEnv, string) {
	testutil.RequireRoot(t)
	pin := mountBPFFS(t)
	args := append([]string{"--dataplane", "ebpf", "--pin-path", pin, "--conn-table-size", "4096"}, extra...)
	return newEnvWith(t, args), pin
}

// loop is a bounded steady request loop: one new TCP connection at a time
// through the VIP, until stopped, at most max requests or until deadline.
type loop struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	stop       chan struct{}
	done       chan struct{}
}

func startLoop(e *lbEnv, vip netip.AddrPort, max int, deadline time.Duration) *loop {
	l := &loop{stop: make(chan struct{}), done: make(chan struct{})}
	end := time.Now().Add(deadline)
	go func() {
		defer close(l.done)
		for i := 0; i < max && time.Now().Before(end); i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			reply, err := testutil.AskTCP(e.topo.Client.NS, vip)
			if err == nil && !strings.HasPrefix(reply, "backend-") {
				err = fmt.Errorf("unexpected reply %q", reply)
			}
			if err != nil {
				l.failed.Add(1)
				l.mu.Lock()
				if len(l.errs) < 5 {
					l.errs = append(l.errs, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
				}
				l.mu.Unlock()
				continue
			}
			l.ok.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return l
}

func (l *loop) finish(t *testing.T, minOK int64) {
	t.Helper()
	close(l.stop)
	<-l.done
	ok, failed := l.ok.Load(), l.failed.Load()
	t.Logf("request loop: %d answered, %d failed", ok, failed)
	if failed != 0 {
		t.Errorf("%d requests failed across the restarts: %v", failed, l.errs)
	}
	if ok < minOK {
		t.Errorf("only %d requests answered, want at least %d: the loop did not cover the restarts", ok, minOK)
	}
}

// linkProgram returns the ids of the tcx link pinned for ifname and of the
// program it runs.
func linkProgram(t *testing.T, pin, ifname string) (linkID, progID uint32) {
	t.Helper()
	l, err := link.LoadPinnedLink(filepath.Join(pin, "link_ingress_"+ifname), nil)
	if err != nil {
		t.Fatalf("load pinned link of %s: %v", ifname, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return uint32(info.ID), uint32(info.Program)
}

// Hitless restart of the eBPF data plane: a long-lived connection and a
// steady loop of new connections see no failure across kill -9, a restart
// adopting the pinned maps and links, and an upgrade that replaces the
// program (different constants: a new program object) in the pinned links.
func TestEBPFHitlessRestartAndUpgrade(t *testing.T) {
	e, pin := newEBPFEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(21), 80)
	e.addWebFarm(vip.Addr())
	e.requireAllBackends(vip, 9)

	conn, err := testutil.DialTCP(e.topo.Client.NS, vip, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := testutil.ReadLine(conn, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	echo(t, conn, "before")
	ifname := e.topo.LB.Link
	link1, prog1 := linkProgram(t, pin, ifname)

	l := startLoop(e, vip, 5000, 60*time.Second)
	time.Sleep(300 * time.Millisecond)

	e.kill()
	time.Sleep(300 * time.Millisecond) // no daemon: the pinned program balances alone
	echo(t, conn, "daemon-down")
	e.start()
	time.Sleep(300 * time.Millisecond)
	echo(t, conn, "after-restart")
	link2, prog2 := linkProgram(t, pin, ifname)
	if link2 != link1 {
		t.Errorf("restart replaced the link (%d -> %d): the program was detached meanwhile", link1, link2)
	}

	// Upgrade: other program constants make another program object, which
	// the restarted daemon swaps into the same links; maps stay.
	e.kill()
	e.args = append(e.args, "--ct-timeout-tcp", "1h")
	e.start()
	time.Sleep(300 * time.Millisecond)
	echo(t, conn, "after-upgrade")
	link3, prog3 := linkProgram(t, pin, ifname)
	if link3 != link1 {
		t.Errorf("upgrade replaced the link (%d -> %d)", link1, link3)
	}
	if prog3 == prog1 || prog3 == prog2 {
		t.Errorf("upgrade kept the program (ids %d, %d, %d)", prog1, prog2, prog3)
	}
	l.finish(t, 20)
	e.requireAllBackends(vip, 9)
}

// Through the CLI, the eBPF daemon refuses what its data plane cannot do,
// naming the field, and the farm is not created.
func TestEBPFRefusesWhatItCannotDo(t *testing.T) {
	e, _ := newEBPFEnv(t)
	vip := testutil.VIP4(22).String()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"farm", "add", "ftp", "--vip", vip, "--ports", "21", "--helper", "ftp"}, []string{"helper", "ftp", "nft data plane"}},
		{[]string{"farm", "add", "lim", "--vip", vip, "--ports", "80", "--est-connlimit", "100"}, []string{"est-connlimit", "ebpf"}},
		{[]string{"farm", "add", "sctp", "--vip", vip, "--ports", "80", "--proto", "sctp"}, []string{"protocol", "sctp", "ebpf"}},
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
	if out := e.mustCLI("farm", "list"); strings.TrimSpace(out) != "" {
		t.Errorf("refused farms were created: %q", out)
	}
}

// Counters and the connection log through the real daemon: n connections
// to a farm with log set; `xlb list -n --stats` shows n connections for the
// farm and, per backend, as many as it answered; the daemon's log has one
// "new connection" line per connection, naming the farm, its prefix and
// the backend.
func TestEBPFCountersAndLog(t *testing.T) {
	e, _ := newEBPFEnv(t)
	vip := netip.AddrPortFrom(testutil.VIP4(23), 80)
	e.addWebFarm(vip.Addr())
	e.mustCLI("farm", "set", "web", "--log", "forward", "--log-prefix", "e2e-web")
	const n = 9
	got, err := e.answers(vip, n)
	if err != nil {
		t.Fatal(err)
	}
	stats := e.mustCLI("list", "-n", "--stats")
	t.Logf("answers %v\n%s", got, stats)
	lines := strings.Split(stats, "\n")
	conns := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				if f := strings.Fields(strings.TrimPrefix(l, prefix)); len(f) == 5 {
					return f[0]
				}
			}
		}
		return "?"
	}
	if c := conns("TCP  " + vip.String() + " "); c != fmt.Sprint(n) {
		t.Errorf("farm line shows %s connections, want %d", c, n)
	}
	for i, b := range e.topo.Backends {
		if c := conns("  -> " + netip.AddrPortFrom(b.IPv4, 8080).String() + " "); c != fmt.Sprint(got[fmt.Sprintf("backend-%d", i+1)]) {
			t.Errorf("backend be%d shows %s connections, answered %d", i+1, c, got[fmt.Sprintf("backend-%d", i+1)])
		}
	}
	// The log lines are written as the daemon reads the ring buffer.
	var logged int
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		raw, err := os.ReadFile(e.logFile)
		if err != nil {
			t.Fatal(err)
		}
		logged = 0
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.Contains(l, `msg="new connection"`) && strings.Contains(l, "prefix=e2e-web farm=web backend=be") {
				logged++
			}
		}
		if logged >= n {
			break
		}
	}
	if logged != n {
		t.Errorf("%d connection log lines for farm web, want %d", logged, n)
	}
}
