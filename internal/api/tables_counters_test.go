package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// entryCountingPlane is the fake plane with per-entry counters: the i-th
// entry of a table (in key order) matched i+1 packets of 100 bytes; the
// first entry never matched.
type entryCountingPlane struct{ *fake.Plane }

func (entryCountingPlane) TableCounters(ctx context.Context, t *model.Table) (dataplane.TableCounters, error) {
	out := dataplane.TableCounters{}
	i := 0
	t.Entries("", func(e model.TableEntry) bool {
		if i > 0 {
			out[e.Key] = dataplane.EntryCounters{Packets: uint64(i), Bytes: 100 * uint64(i)}
		}
		i++
		return true
	})
	return out, nil
}

func TestTableCounters(t *testing.T) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(context.Background(), log, entryCountingPlane{fake.New()}, st)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, eng: eng, st: st, h: api.New(log, eng, testKey)}
	e.must("POST", "/tables", `{"tables":[{"name":"bl","type":"addr","verdict":"deny"}]}`)
	e.must("POST", "/tables/bl/entries", `{"entries":[{"key":"10.0.0.0/8"},{"key":"192.0.2.1"},{"key":"fd00::/64"}]}`)
	var got api.TableCountersJSON
	if err := json.Unmarshal([]byte(e.must("GET", "/tables/bl/counters", "")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != "bl" || len(got.Entries) != 2 || got.Entries[0] != (api.EntryCountersJSON{Key: "192.0.2.1", Packets: "1", Bytes: "100"}) ||
		got.Entries[1] != (api.EntryCountersJSON{Key: "fd00::/64", Packets: "2", Bytes: "200"}) {
		t.Errorf("GET /tables/bl/counters: %+v", got)
	}
	if r := e.do("GET", "/tables/nope/counters", ""); r.status != http.StatusNotFound {
		t.Errorf("counters of a missing table: %d %s", r.status, r.body)
	}
	plain := newEnv(t)
	plain.must("POST", "/tables", `{"tables":[{"name":"bl","type":"addr"}]}`)
	if r := plain.do("GET", "/tables/bl/counters", ""); r.status != http.StatusNotImplemented || !strings.Contains(r.body, "keeps no per-entry counters") {
		t.Errorf("GET /tables/bl/counters with the fake plane: %d %s", r.status, r.body)
	}
}
