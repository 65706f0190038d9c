package sessionsync

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// fakeStore is a plane's sessions in memory (the nft plane's are tested
// end to end: test/e2e TestSyncPersistence).
type fakeStore struct {
	mu        sync.Mutex
	sessions  map[string][]dataplane.Session // by farm
	installed map[string][]dataplane.Session
}

func (f *fakeStore) Sessions(_ context.Context, fm *model.Farm) ([]dataplane.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]dataplane.Session(nil), f.sessions[fm.Name]...), nil
}

func (f *fakeStore) DeleteSessions(context.Context, *model.Farm, string, string) (int, error) {
	return 0, nil
}

func (f *fakeStore) InstallSessions(_ context.Context, fm *model.Farm, ss []dataplane.Session) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.installed[fm.Name] = append(f.installed[fm.Name], ss...)
	return len(ss), nil
}

func (f *fakeStore) set(farm string, ss ...dataplane.Session) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessions[farm] = ss
}

// noConns is a ConnSyncer without connections.
type noConns struct{}

func (noConns) WatchConns(ctx context.Context, _ func([]dataplane.ConnEvent)) error {
	<-ctx.Done()
	return nil
}
func (noConns) DumpConns(context.Context) ([]dataplane.SyncConn, error) { return nil, nil }
func (noConns) InstallConns(_ context.Context, evs []dataplane.ConnEvent) (int, error) {
	return len(evs), nil
}

func testFarms(t *testing.T) []*model.Farm {
	web := &model.Farm{Name: "web", VirtualAddr: netip.MustParseAddr("10.99.0.1"), VirtualPorts: []model.PortRange{{First: 80, Last: 80}},
		Protocol: model.ProtoTCP, Persistence: model.KeySrcIP, PersistTTL: 300,
		Backends: []model.Backend{{Name: "b1", Addr: netip.MustParseAddr("10.200.0.11"), Port: 8080}, {Name: "b2", Addr: netip.MustParseAddr("10.200.0.12"), Port: 8080}}}
	mac := &model.Farm{Name: "mac", VirtualAddr: netip.MustParseAddr("10.99.0.2"), Protocol: model.ProtoTCP, Persistence: model.KeySrcMAC, PersistTTL: 300,
		Backends: []model.Backend{{Name: "b1", Addr: netip.MustParseAddr("10.200.0.11"), Port: 8080}}}
	return []*model.Farm{web, mac}
}

// TestPollAndInstall: the poll sends a session when it is new, when it
// moves to another backend and when its expiry moves by a third of its
// time, not otherwise; a farm whose persistence the wire cannot carry
// (srcmac) sends none; a peer's session goes into the farm it names by
// VIP and backend address, in the farm's client form; one for no farm here
// is refused, named.
func TestPollAndInstall(t *testing.T) {
	farms := testFarms(t)
	st := &fakeStore{sessions: map[string][]dataplane.Session{}, installed: map[string][]dataplane.Session{}}
	s := &Syncer{ConnSyncer: noConns{}, Store: st, Installer: st, Farms: func() []*model.Farm { return farms }, Every: 20 * time.Millisecond}
	st.set("web", dataplane.Session{Client: "10.100.0.2", Backend: "b2", Expires: 300 * time.Second},
		dataplane.Session{Client: "10.100.0.3", Backend: "b1", Static: true})
	st.set("mac", dataplane.Session{Client: "02:00:00:00:00:01", Backend: "b1", Expires: 300 * time.Second})

	var mu sync.Mutex
	var got []dataplane.ConnEvent
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.WatchConns(ctx, func(evs []dataplane.ConnEvent) { mu.Lock(); got = append(got, evs...); mu.Unlock() })
	}()
	events := func(n int) []dataplane.ConnEvent {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			out := append([]dataplane.ConnEvent(nil), got...)
			mu.Unlock()
			if len(out) >= n || time.Now().After(deadline) {
				time.Sleep(100 * time.Millisecond) // a few polls more: nothing else comes
				mu.Lock()
				out = append([]dataplane.ConnEvent(nil), got...)
				mu.Unlock()
				return out
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	want := dataplane.SyncConn{Proto: 6, Client: netip.MustParseAddrPort("10.100.0.2:0"), VIP: netip.MustParseAddrPort("10.99.0.1:80"),
		Backend: netip.MustParseAddrPort("10.200.0.12:8080"), Reply: netip.MustParseAddrPort("0.0.0.0:0"), Timeout: 300}
	if evs := events(1); len(evs) != 1 || evs[0].Kind != dataplane.ConnSession || evs[0].Conn != want {
		t.Fatalf("first polls sent %+v, want the one session %+v", evs, want)
	}
	// Its expiry moved by less than a third of its time: nothing.
	st.set("web", dataplane.Session{Client: "10.100.0.2", Backend: "b2", Expires: 350 * time.Second})
	time.Sleep(200 * time.Millisecond)
	if evs := events(1); len(evs) != 1 {
		t.Fatalf("after a small refresh: %d events, want still 1", len(evs))
	}
	// Moved: sent.
	st.set("web", dataplane.Session{Client: "10.100.0.2", Backend: "b1", Expires: 300 * time.Second})
	if evs := events(2); len(evs) != 2 || evs[1].Conn.Backend != netip.MustParseAddrPort("10.200.0.11:8080") {
		t.Fatalf("after a move to b1: %+v", evs)
	}
	// Its expiry moved by more than a third: sent.
	st.set("web", dataplane.Session{Client: "10.100.0.2", Backend: "b1", Expires: 401 * time.Second})
	if evs := events(3); len(evs) != 3 || evs[2].Conn.Timeout != 401 {
		t.Fatalf("after a refresh by a third: %+v", evs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d, err := s.DumpSessions(context.Background()); err != nil || len(d) != 1 {
		t.Errorf("dump: %+v, %v; want the one session", d, err)
	}

	// A peer's.
	in := want
	in.Client = netip.MustParseAddrPort("10.100.0.9:0")
	in.Timeout = 120
	bad := in
	bad.VIP = netip.MustParseAddrPort("10.99.0.7:80")
	n, err := s.InstallConns(context.Background(), []dataplane.ConnEvent{{Kind: dataplane.ConnSession, Conn: in}, {Kind: dataplane.ConnSession, Conn: bad},
		{Kind: dataplane.ConnNew, Conn: in}})
	if n != 2 || err == nil || !strings.Contains(err.Error(), "no farm here with persistence on 10.99.0.7:80") {
		t.Errorf("install: %d, %v; want 2 (a session and a connection) and the other session refused", n, err)
	}
	wantIn := []dataplane.Session{{Client: "10.100.0.9", Backend: "b2", Expires: 120 * time.Second}}
	if got := st.installed["web"]; len(got) != 1 || got[0] != wantIn[0] {
		t.Errorf("installed %+v, want %+v", got, wantIn)
	}
}
