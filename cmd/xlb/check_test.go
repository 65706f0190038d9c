package main

import (
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/model"
)

// The CLI's check flags patch the farm's and backends' check objects.
func TestCheckFlags(t *testing.T) {
	d := newDaemon(t)
	d.xlb(t, "farm", "add", "web", "--vip", "10.0.0.1", "--ports", "80")
	d.xlb(t, "backend", "add", "web", "b1", "--ip", "10.200.0.11")
	d.xlb(t, "farm", "set", "web", "--check", "tcp", "--inter", "1s", "--fall", "2")
	f, _ := d.eng.Snapshot().Farm("web")
	if c := f.Check; c == nil || c.Type != model.CheckTCP || c.Inter != time.Second || c.Fall != 2 {
		t.Fatalf("check %+v", c)
	}
	d.xlb(t, "farm", "set", "web", "--timeout", "300ms", "--on-down", "flush")
	f, _ = d.eng.Snapshot().Farm("web")
	if c := f.Check; c.Type != model.CheckTCP || c.Inter != time.Second || c.Timeout != 300*time.Millisecond || c.OnDown != model.OnDownFlush {
		t.Fatalf("patched check %+v", c)
	}
	d.xlb(t, "backend", "set", "web", "b1", "--check", "none")
	f, _ = d.eng.Snapshot().Farm("web")
	if _, ok := f.Resolve(0); ok {
		t.Errorf("b1 still checked")
	}
	d.xlb(t, "backend", "set", "web", "b1", "--check", "inherit")
	f, _ = d.eng.Snapshot().Farm("web")
	if _, ok := f.Resolve(0); !ok || f.Backends[0].Check != nil {
		t.Errorf("b1 does not take the farm's check")
	}
	if out := d.xlb(t, "farm", "show", "web"); !strings.Contains(out, `"inter": "1s"`) {
		t.Errorf("farm show:\n%s", out)
	}
	d.fails(t, []string{`farm "web"`, `"check.inter"`, `"0"`, "must be a duration"}, "farm", "set", "web", "--inter", "0")
	d.fails(t, []string{`"check.type"`, `"icmp"`, "allowed values are none, tcp"}, "farm", "set", "web", "--check", "icmp")
	d.xlb(t, "farm", "set", "web", "--passive-failures", "3", "--max-ejected", "50%")
	f, _ = d.eng.Snapshot().Farm("web")
	if p := f.Check.Passive; p == nil || p.Failures != 3 || p.MaxEjected != 50 || f.Check.Type != model.CheckTCP {
		t.Fatalf("passive %+v", f.Check)
	}
	d.xlb(t, "farm", "set", "web", "--passive", "off")
	f, _ = d.eng.Snapshot().Farm("web")
	if f.Check.Passive != nil || f.Check.Type != model.CheckTCP {
		t.Fatalf("passive off: %+v", f.Check)
	}
	d.xlb(t, "farm", "set", "web", "--check", "none")
	f, _ = d.eng.Snapshot().Farm("web")
	if f.Check != nil {
		t.Errorf("check not removed: %+v", f.Check)
	}
	d.xlb(t, "farm", "set", "web", "--passive", "on")
	f, _ = d.eng.Snapshot().Farm("web")
	if f.Check == nil || f.Check.Passive == nil || f.Check.Type != model.CheckUnset {
		t.Errorf("passive on alone: %+v", f.Check)
	}
}
