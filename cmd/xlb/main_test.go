package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/setup"
	"github.com/xlb-lb/xlb/internal/store"
)

const testKey = "cli-test-key"

type testDaemon struct {
	url   string
	plane *fake.Plane
	eng   *engine.Engine
}

// newDaemon serves the real API over a real engine, bbolt store and the fake plane.
func newDaemon(t *testing.T) *testDaemon {
	t.Helper()
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	plane := fake.New()
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(t.Context(), log, plane, st)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(log, eng, testKey))
	t.Cleanup(srv.Close)
	return &testDaemon{url: srv.URL, plane: plane, eng: eng}
}

type result struct {
	out, err string
	code     int
}

func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	a := &app{in: strings.NewReader(stdin), out: &out, errOut: &errOut,
		getenv: func(k string) string { return env[k] }, openDataplane: setup.Open}
	code := a.run(t.Context(), args)
	return result{out.String(), errOut.String(), code}
}

func (d *testDaemon) env() map[string]string {
	return map[string]string{"XLB_API": d.url, "XLB_KEY": testKey}
}

// xlb runs a command that must succeed and returns its stdout.
func (d *testDaemon) xlb(t *testing.T, args ...string) string {
	t.Helper()
	r := runCLI(t, d.env(), "", args...)
	if r.code != 0 {
		t.Fatalf("xlb %s: exit %d: %s", strings.Join(args, " "), r.code, r.err)
	}
	return r.out
}

// fails runs a command that must fail with one "xlb: ..." line naming every want.
func (d *testDaemon) fails(t *testing.T, want []string, args ...string) {
	t.Helper()
	r := runCLI(t, d.env(), "", args...)
	if r.code != 1 {
		t.Fatalf("xlb %s: exit %d, want 1 (stdout %q)", strings.Join(args, " "), r.code, r.out)
	}
	if !strings.HasPrefix(r.err, "xlb: ") || strings.Count(r.err, "\n") != 1 {
		t.Errorf("xlb %s: stderr %q is not one \"xlb: ...\" line", strings.Join(args, " "), r.err)
	}
	for _, w := range want {
		if !strings.Contains(r.err, w) {
			t.Errorf("xlb %s: error %q does not mention %q", strings.Join(args, " "), r.err, w)
		}
	}
}

func farmFields(t *testing.T, d *testDaemon, name string) map[string]any {
	t.Helper()
	var out struct{ Farms []map[string]any }
	if err := json.Unmarshal([]byte(d.xlb(t, "farm", "show", name)), &out); err != nil || len(out.Farms) != 1 {
		t.Fatalf("farm show %s: %v", name, err)
	}
	return out.Farms[0]
}

