package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/events"
	"github.com/xlb-lb/xlb/internal/health"
)

type fixedChecks map[string]health.Status

func (c fixedChecks) Status(farm, backend string) (health.Status, bool) {
	st, ok := c[farm+"/"+backend]
	return st, ok
}

const checkedWeb = `{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80",
	"check":{"type":"http","path":"/health","inter":"1s","rise":"2","fall":"3"},
	"backends":[{"name":"b1","ip-addr":"10.200.0.11"},{"name":"b2","ip-addr":"10.200.0.12","check":{"type":"none"}}]}]}`

func markDown(t *testing.T, e *env, farm, backend, reason string) {
	t.Helper()
	f, _ := e.eng.Snapshot().Farm(farm)
	_, i := f.Backend(backend)
	c, _ := f.Resolve(i)
	u := engine.Up(farm, backend, f.CheckKey(i, &c), reason)
	u.Down = true
	if err := e.eng.SetHealth(context.Background(), []engine.HealthUpdate{u}); err != nil {
		t.Fatal(err)
	}
}

// GET /farms/{name} shows each backend's health and last check; the
// dump does not, and the shown farm can be put back as it is.
func TestHealthInFarm(t *testing.T) {
	e := newEnv(t)
	srv := e.h.(*api.Server)
	srv.SetChecks(fixedChecks{"web/b1": {Checked: true, Last: health.Result{Detail: "HTTP 503", Start: time.Unix(1e9, 0), Took: time.Millisecond}, Checks: 9, Fails: 3}})
	e.must("PUT", "/farms", checkedWeb)
	markDown(t, e, "web", "b1", "HTTP 503")
	var got struct {
		Farms []struct {
			Check    map[string]string
			Backends []map[string]any
		}
	}
	one := e.must("GET", "/farms/web", "")
	if err := json.Unmarshal([]byte(one), &got); err != nil {
		t.Fatal(err)
	}
	b1, b2 := got.Farms[0].Backends[0], got.Farms[0].Backends[1]
	last, _ := b1["last-check"].(map[string]any)
	if b1["health"] != "down" || b1["effective-weight"] != "0" || last["result"] != "fail" || last["reason"] != "HTTP 503" ||
		last["checks"] != "9" || last["downs"] != "1" || last["transition-reason"] != "HTTP 503" {
		t.Errorf("b1: %v", b1)
	}
	if b2["health"] != "unchecked" || b2["effective-weight"] != "1" || b2["last-check"] != nil {
		t.Errorf("b2: %v", b2)
	}
	if got.Farms[0].Check["path"] != "/health" {
		t.Errorf("check %v", got.Farms[0].Check)
	}
	if dump := e.must("GET", "/farms", ""); strings.Contains(dump, `"health"`) {
		t.Errorf("the dump shows health: %s", dump)
	}
	// Put back as shown: the read-only members are ignored, nothing changes.
	e.must("PUT", "/farms", one)
	if f, _ := e.eng.Snapshot().Farm("web"); f.Backends[0].Weight != 1 {
		t.Errorf("weight %d", f.Backends[0].Weight)
	}
	list := e.must("GET", "/farms?format=ipvsadm&numeric=1", "")
	if !strings.Contains(list, "up health down weight 0 (HTTP 503)\n") {
		t.Errorf("listing:\n%s", list)
	}
	// The plane has b1 at weight 0; the store and the snapshot weight 1.
	if w := e.plane.Farms()["web"].Backends[0].Weight; w != 0 {
		t.Errorf("plane weight %d", w)
	}
}

func TestCheckBadInput(t *testing.T) {
	e := newEnv(t)
	for body, want := range map[string]string{
		`{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","check":{"type":"ping"}}`:                  `field "check.type" value "ping": allowed values are`,
		`{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","check":{"type":"tcp","inter":"0"}}`:       `field "check.inter" value "0"`,
		`{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","check":{"type":"http","body-regex":"("}}`: `field "check.body-regex" value "(": does not compile`,
	} {
		r := e.do("PUT", "/farms", body)
		var msg struct{ Response string }
		json.Unmarshal([]byte(r.body), &msg)
		if r.status != http.StatusBadRequest || !strings.Contains(msg.Response, want) {
			t.Errorf("%s: %d %s", body, r.status, r.body)
		}
	}
	if e.eng.Snapshot().Len() != 0 || len(e.plane.Farms()) != 0 {
		t.Error("bad input changed something")
	}
}

// GET /events streams health events as server-sent events.
func TestEventsStream(t *testing.T) {
	e := newEnv(t)
	b := events.NewBroker(16)
	e.eng.SetEvents(b)
	e.h.(*api.Server).SetEvents(b)
	e.must("PUT", "/farms", checkedWeb)
	hs := httptest.NewServer(e.h)
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+"/events", nil)
	req.Header.Set(api.KeyHeader, testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	if line, _ := rd.ReadString('\n'); line != ": xlb events\n" {
		t.Fatalf("first line %q", line)
	}
	markDown(t, e, "web", "b1", "connect refused")
	var lines []string
	for len(lines) < 3 {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	if lines[0] != "id: 1" || lines[1] != "event: health" || !strings.Contains(lines[2], `"backend":"b1","state":"down","reason":"connect refused","weight":0`) {
		t.Errorf("event %q", lines)
	}
	// A stopping server ends its streams.
	e.h.(*api.Server).StopStreams()
	if rest, err := io.ReadAll(rd); err != nil || strings.TrimSpace(string(rest)) != "" {
		t.Errorf("after StopStreams: %q, %v", rest, err)
	}
}
