package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTableCommands(t *testing.T) {
	d := newDaemon(t)
	d.xlb(t, "table", "create", "marks", "type", "addr", "valtype", "mark,farm", "limit", "5")
	d.xlb(t, "table", "bad", "create", "verdict", "deny") // ipfw's word order
	if out := d.xlb(t, "table", "marks", "add", "10.0.0.0/8", "16,web", "10.1.0.0/16", "mark=17"); !strings.Contains(out, "added 2 entries of table marks") {
		t.Errorf("add: %q", out)
	}
	// A batch from a file: bad lines are reported, the others added, exit 1.
	file := filepath.Join(t.TempDir(), "entries")
	os.WriteFile(file, []byte("# comment\n192.0.2.0/24 1\n10.0.0.0/8 2\n10.0.0.300 3\n"), 0o600)
	r := runCLI(t, d.env(), "", "table", "marks", "add", "-f", file)
	if r.code != 1 || !strings.Contains(r.out, "added 1 entries of table marks, 2 failed") ||
		!strings.Contains(r.err, `table "marks" entry "10.0.0.0/8": entry exists`) || !strings.Contains(r.err, `entry "10.0.0.300"`) {
		t.Errorf("file batch: exit %d\n%s\n%s", r.code, r.out, r.err)
	}
	// --atomic: nothing is added when one entry is bad; stdin with -f -.
	r = runCLI(t, d.env(), "172.16.0.0/12\nfd00::/8 x\n", "table", "marks", "add", "--atomic", "-f", "-")
	if r.code != 1 || !strings.Contains(r.err, `value field "mark" "x"`) {
		t.Errorf("atomic batch: exit %d %s", r.code, r.err)
	}
	if out := d.xlb(t, "table", "marks", "lookup", "10.1.2.3"); out != "10.1.0.0/16 mark=17,farm=\n" {
		t.Errorf("lookup: %q", out)
	}
	list := d.xlb(t, "table", "marks", "list")
	want := "--- table(marks), type addr, 3 entries ---\n10.0.0.0/8 mark=16,farm=web\n10.1.0.0/16 mark=17,farm=\n192.0.2.0/24 mark=1,farm=\n"
	if list != want {
		t.Errorf("list:\n%s\nwant\n%s", list, want)
	}
	if out := d.xlb(t, "table", "marks", "detail"); !strings.Contains(out, "items: 3, limit: 5") || !strings.Contains(out, "algorithm: fake") {
		t.Errorf("detail:\n%s", out)
	}
	d.xlb(t, "table", "marks", "lock")
	r = runCLI(t, d.env(), "", "table", "marks", "delete", "10.0.0.0/8")
	if r.code != 1 || !strings.Contains(r.err, `table "marks" is locked`) {
		t.Errorf("delete from a locked table: %d %s", r.code, r.err)
	}
	d.xlb(t, "table", "marks", "unlock")
	d.xlb(t, "table", "marks", "modify", "limit", "10")
	d.xlb(t, "table", "create", "next", "valtype", "mark,farm")
	d.xlb(t, "table", "next", "add", "198.51.100.0/24", "5,api")
	d.xlb(t, "table", "swap", "marks", "next")
	if out := d.xlb(t, "table", "marks", "lookup", "198.51.100.9"); !strings.HasPrefix(out, "198.51.100.0/24 mark=5,farm=api") {
		t.Errorf("after swap: %q", out)
	}
	r = runCLI(t, d.env(), "", "table", "bad", "swap", "marks")
	if r.code != 1 {
		t.Errorf("unknown verb accepted")
	}
	if out := d.xlb(t, "table", "next", "delete", "10.0.0.0/8", "192.0.2.0/24"); !strings.Contains(out, "deleted 2 entries") {
		t.Errorf("delete: %q", out)
	}
	d.xlb(t, "table", "next", "flush")
	d.xlb(t, "table", "next", "destroy")
	if out := d.xlb(t, "table", "list"); !strings.Contains(out, "table(bad)") || strings.Contains(out, "table(next)") {
		t.Errorf("table list:\n%s", out)
	}
	// Tables are in save/restore.
	dump := d.xlb(t, "dump")
	if !strings.Contains(dump, `"tables":[`) || !strings.Contains(dump, `"key":"198.51.100.0/24"`) {
		t.Errorf("dump lacks tables: %s", dump)
	}
}
