package observe

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/health"
	xmodel "github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// countingPlane is the fake plane with counters, connection counts and
// packet statistics that follow from each backend's position, so a test
// can tell every number apart.
type countingPlane struct {
	*fake.Plane
}

// backendCounters are backend j of farm i's counters.
func backendCounters(i, j int) dataplane.Counters {
	base := uint64(i*100 + j + 1)
	return dataplane.Counters{Connections: base, InPackets: base * 10, InBytes: base * 1000, OutPackets: base * 9, OutBytes: base * 900}
}

func farmIndex(name string) int {
	var i int
	fmt.Sscanf(name, "farm%d", &i)
	return i
}

func (p countingPlane) Counters(ctx context.Context, f *xmodel.Farm) (dataplane.FarmCounters, error) {
	i := farmIndex(f.Name)
	var out dataplane.FarmCounters
	for j, b := range f.Backends {
		c := backendCounters(i, j)
		out.Add(c)
		out.Backends = append(out.Backends, dataplane.BackendCounters{Name: b.Name, Counters: c})
	}
	return out, nil
}

func (p countingPlane) CountConns(ctx context.Context, farms []*xmodel.Farm, _ *plan.ConnOwners) (dataplane.ConnTable, error) {
	t := dataplane.ConnTable{Capacity: 262144, Backends: map[string][]dataplane.ConnCounts{}}
	for _, f := range farms {
		i := farmIndex(f.Name)
		cs := make([]dataplane.ConnCounts, len(f.Backends))
		for j := range cs {
			cs[j] = dataplane.ConnCounts{Active: uint64(i + j), Inactive: uint64(j)}
			t.Entries += 2 * (cs[j].Active + cs[j].Inactive)
		}
		t.Backends[f.Name] = cs
	}
	return t, nil
}

func (p countingPlane) PacketStats(ctx context.Context) (map[string]uint64, error) {
	return map[string]uint64{"rx": 1000, "new_flow": 10, "no_backend": 3, "error": 1, "snat_full": 0, "fib_drop": 2}, nil
}

func (p countingPlane) DropReasons() []string {
	return []string{"no_backend", "snat_full", "fib_drop", "error"}
}

// newTestEngine returns an engine over a counting plane holding farms
// farm0..farmN-1 of backends b0..bM-1 each.
func newTestEngine(t testing.TB, farms, backends int) *engine.Engine {
	t.Helper()
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng, err := engine.New(context.Background(), discard(), countingPlane{fake.New()}, st)
	if err != nil {
		t.Fatal(err)
	}
	_, err = eng.Change(context.Background(), func(tx *engine.Txn) error {
		for i := range farms {
			f := xmodel.NewFarm(fmt.Sprintf("farm%d", i))
			f.VirtualAddr = netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})
			f.VirtualPorts = []xmodel.PortRange{{First: 80, Last: 80}}
			for j := range backends {
				b := xmodel.NewBackend(fmt.Sprintf("b%d", j))
				b.Addr = netip.AddrFrom4([4]byte{10, 200, byte(j), byte(i)})
				b.Port = 8080
				b.Weight = uint32(j + 1)
				f.Backends = append(f.Backends, b)
			}
			if err := tx.Put(f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func parse(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	return mfs
}

// value returns the sample of family name whose labels include want.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	mf := mfs[name]
	if mf == nil {
		t.Fatalf("no family %s", name)
	}
next:
	for _, m := range mf.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		}
		t.Fatalf("%s%v is neither counter nor gauge", name, want)
	}
	t.Fatalf("no sample %s%v", name, want)
	return 0
}

