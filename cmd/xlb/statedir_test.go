package main

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// post sends a POST /farms and returns the status and body.
func post(t *testing.T, addr, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/farms", strings.NewReader(body))
	req.Header.Set("Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// A lost or mistyped --state-dir does not wipe the kernel: a daemon whose
// saved state is empty while the kernel holds farms refuses to start,
// naming them and --force-empty, and leaves the kernel alone. Before, it
// started and its Reconcile deleted every farm.
func TestLostStateDirKeepsKernel(t *testing.T) {
	kernel := fake.New() // one kernel across restarts
	base := t.TempDir()
	good := filepath.Join(base, "state")
	env := map[string]string{"XLB_KEY": "state-dir-test-key"}
	d, code, logs := startDaemonWith(t, samePlane(kernel), env, "--state-dir", good)
	if d == nil {
		t.Fatalf("exit %d: %s", code, logs)
	}
	if st, body := post(t, d.addr, env["XLB_KEY"], `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80"}]}`); st != 200 {
		t.Fatalf("POST: %d %s", st, body)
	}
	d.stop()

	empty := filepath.Join(base, "empty")
	os.Mkdir(empty, 0o700)
	for _, c := range []struct{ dir, want string }{
		{filepath.Join(base, "typo"), "did not exist"},
		{empty, "holds no farm"},
	} {
		d, code, logs := startDaemonWith(t, samePlane(kernel), env, "--state-dir", c.dir)
		if d != nil {
			t.Fatalf("--state-dir %s: the daemon started on an empty state while the kernel holds farms", c.dir)
		}
		for _, w := range []string{c.want, "farm web", "--force-empty", "would delete"} {
			if code != 1 || !strings.Contains(logs, w) {
				t.Errorf("--state-dir %s: exit %d, output does not say %q: %s", c.dir, code, w, logs)
			}
		}
		if _, ok := kernel.Farms()["web"]; !ok {
			t.Fatalf("--state-dir %s: the refused start deleted the kernel's farm", c.dir)
		}
	}
	// The right directory starts as before.
	d, code, logs = startDaemonWith(t, samePlane(kernel), env, "--state-dir", good)
	if d == nil {
		t.Fatalf("the right --state-dir: exit %d: %s", code, logs)
	}
	d.stop()
	// --force-empty starts empty and deletes the kernel's farms.
	d, code, logs = startDaemonWith(t, samePlane(kernel), env, "--state-dir", empty, "--force-empty")
	if d == nil {
		t.Fatalf("--force-empty: exit %d: %s", code, logs)
	}
	if n := len(kernel.Farms()); n != 0 || !strings.Contains(d.logs.String(), "--force-empty") {
		t.Fatalf("--force-empty: the kernel holds %d farms; logs %s", n, d.logs)
	}
}

// A state directory removed while the daemon runs stops it from
// acknowledging changes (503, the kernel untouched), while reads go on.
// Before, changes were acknowledged into deleted files and lost at the
// next start.
func TestStateDirRemovedWhileRunning(t *testing.T) {
	kernel := fake.New()
	dir := filepath.Join(t.TempDir(), "state")
	env := map[string]string{"XLB_KEY": "state-dir-test-key"}
	d, code, logs := startDaemonWith(t, samePlane(kernel), env, "--state-dir", dir)
	if d == nil {
		t.Fatalf("exit %d: %s", code, logs)
	}
	if st, body := post(t, d.addr, env["XLB_KEY"], `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80"}]}`); st != 200 {
		t.Fatalf("POST: %d %s", st, body)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	applies := kernel.Applies()
	st, body := post(t, d.addr, env["XLB_KEY"], `{"farms":[{"name":"api","virtual-addr":"10.0.0.2","virtual-ports":"80"}]}`)
	if st != http.StatusServiceUnavailable || !strings.Contains(body, "removed or replaced") {
		t.Fatalf("POST after the state directory was removed: %d %s", st, body)
	}
	if kernel.Applies() != applies || len(kernel.Farms()) != 1 {
		t.Fatalf("the refused change reached the kernel: %v", kernel.Farms())
	}
	r := runCLI(t, map[string]string{"XLB_API": d.addr, "XLB_KEY": env["XLB_KEY"]}, "", "farm", "list")
	if r.code != 0 || r.out != "web\n" {
		t.Fatalf("reads after the removal: %+v", r)
	}
}

// The same with the nftables plane in a namespace: the farm stays in the
// kernel when the daemon is started on a lost state directory.
func TestLostStateDirKeepsNftKernel(t *testing.T) {
	testutil.RequireRoot(t)
	_, ns := testutil.NewNetNS(t)
	open := func() (dataplane.Dataplane, error) {
		return nft.New(t.Context(), slog.New(slog.DiscardHandler), nft.Options{NetNS: ns, Shards: 4})
	}
	base := t.TempDir()
	env := map[string]string{"XLB_KEY": "state-dir-test-key"}
	d, code, logs := startDaemonWith(t, open, env, "--state-dir", filepath.Join(base, "state"), "--socket", "none")
	if d == nil {
		t.Fatalf("exit %d: %s", code, logs)
	}
	if st, body := post(t, d.addr, env["XLB_KEY"], `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","backends":[{"name":"b","ip-addr":"10.1.0.1"}]}]}`); st != 200 {
		t.Fatalf("POST: %d %s", st, body)
	}
	d.stop()
	d, code, logs = startDaemonWith(t, open, env, "--state-dir", filepath.Join(base, "lost"), "--socket", "none")
	if d != nil || code != 1 || !strings.Contains(logs, "table inet xlb-") || !strings.Contains(logs, "--force-empty") {
		t.Fatalf("a lost state directory: started %v, exit %d: %s", d != nil, code, logs)
	}
	p, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if objs, err := p.(dataplane.KernelInventory).KernelObjects(t.Context()); err != nil || len(objs) == 0 {
		t.Fatalf("the kernel lost the farm: %v %v", objs, err)
	}
}