func TestFarmAndBackendCommands(t *testing.T) {
	d := newDaemon(t)
	d.xlb(t, "farm", "add", "web", "--vip", "10.0.0.1", "--ports", "80", "--proto", "tcp", "--mode", "snat", "--sched", "rr")
	d.fails(t, []string{`farm "web" already exists`}, "farm", "add", "web", "--vip", "10.0.0.9")
	d.xlb(t, "backend", "add", "web", "be1", "--ip", "10.200.0.11", "--port", "80")
	d.xlb(t, "backend", "add", "web", "be2", "--ip-addr", "10.200.0.12", "--port", "80", "--weight", "2")
	d.fails(t, []string{`backend "be1" already exists`}, "backend", "add", "web", "be1", "--ip", "10.200.0.13")
	d.xlb(t, "farm", "add", "dns", "--virtual-addr", "10.0.0.2", "--virtual-ports", "53", "--protocol", "udp", "--scheduler", "hash", "--persistence", "srcip", "--persist-ttl", "120")

	want := "Prot LocalAddress:Port Scheduler Flags\n" +
		"  -> RemoteAddress:Port           Forward Weight State\n" +
		"UDP  10.0.0.2:53 hash (srcip) persistent 120\n" +
		"TCP  10.0.0.1:80 rr\n" +
		"  -> 10.200.0.11:80               Masq    1      up\n" +
		"  -> 10.200.0.12:80               Masq    2      up\n"
	if got := d.xlb(t, "list", "-n"); got != want {
		t.Fatalf("list -n:\n%s\nwant\n%s", got, want)
	}

	// set changes only the flags given.
	d.xlb(t, "farm", "set", "web", "--sched", "weight", "--persistence", "srcip")
	f := farmFields(t, d, "web")
	if f["scheduler"] != "weight" || f["persistence"] != "srcip" || f["mode"] != "snat" || f["virtual-ports"] != "80" || len(f["backends"].([]any)) != 2 {
		t.Fatalf("after farm set: %v", f)
	}
	d.fails(t, []string{"nothing to change"}, "farm", "set", "web")
	d.fails(t, []string{`farm "nope" does not exist`}, "farm", "set", "nope", "--sched", "rr")

	d.xlb(t, "backend", "set", "web", "be2", "--weight", "0")
	d.fails(t, []string{`backend "be9" does not exist`}, "backend", "set", "web", "be9", "--weight", "1")
	bs := farmFields(t, d, "web")["backends"].([]any)
	if b := bs[1].(map[string]any); b["weight"] != "0" || b["ip-addr"] != "10.200.0.12" {
		t.Fatalf("be2 after set: %v", b)
	}
	d.xlb(t, "backend", "del", "web", "be1")
	d.fails(t, []string{`backend "be1" does not exist`}, "backend", "del", "web", "be1")
	if got := d.xlb(t, "farm", "list"); got != "dns\nweb\n" {
		t.Fatalf("farm list: %q", got)
	}
	d.xlb(t, "farm", "del", "dns")
	d.fails(t, []string{`farm "dns" does not exist`}, "farm", "show", "dns")
	if got := d.xlb(t, "farm", "list"); got != "web\n" {
		t.Fatalf("farm list after del: %q", got)
	}
	if _, ok := d.plane.Farms()["web"]; !ok || len(d.plane.Farms()) != 1 {
		t.Fatalf("plane holds %v", d.plane.Farms())
	}
}

func TestBadInput(t *testing.T) {
	d := newDaemon(t)
	d.xlb(t, "farm", "add", "web", "--vip", "10.0.0.1", "--ports", "80")
	before := d.xlb(t, "dump")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"farm", "set", "web", "--sched", "fastest"}, []string{`field "scheduler" value "fastest"`, "rr, weight, hash, symhash, maglev, lc, wlc"}},
		{[]string{"farm", "add", "w2", "--vip", "10.0.0.2", "--ports", "80,x"}, []string{"virtual-ports", "80,x"}},
		{[]string{"backend", "add", "web", "be9", "--ip", "10.200.0.300"}, []string{"ip-addr", "10.200.0.300"}},
		{[]string{"backend", "add", "web", "be9", "--ip", "fd00::9"}, []string{"ip-addr", "family"}},
		{[]string{"backend", "add", "web", "be9", "--ip", "10.0.0.9", "--weight", "-1"}, []string{"weight", "0-10000"}},
		{[]string{"farm", "add", "other", "--vip", "10.0.0.1", "--ports", "80"}, []string{"already served", "web"}},
		{[]string{"farm", "add", "w3", "--colour", "red"}, []string{"unknown flag", "--colour"}},
		{[]string{"farm", "add"}, []string{"needs NAME"}},
		{[]string{"backend", "add", "nope", "be1", "--ip", "10.0.0.9"}, []string{`farm "nope" does not exist`}},
		{[]string{"restore", "-f", "/nonexistent/state.json"}, []string{"no such file"}},
	} {
		d.fails(t, c.want, c.args...)
	}
	if after := d.xlb(t, "dump"); after != before {
		t.Fatalf("rejected commands changed the state:\n%s\n%s", before, after)
	}
	// A bad restore changes nothing either.
	r := runCLI(t, d.env(), `{"farms":[{"name":"x","virtual-addr":"10.0.0.5","mode":"nat"}]}`, "restore")
	if r.code != 1 || !strings.Contains(r.err, `field "mode" value "nat"`) {
		t.Fatalf("bad restore: %+v", r)
	}
	if after := d.xlb(t, "dump"); after != before {
		t.Fatalf("bad restore changed the state")
	}
}

