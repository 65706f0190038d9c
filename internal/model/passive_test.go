package model

import (
	"strings"
	"testing"
	"time"
)

func TestPassiveDecodeRoundTrip(t *testing.T) {
	body := `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80",
		"check":{"passive":{"failures":"3","timeout":"500ms","ejection-time":"10s","max-ejected":"50%"}},
		"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":"8080"}]}`
	f, err := decodeCheckFarm(t, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := f.Check.Passive
	if p == nil || p.Failures != 3 || p.Timeout != 500*time.Millisecond || p.EjectionTime != 10*time.Second || p.MaxEjected != 50 {
		t.Fatalf("passive %+v", p)
	}
	if !f.HasChecks() {
		t.Error("a farm with passive checks only: HasChecks false")
	}
	if _, ok := f.Resolve(0); ok {
		t.Error("passive only: the backend has an active check")
	}
	r := p.Resolved()
	if r.MaxEjectionTime != 300*time.Second {
		t.Errorf("max-ejection-time default %v", r.MaxEjectionTime)
	}
	out := string(f.AppendJSON(nil))
	want := `"check":{"passive":{"failures":"3","timeout":"500ms","ejection-time":"10s","max-ejected":"50%"}}`
	if !strings.Contains(out, want) {
		t.Errorf("encoded:\n %s\nwant %s", out, want)
	}
	// A patch changes only the fields it names; null removes it.
	cur := func(string) (*Farm, bool) { return &f, true }
	g, err := decodeCheckFarm(t, `{"name":"web","check":{"passive":{"failures":"7"}}}`, cur)
	if err != nil {
		t.Fatal(err)
	}
	if g.Check.Passive.Failures != 7 || g.Check.Passive.MaxEjected != 50 || p.Failures != 3 {
		t.Errorf("patched %+v (old %+v)", g.Check.Passive, p)
	}
	g, err = decodeCheckFarm(t, `{"name":"web","check":{"passive":null}}`, cur)
	if err != nil || g.Check.Passive != nil {
		t.Errorf("null: %v %+v", err, g.Check)
	}
	// A passive check's configuration is not part of the active check's
	// key: changing it does not restart the active checks' health.
	a, _ := decodeCheckFarm(t, `{"name":"web","check":{"type":"tcp","passive":{}}}`, cur)
	b, _ := decodeCheckFarm(t, `{"name":"web","check":{"type":"tcp","passive":{"failures":"9"}}}`, cur)
	ca, _ := a.Resolve(0)
	cb, _ := b.Resolve(0)
	if a.CheckKey(0, &ca) != b.CheckKey(0, &cb) || a.PassiveKey(0) == b.PassiveKey(0) {
		t.Errorf("keys: active %q %q passive %q %q", a.CheckKey(0, &ca), b.CheckKey(0, &cb), a.PassiveKey(0), b.PassiveKey(0))
	}
}

func TestPassiveEjection(t *testing.T) {
	p := PassiveCheck{EjectionTime: 30 * time.Second}
	for _, c := range []struct {
		n    uint32
		want time.Duration
	}{{0, 30 * time.Second}, {1, 30 * time.Second}, {2, 60 * time.Second}, {10, 300 * time.Second}, {1 << 30, 300 * time.Second}} {
		if got := p.EjectionFor(c.n); got != c.want {
			t.Errorf("ejection %d: %v, want %v", c.n, got, c.want)
		}
	}
	for _, c := range []struct{ pct, n, want int }{{10, 3, 1}, {10, 20, 2}, {50, 3, 1}, {50, 4, 2}, {0, 5, 1}, {100, 5, 5}} {
		q := PassiveCheck{MaxEjected: uint32(c.pct), MaxEjectedSet: true}
		if got := q.MaxEjectedOf(c.n); got != c.want {
			t.Errorf("max-ejected %d%% of %d: %d, want %d", c.pct, c.n, got, c.want)
		}
	}
}

func TestPassiveErrors(t *testing.T) {
	farm := func(extra, check string) string {
		return `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80"` + extra + `,"check":` + check +
			`,"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":"80"}]}`
	}
	for _, c := range []struct{ body, want string }{
		{farm("", `{"passive":{"failures":"x"}}`), `farm "web": field "check.passive.failures" value "x": must be a whole number`},
		{farm("", `{"passive":{"timeout":"0"}}`), `field "check.passive.timeout" value "0": must be a duration of 10ms to 1m0s`},
		{farm("", `{"passive":{"max-ejected":"150%"}}`), `field "check.passive.max-ejected" value "150%": must be a percentage 0-100`},
		{farm("", `{"passive":{"ejection-time":"1m","max-ejection-time":"30s"}}`), `field "check.passive.max-ejection-time" value "30s": must not be shorter than ejection-time (1m0s)`},
		{farm("", `{"passive":{"colour":"red"}}`), `field "check.passive.colour": unknown field; known fields are failures, timeout, ejection-time, max-ejection-time, max-ejected`},
		{farm("", `{"passive":"on"}`), `field "check.passive" value "\"on\"": must be an object`},
		{farm(`,"mode":"dsr"`, `{"passive":{}}`), `farm "web": field "mode" value "dsr": passive checks watch`},
		{farm(`,"protocol":"udp"`, `{"passive":{}}`), `farm "web": field "protocol" value "udp": passive checks watch TCP handshakes`},
		{farm("", `{"type":"tcp"}`)[:len(farm("", `{"type":"tcp"}`))-3] + `,"check":{"passive":{}}}]}`, `farm "web" backend "b1": field "check.passive": is set in the farm's check only`},
	} {
		_, err := decodeCheckFarm(t, c.body, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n got  %v\n want %s", c.body, err, c.want)
		}
	}
}
