package model

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func decodeCheckFarm(t *testing.T, body string, cur FarmLookup) (Farm, error) {
	t.Helper()
	if cur == nil {
		cur = func(string) (*Farm, bool) { return nil, false }
	}
	fs, err := DecodeFarms([]byte(body), cur)
	if err != nil {
		return Farm{}, err
	}
	return fs[0], nil
}

const checkedFarm = `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80",
	"check":{"type":"http","path":"/health","status":"200-399","inter":"1s","timeout":"500ms","rise":"2","fall":3},
	"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":"8080"},
	            {"name":"b2","ip-addr":"10.1.0.2","check":{"type":"tcp","port":"9000","fall":"5"}},
	            {"name":"b3","ip-addr":"10.1.0.3","check":{"type":"none"}}]}`

func TestCheckDecodeResolve(t *testing.T) {
	f, err := decodeCheckFarm(t, checkedFarm, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := f.Resolve(0)
	if !ok || c.Type != CheckHTTP || c.Path != "/health" || c.Port != 8080 || c.Inter != time.Second ||
		c.Timeout != 500*time.Millisecond || c.Rise != 2 || c.Fall != 3 || c.Method != "GET" ||
		c.FastInter != time.Second || c.DownInter != time.Second || FormatStatusRanges(c.Status) != "200-399" {
		t.Errorf("b1: %+v %v", c, ok)
	}
	// b2 overrides the type: the farm's timing stays, its http fields go.
	c, ok = f.Resolve(1)
	if !ok || c.Type != CheckTCP || c.Port != 9000 || c.Fall != 5 || c.Rise != 2 || c.Inter != time.Second || c.Path != "" {
		t.Errorf("b2: %+v %v", c, ok)
	}
	// b3 has no backend port: the farm's virtual port; and type none.
	if _, ok := f.Resolve(2); ok {
		t.Errorf("b3 (type none) is checked")
	}
	if !f.HasChecks() {
		t.Error("HasChecks false")
	}
}

func TestCheckRoundTrip(t *testing.T) {
	f, err := decodeCheckFarm(t, checkedFarm, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := f.AppendJSON(nil)
	var obj struct {
		Check    map[string]string `json:"check"`
		Backends []struct {
			Check map[string]string `json:"check"`
		} `json:"backends"`
	}
	if err := json.Unmarshal(out, &obj); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := map[string]string{"type": "http", "path": "/health", "status": "200-399", "inter": "1s", "timeout": "500ms", "rise": "2", "fall": "3"}
	for k, v := range want {
		if obj.Check[k] != v {
			t.Errorf("check %s = %q, want %q (%s)", k, obj.Check[k], v, out)
		}
	}
	if len(obj.Check) != len(want) {
		t.Errorf("check has extra members: %v", obj.Check)
	}
	if obj.Backends[0].Check != nil || obj.Backends[1].Check["port"] != "9000" || obj.Backends[2].Check["type"] != "none" {
		t.Errorf("backend checks: %s", out)
	}
	g, err := decodeCheckFarm(t, string(out), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !SameJSON(&f, &g) {
		t.Errorf("round trip differs:\n%s\n%s", out, g.AppendJSON(nil))
	}
}

// A check object is a patch; null removes it.
func TestCheckPatch(t *testing.T) {
	f, err := decodeCheckFarm(t, checkedFarm, nil)
	if err != nil {
		t.Fatal(err)
	}
	cur := func(string) (*Farm, bool) { return &f, true }
	g, err := decodeCheckFarm(t, `{"name":"web","check":{"inter":"250ms"}}`, cur)
	if err != nil {
		t.Fatal(err)
	}
	if g.Check.Inter != 250*time.Millisecond || g.Check.Path != "/health" || g.Check.Type != CheckHTTP {
		t.Errorf("patched check: %+v", g.Check)
	}
	if f.Check.Inter != time.Second {
		t.Errorf("the patch changed the original farm's check: %+v", f.Check)
	}
	h, err := decodeCheckFarm(t, `{"name":"web","check":null,"backends":[{"name":"b2","check":null},{"name":"b3","check":null}]}`, cur)
	if err != nil {
		t.Fatal(err)
	}
	if h.Check != nil || h.HasChecks() {
		t.Errorf("check not removed: %s", h.AppendJSON(nil))
	}
	// Read-only members of GET /farms/{name} are ignored on input.
	if _, err := decodeCheckFarm(t, `{"name":"web","virtual-addr":"10.0.0.1","backends":[{"name":"b","ip-addr":"10.1.0.1","health":"down","last-check":{"result":"fail"}}]}`, nil); err != nil {
		t.Errorf("read-only health members refused: %v", err)
	}
}

func TestCheckQuorumSorry(t *testing.T) {
	f, err := decodeCheckFarm(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80",
		"check":{"type":"tcp","quorum":"2","hysteresis":"1","sorry-server":"sorry","on-down":"flush"},
		"backends":[{"name":"b1","ip-addr":"10.1.0.1"},{"name":"sorry","ip-addr":"10.1.0.9"}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Resolve(1); ok {
		t.Error("the sorry server is checked")
	}
	if c, ok := f.Resolve(0); !ok || c.OnDown != OnDownFlush || c.Quorum != 2 {
		t.Errorf("b1: %+v", c)
	}
}

// Bad input names the object, the field and the value, and says what is
// allowed.
func TestCheckErrors(t *testing.T) {
	farm := func(check, backends string) string {
		if backends == "" {
			backends = `{"name":"b1","ip-addr":"10.1.0.1","port":"80"}`
		}
		return `{"name":"web","virtual-addr":"10.0.0.1","check":` + check + `,"backends":[` + backends + `]}`
	}
	for _, c := range []struct{ body, want string }{
		{farm(`{"type":"icmp"}`, ""), `farm "web": field "check.type" value "icmp": allowed values are none, tcp, http, https, udp, exec, agent`},
		{farm(`{"type":"tcp","inter":"0"}`, ""), `field "check.inter" value "0": must be a duration of 10ms to 24h0m0s`},
		{farm(`{"type":"tcp","inter":"1"}`, ""), `field "check.inter" value "1": must be a duration`},
		{farm(`{"type":"tcp","timeout":"0s"}`, ""), `field "check.timeout" value "0s"`},
		{farm(`{"type":"tcp","rise":"0x"}`, ""), `field "check.rise" value "0x"`},
		{farm(`{"type":"http","body-regex":"a(b"}`, ""), `farm "web": field "check.body-regex" value "a(b": does not compile: missing closing ): ` + "`a(b`"},
		{farm(`{"type":"http","body-digest":"xyz"}`, ""), `field "check.body-digest" value "xyz": must be an MD5`},
		{farm(`{"type":"http","status":"200-700"}`, ""), `field "check.status" value "200-700"`},
		{farm(`{"type":"tcp","path":"/x"}`, ""), `farm "web" backend "b1": field "check.path" value "/x": is not used by check type tcp`},
		{farm(`{"type":"exec"}`, ""), `farm "web" backend "b1": field "check.command": check type exec needs a command`},
		{farm(`{"type":"tcp"}`, `{"name":"b1","ip-addr":"10.1.0.1"}`), `farm "web" backend "b1": field "check.port": the tcp check needs a port`},
		{farm(`{"type":"tcp","sorry-server":"nope"}`, ""), `farm "web": field "check.sorry-server" value "nope": must name a backend of the farm`},
		{farm(`{"type":"tcp","sorry-server":"s"}`, `{"name":"b1","ip-addr":"10.1.0.1","port":"80"},{"name":"s","ip-addr":"fd00::9","port":"80"}`),
			`farm "web" backend "s": field "ip-addr" value "fd00::9": does not match the farm's family ipv4`},
		{farm(`{"type":"tcp","quorum":"2","hysteresis":"2"}`, ""), `field "check.hysteresis" value "2": must be below the quorum (2)`},
		{farm(`{"type":"tcp","inhibit":"on","on-down":"flush"}`, ""), `field "check.inhibit" value "on": inhibit keeps`},
		{farm(`{"type":"tcp","on-down":"drop"}`, ""), `field "check.on-down" value "drop": allowed values are keep, flush`},
		{farm(`{"type":"tcp"}`, `{"name":"b1","ip-addr":"10.1.0.1","port":"80","check":{"quorum":"2"}}`), `farm "web" backend "b1": field "check.quorum": is set in the farm's check only`},
		{farm(`{"type":"tcp","source-addr":"fd00::1"}`, ""), `farm "web" backend "b1": field "check.source-addr" value "fd00::1": is not of the backend's address family`},
		{farm(`{"type":"tcp","color":"red"}`, ""), `farm "web": field "check.color": unknown field; known fields are type, port,`},
		{farm(`"tcp"`, ""), `farm "web": field "check" value "\"tcp\"": must be an object`},
		{farm(`{"type":"none"}`, ""), `field "check.type" value "none": a farm without checks`},
	} {
		_, err := decodeCheckFarm(t, c.body, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n got  %v\n want %s", c.body, err, c.want)
		}
	}
}

func TestStatusOK(t *testing.T) {
	rs, err := ParseStatusRanges("200-299, 404")
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{200: true, 299: true, 300: false, 404: true, 503: false} {
		if StatusOK(rs, code) != want {
			t.Errorf("StatusOK(%d) = %v", code, !want)
		}
	}
	if !StatusOK(nil, 302) || StatusOK(nil, 503) {
		t.Error("default 200-399")
	}
}