// The exposition holds each farm's and backend's numbers as the plane and
// the engine give them, and the engine's and the API's observations.
func TestExposition(t *testing.T) {
	eng := newTestEngine(t, 3, 2)
	m := New(Options{Engine: eng, Version: "test", Dataplane: "fake"})
	eng.SetObserver(m)
	m.ObserveSync(700 * time.Microsecond)
	m.ObserveCheck(xmodel.CheckHTTP, health.Result{OK: false, Took: time.Second})
	m.ObserveRequest("GET", "/farms/{name}", 200, time.Millisecond)
	m.ObserveRequest("PUT", "/farms/{name}", 400, time.Millisecond)
	// One more change, observed.
	if _, err := eng.Change(context.Background(), func(tx *engine.Txn) error {
		f, _ := tx.Get("farm2")
		nf := f.Clone()
		nf.Backends[1].Weight = 7
		return tx.Put(nf)
	}); err != nil {
		t.Fatal(err)
	}
	body, err := m.Expose(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	mfs := parse(t, body)
	for i := range 3 {
		farm := fmt.Sprintf("farm%d", i)
		var sum dataplane.Counters
		for j := range 2 {
			be := fmt.Sprintf("b%d", j)
			c := backendCounters(i, j)
			sum.Add(c)
			l := map[string]string{"farm": farm, "backend": be}
			for name, want := range map[string]uint64{
				"xlb_backend_connections_total": c.Connections, "xlb_backend_incoming_packets_total": c.InPackets,
				"xlb_backend_outgoing_packets_total": c.OutPackets, "xlb_backend_incoming_bytes_total": c.InBytes,
				"xlb_backend_outgoing_bytes_total": c.OutBytes,
				"xlb_backend_connections_active":   uint64(i + j), "xlb_backend_connections_inactive": uint64(j),
			} {
				if got := value(t, mfs, name, l); got != float64(want) {
					t.Errorf("%s%v = %v, want %d", name, l, got, want)
				}
			}
			w := uint64(j + 1)
			if i == 2 && j == 1 {
				w = 7
			}
			if got := value(t, mfs, "xlb_backend_weight", l); got != float64(w) {
				t.Errorf("weight %v = %v, want %d", l, got, w)
			}
			if got := value(t, mfs, "xlb_backend_health_state", map[string]string{"farm": farm, "backend": be, "state": "unchecked"}); got != 1 {
				t.Errorf("health of %v unchecked = %v, want 1", l, got)
			}
		}
		if got := value(t, mfs, "xlb_farm_incoming_bytes_total", map[string]string{"farm": farm}); got != float64(sum.InBytes) {
			t.Errorf("farm %s in bytes %v, want %d", farm, got, sum.InBytes)
		}
		if got := value(t, mfs, "xlb_farm_info", map[string]string{"farm": farm, "local_ports": "80", "proto": "tcp"}); got != 1 {
			t.Errorf("farm info %s = %v", farm, got)
		}
	}
	if got := value(t, mfs, "xlb_dropped_packets_total", map[string]string{"reason": "no_backend"}); got != 3 {
		t.Errorf("drops no_backend = %v, want 3", got)
	}
	if got := value(t, mfs, "xlb_conntrack_entries_limit", nil); got != 262144 {
		t.Errorf("conntrack limit = %v", got)
	}
	if got := value(t, mfs, "xlb_api_requests_total", map[string]string{"method": "PUT", "route": "/farms/{name}", "code": "400"}); got != 1 {
		t.Errorf("api requests = %v", got)
	}
	if h := mfs["xlb_engine_change_duration_seconds"].Metric[0].Histogram; h.GetSampleCount() != 1 {
		t.Errorf("engine changes observed %d, want 1 (the change after SetObserver)", h.GetSampleCount())
	}
	if h := mfs["xlb_check_duration_seconds"].Metric[0]; h.Histogram.GetSampleCount() != 1 || h.Histogram.GetSampleSum() != 1 ||
		len(h.Label) != 2 || h.Label[0].GetValue() != "fail" || h.Label[1].GetValue() != "http" {
		t.Errorf("check durations: %v", h)
	}
	if h := mfs["xlb_store_fsync_duration_seconds"].Metric[0].Histogram; h.GetSampleCount() != 1 {
		t.Errorf("fsyncs observed %d, want 1", h.GetSampleCount())
	}
}

// promtool check metrics finds nothing to complain about in a scrape.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("XLB_PRIVILEGED_TESTS") == "1" {
			t.Fatal("promtool is not installed (Debian package prometheus; scripts/install-deps.sh installs it)")
		}
		t.Skip("promtool is not installed")
	}
	eng := newTestEngine(t, 20, 3)
	m := New(Options{Engine: eng, Version: "test", Dataplane: "fake"})
	m.ObserveRequest("GET", "/farms", 200, time.Millisecond)
	body, err := m.Expose(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	if !strings.Contains(string(body), "xlb_backend_connections_total{") {
		t.Fatal("no backend counters in the exposition")
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