func TestDumpSaveRestore(t *testing.T) {
	d := newDaemon(t)
	d.xlb(t, "farm", "add", "web", "--vip", "10.0.0.1", "--ports", "80,443", "--sched", "weight")
	d.xlb(t, "backend", "add", "web", "be1", "--ip", "10.200.0.11", "--weight", "3")
	d.xlb(t, "farm", "add", "v6", "--family", "ipv6", "--vip", "2001:db8::1", "--ports", "53", "--proto", "udp", "--mode", "dnat")
	d.xlb(t, "farm", "add", "fw", "--mark", "0x10", "--proto", "all")
	dump := d.xlb(t, "dump")
	if !strings.HasPrefix(dump, `{"farms":[`) || strings.Count(dump, `"limits-ttl":"`) != 3 || strings.Count(dump, `"weight":"`) != 1 {
		t.Fatalf("dump: %s", dump)
	}
	file := filepath.Join(t.TempDir(), "state.json")
	if out := d.xlb(t, "save", "-f", file); out != "" {
		t.Errorf("save -f printed %q", out)
	}
	saved, err := os.ReadFile(file)
	if err != nil || string(saved) != dump {
		t.Fatalf("saved file differs from dump: %v", err)
	}
	if out := d.xlb(t, "save"); out != dump {
		t.Fatalf("save to stdout differs from dump")
	}
	entries, _ := os.ReadDir(filepath.Dir(file))
	if len(entries) != 1 {
		t.Errorf("save left temporary files: %v", entries)
	}

	// Change things, then restore from the file: back to the saved state.
	d.xlb(t, "farm", "del", "v6")
	d.xlb(t, "farm", "set", "web", "--sched", "rr")
	d.xlb(t, "farm", "add", "extra", "--vip", "10.0.0.7")
	applies := d.plane.Applies()
	d.xlb(t, "restore", "-f", file)
	if d.plane.Applies() != applies+1 {
		t.Errorf("restore took %d transactions", d.plane.Applies()-applies)
	}
	if got := d.xlb(t, "dump"); got != dump {
		t.Fatalf("dump after restore differs:\n%s\n%s", dump, got)
	}

	// Restore from stdin into another daemon: the same dump.
	other := newDaemon(t)
	if r := runCLI(t, other.env(), dump, "restore"); r.code != 0 {
		t.Fatalf("restore from stdin: %s", r.err)
	}
	if got := other.xlb(t, "dump"); got != dump {
		t.Fatalf("dump -> restore -> dump differs")
	}
}

func TestClientKey(t *testing.T) {
	d := newDaemon(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte(testKey+"\n"), 0o600)
	env := map[string]string{"XLB_API": d.url}
	for _, c := range []struct {
		env  map[string]string
		args []string
		ok   bool
		want string
	}{
		{map[string]string{"XLB_API": d.url, "XLB_KEY": testKey}, nil, true, ""},
		{env, []string{"--key", testKey}, true, ""},
		{env, []string{"--key-file", keyFile}, true, ""},
		{map[string]string{"XLB_API": d.url, "XLB_KEY_FILE": keyFile}, nil, true, ""},
		{map[string]string{"XLB_KEY": testKey}, []string{"--api", strings.TrimPrefix(d.url, "http://")}, true, ""},
		{map[string]string{"XLB_API": d.url, "XLB_KEY": "wrong"}, nil, false, "wrong API key"},
		{map[string]string{"XLB_API": d.url, "XLB_KEY": "wrong"}, []string{"--key", testKey}, true, ""},
		{env, []string{"--key-file", keyFile + ".missing"}, false, "read API key"},
	} {
		r := runCLI(t, c.env, "", append(c.args, "farm", "list")...)
		if (r.code == 0) != c.ok || !strings.Contains(r.err, c.want) {
			t.Errorf("env %v args %v: exit %d, stderr %q", c.env, c.args, r.code, r.err)
		}
	}
}

