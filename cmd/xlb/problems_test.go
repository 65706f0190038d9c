package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// A state directory holding a farm saved before a rule became stricter
// (a log-prefix of invalid UTF-8, saved as 72 bytes): the daemon starts,
// serves it, `xlb problems` names it, and `xlb farm set` fixes it. Before,
// the daemon refused to start and served nothing.
func TestDaemonStartsOnInvalidSavedFarm(t *testing.T) {
	stateDir := t.TempDir()
	st, err := store.OpenJournal(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := model.DecodeFarms([]byte(`{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","log":"input"}`),
		func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	fs[0].LogPrefix = strings.Repeat("\xff", 24)
	if err := st.Commit(context.Background(), plan.Diff{Changes: []plan.FarmChange{{New: &fs[0]}}}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	d, code, logs := startDaemonWith(t, nil, nil, "--state-dir", stateDir)
	if d == nil {
		t.Fatalf("daemon exited %d: %s", code, logs)
	}
	env := map[string]string{"XLB_API": d.addr, "XLB_KEY_FILE": filepath.Join(stateDir, keyFileName)}
	r := runCLI(t, env, "", "problems")
	if r.code != 0 || !strings.Contains(r.out, "web") || !strings.Contains(r.out, "yes") || !strings.Contains(r.out, "log-prefix") {
		t.Fatalf("xlb problems: %+v", r)
	}
	if !strings.Contains(d.logs.String(), "no longer valid") {
		t.Errorf("the daemon did not log the problem: %s", d.logs)
	}
	if r := runCLI(t, env, "", "list", "-n"); r.code != 0 || !strings.Contains(r.out, "10.0.0.1:80") {
		t.Fatalf("list: %+v", r)
	}
	if r := runCLI(t, env, "", "farm", "set", "web", "--log-prefix", "web: "); r.code != 0 {
		t.Fatalf("farm set: %+v", r)
	}
	if r := runCLI(t, env, "", "problems"); r.code != 0 || r.out != "" {
		t.Fatalf("problems after the fix: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(stateDir, store.SetAsideDir)); err == nil {
		t.Errorf("a farm that loads was set aside")
	}
}
