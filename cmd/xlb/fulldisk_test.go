package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// A full disk does not stop the daemon from starting: it starts
// read-only, serves reads, keeps the kernel as saved, and refuses changes
// with 503 naming the cause. Before, it did not start until space was
// freed (the journal's changes could not be folded into the state file).
func TestDaemonStartsReadOnlyOnFullDisk(t *testing.T) {
	fs := testutil.SmallFS(t, "16m")
	dir := filepath.Join(fs, "state")
	kernel := fake.New()
	env := map[string]string{"XLB_KEY": "full-disk-test-key"}
	d, code, logs := startDaemonWith(t, samePlane(kernel), env, "--state-dir", dir, "--socket", "none")
	if d == nil {
		t.Fatalf("exit %d: %s", code, logs)
	}
	for i := range 200 { // each a journal record, not yet folded
		body := fmt.Sprintf(`{"farms":[{"name":"f%03d","virtual-addr":"10.0.%d.%d","virtual-ports":"80","backends":[{"name":"b","ip-addr":"10.1.0.1"}]}]}`, i, i/200, i%200+1)
		if st, resp := post(t, d.addr, env["XLB_KEY"], body); st != 200 {
			t.Fatalf("POST: %d %s", st, resp)
		}
	}
	d.stop()
	free := testutil.FillFS(t, fs)

	d, code, logs = startDaemonWith(t, samePlane(kernel), env, "--state-dir", dir, "--socket", "none")
	if d == nil {
		t.Fatalf("the daemon did not start on a full disk: exit %d: %s", code, logs)
	}
	if !strings.Contains(d.logs.String(), "serving read-only") {
		t.Errorf("no read-only warning in the log: %s", d.logs)
	}
	api := map[string]string{"XLB_API": d.addr, "XLB_KEY": env["XLB_KEY"]}
	if r := runCLI(t, api, "", "farm", "list"); r.code != 0 || strings.Count(r.out, "\n") != 200 {
		t.Fatalf("reads on a read-only daemon: %+v", r)
	}
	if n := len(kernel.Farms()); n != 200 {
		t.Fatalf("the kernel holds %d farms, want the 200 saved", n)
	}
	st, body := post(t, d.addr, env["XLB_KEY"], `{"farms":[{"name":"new","virtual-addr":"10.9.0.1"}]}`)
	if st != http.StatusServiceUnavailable || !strings.Contains(body, "read-only") || !strings.Contains(body, "no space left") {
		t.Fatalf("a change on a read-only daemon: %d %s", st, body)
	}
	if _, ok := kernel.Farms()["new"]; ok {
		t.Fatal("the refused change reached the kernel")
	}
	d.stop()

	free()
	d, code, logs = startDaemonWith(t, samePlane(kernel), env, "--state-dir", dir, "--socket", "none")
	if d == nil {
		t.Fatalf("after freeing space: exit %d: %s", code, logs)
	}
	if st, body := post(t, d.addr, env["XLB_KEY"], `{"farms":[{"name":"new","virtual-addr":"10.9.0.1"}]}`); st != 200 {
		t.Fatalf("a change after freeing space: %d %s", st, body)
	}
}