func TestDaemonKey(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	key, err := daemonKey(log, "", "", dir)
	if err != nil || len(key) != 64 {
		t.Fatalf("generated key %q: %v", key, err)
	}
	st, err := os.Stat(filepath.Join(dir, keyFileName))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	if again, err := daemonKey(log, "", "", dir); err != nil || again != key {
		t.Fatalf("key not reused: %q %v", again, err)
	}
	if k, _ := daemonKey(log, "", "from-env", dir); k != "from-env" {
		t.Fatalf("XLB_KEY ignored: %q", k)
	}
	other := filepath.Join(t.TempDir(), "k")
	os.WriteFile(other, []byte(" file-key \n"), 0o600)
	if k, _ := daemonKey(log, other, "from-env", dir); k != "file-key" {
		t.Fatalf("--key-file ignored: %q", k)
	}
	os.WriteFile(other, nil, 0o600)
	if _, err := daemonKey(log, other, "", dir); err == nil {
		t.Fatal("empty key file accepted")
	}
}

// The daemon command, in process with the fake data plane: it generates a
// key, serves the CLI, keeps state across restarts and stops on cancel.
func TestDaemonCommand(t *testing.T) {
	stateDir := t.TempDir()
	start := func() (addr string, stop func()) {
		ctx, cancel := context.WithCancel(t.Context())
		ready := make(chan net.Addr, 1)
		var logs bytes.Buffer
		a := &app{in: strings.NewReader(""), out: io.Discard, errOut: &logs, getenv: func(string) string { return "" },
			openDataplane: func(_ context.Context, _ *slog.Logger, c setup.Flags) (dataplane.Dataplane, error) {
				if c.Plane != "nft" {
					return nil, fmt.Errorf("unexpected data plane %q", c.Plane)
				}
				return fake.New(), nil
			},
			daemonReady: func(a net.Addr) { ready <- a }}
		done := make(chan int, 1)
		go func() {
			done <- a.run(ctx, []string{"daemon", "--listen", "127.0.0.1:0", "--state-dir", stateDir, "--log-level", "debug"})
		}()
		select {
		case addr := <-ready:
			return addr.String(), func() {
				cancel()
				if code := <-done; code != 0 {
					t.Errorf("daemon exit %d: %s", code, logs.String())
				}
				if strings.Contains(logs.String(), readKey(t, stateDir)) {
					t.Errorf("the daemon logged its key")
				}
			}
		case code := <-done:
			t.Fatalf("daemon exited %d: %s", code, logs.String())
		case <-time.After(10 * time.Second):
			t.Fatal("daemon did not start")
		}
		panic("unreachable")
	}
	addr, stop := start()
	env := map[string]string{"XLB_API": addr, "XLB_KEY_FILE": filepath.Join(stateDir, keyFileName)}
	if r := runCLI(t, env, "", "farm", "add", "web", "--vip", "10.0.0.1", "--ports", "80"); r.code != 0 {
		t.Fatalf("farm add: %s", r.err)
	}
	if r := runCLI(t, map[string]string{"XLB_API": addr, "XLB_KEY": "bad"}, "", "farm", "list"); r.code != 1 {
		t.Fatalf("wrong key accepted")
	}
	stop()

	// A socket file left behind by a daemon killed with -9 is replaced.
	stale, err := net.Listen("unix", filepath.Join(stateDir, socketFileName))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	addr, stop = start()
	defer stop()
	env["XLB_API"] = addr
	if r := runCLI(t, env, "", "farm", "list"); r.code != 0 || r.out != "web\n" {
		t.Fatalf("after restart: %+v", r)
	}

	// The same API on the Unix socket in the state directory, mode 0600,
	// key still required.
	sock := filepath.Join(stateDir, socketFileName)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("API socket %s: %v %v, want a socket with mode 0600", sock, fi, err)
	}
	env["XLB_API"] = "unix:" + sock
	if r := runCLI(t, env, "", "list", "-n"); r.code != 0 || !strings.Contains(r.out, "10.0.0.1:80") {
		t.Fatalf("list -n over the socket: %+v", r)
	}
	if r := runCLI(t, map[string]string{"XLB_API": "unix:" + sock, "XLB_KEY": "bad"}, "", "farm", "list"); r.code != 1 || !strings.Contains(r.err, "wrong API key") {
		t.Fatalf("wrong key over the socket: %+v", r)
	}
	if r := runCLI(t, map[string]string{"XLB_API": "unix:" + sock + ".missing", "XLB_KEY": "k"}, "", "farm", "list"); r.code != 1 || !strings.Contains(r.err, "cannot reach the xlb daemon at unix:"+sock+".missing") {
		t.Fatalf("missing socket: %+v", r)
	}
}

func readKey(t *testing.T, dir string) string {
	raw, err := os.ReadFile(filepath.Join(dir, keyFileName))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw))
}

func TestDaemonFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"daemon", "--state-dir", t.TempDir(), "--dataplane", "xdp"}, `--dataplane "xdp": allowed values are nft, ebpf`},
		{[]string{"daemon", "--state-dir", t.TempDir(), "--dataplane", "ebpf", "--conn-table-size", "0"}, `--conn-table-size 0: allowed values are 1 to`},
		{[]string{"daemon", "--state-dir", t.TempDir(), "--dataplane", "nft", "--conn-table-size", "0"}, `--conn-table-size 0: allowed values are 1 to`},
		{[]string{"daemon", "--state-dir", t.TempDir(), "--dataplane", "nft", "--xdp", "generic"}, `--xdp: only with --dataplane ebpf`},
		{[]string{"daemon", "--state-dir", t.TempDir(), "--dataplane", "ebpf", "--ct-timeout-udp", "-1s"}, `--ct-timeout-udp -1s: allowed values are`},
		{[]string{"daemon", "--state-dir", t.TempDir(), "--dataplane", "ebpf", "--xdp", "fast"}, `--xdp "fast": allowed values are off, generic, native`},
		{[]string{"daemon", "--state-dir", t.TempDir(), "--dataplane", "nft", "--xdp", "native"}, `--xdp: only with --dataplane ebpf`},
		{[]string{"daemon", "--state-dir", t.TempDir(), "--log-level", "loud"}, `--log-level "loud"`},
	} {
		r := runCLI(t, map[string]string{}, "", c.args...)
		if r.code != 1 || !strings.Contains(r.err, c.want) {
			t.Errorf("%v: exit %d, stderr %q", c.args, r.code, r.err)
		}
	}
}

func TestHelpHasExamples(t *testing.T) {
	a := &app{getenv: func(string) string { return "" }}
	var check func(c *cobra.Command)
	check = func(c *cobra.Command) {
		if c.Example == "" {
			t.Errorf("%s has no Example", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			check(sub)
		}
	}
	check(a.rootCmd())
	// --help works on every command and shows the examples.
	r := runCLI(t, nil, "", "backend", "add", "--help")
	if r.code != 0 || !strings.Contains(r.out, "Examples:") || !strings.Contains(r.out, "--ip-addr") {
		t.Fatalf("backend add --help: %+v", r)
	}
}

// TestDaemonKubeCRDWithoutBinary: xlb (built without client-go) runs
// xlb-kube-daemon for --kube-crd, and says so when it is not installed.
func TestDaemonKubeCRDWithoutBinary(t *testing.T) {
	if kubeCRD() != nil {
		t.Skip("built with -tags kubecrd: the daemon is xlb-kube-daemon itself")
	}
	t.Setenv("PATH", t.TempDir())
	r := runCLI(t, map[string]string{}, "", "daemon", "--state-dir", t.TempDir(), "--kube-crd")
	if r.code != 1 || !strings.Contains(r.err, "--kube-crd: xlb-kube-daemon is not installed next to xlb or on PATH") {
		t.Fatalf("exit %d, stderr %q", r.code, r.err)
	}
}
