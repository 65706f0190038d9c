package connsync

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// fakePlane is a data plane's connection table in memory.
type fakePlane struct {
	mu     sync.Mutex
	conns  map[netip.AddrPort]dataplane.SyncConn // by client
	kinds  map[netip.AddrPort]dataplane.ConnEventKind
	events chan []dataplane.ConnEvent
}

func newFakePlane(conns ...dataplane.SyncConn) *fakePlane {
	f := &fakePlane{conns: map[netip.AddrPort]dataplane.SyncConn{}, kinds: map[netip.AddrPort]dataplane.ConnEventKind{},
		events: make(chan []dataplane.ConnEvent, 16)}
	for _, c := range conns {
		f.conns[c.Client] = c
	}
	return f
}

func (f *fakePlane) WatchConns(ctx context.Context, fn func([]dataplane.ConnEvent)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case evs := <-f.events:
			fn(evs)
		}
	}
}

func (f *fakePlane) DumpConns(context.Context) ([]dataplane.SyncConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]dataplane.SyncConn, 0, len(f.conns))
	for _, c := range f.conns {
		out = append(out, c)
	}
	return out, nil
}

func (f *fakePlane) InstallConns(_ context.Context, evs []dataplane.ConnEvent) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range evs {
		if e.Kind == dataplane.ConnEnd {
			delete(f.conns, e.Conn.Client)
		} else {
			f.conns[e.Conn.Client] = e.Conn
			f.kinds[e.Conn.Client] = e.Kind
		}
	}
	return len(evs), nil
}

func (f *fakePlane) has(client netip.AddrPort) (dataplane.SyncConn, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.conns[client]
	return c, ok
}

func conn(i int, v6 bool) dataplane.SyncConn {
	ap := netip.MustParseAddrPort
	c := dataplane.SyncConn{Proto: 6, Client: netip.AddrPortFrom(netip.MustParseAddr("10.100.0.2"), uint16(40000+i)),
		VIP: ap("10.99.0.1:80"), Backend: ap("10.200.0.11:8080"), Reply: ap("10.200.0.2:40000"), Timeout: 300, TCPState: 3, Mark: 9}
	if v6 {
		c.Client = netip.AddrPortFrom(netip.MustParseAddr("fd00:100::2"), uint16(40000+i))
		c.VIP, c.Backend, c.Reply = ap("[fd00:99::1]:80"), ap("[fd00:200::11]:8080"), c.Client
	}
	return c
}

func freePort(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return netip.MustParseAddrPort(ln.Addr().String())
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func startNode(t *testing.T, cfg Config, dp dataplane.ConnSyncer) *Node {
	t.Helper()
	n, err := New(quiet, cfg, dp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var key = []byte("0123456789abcdef-cluster-key")

// TestSyncTwoNodes: a joining node is not ready until its peer's dump has
// arrived and installed; then events stream both ways.
func TestSyncTwoNodes(t *testing.T) {
	a, b := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.2")
	planeA := newFakePlane(conn(1, false), conn(2, true))
	planeB := newFakePlane()
	nodeA := startNode(t, Config{Name: "a", Listen: a, Peers: []netip.AddrPort{b}, Key: key, Wait: time.Minute}, planeA)
	if ok, why := nodeA.Ready(); ok || why == "" {
		t.Fatalf("a ready before any peer answered: %v %q", ok, why)
	}
	nodeB := startNode(t, Config{Name: "b", Listen: b, Peers: []netip.AddrPort{a}, Key: key, Wait: time.Minute}, planeB)
	waitFor(t, "b caught up with a", func() bool { ok, _ := nodeB.Ready(); return ok })
	for _, c := range []dataplane.SyncConn{conn(1, false), conn(2, true)} {
		got, ok := planeB.has(c.Client)
		if !ok || got != c {
			t.Fatalf("b holds %+v, %v; want %+v", got, ok, c)
		}
	}
	waitFor(t, "a caught up with b", func() bool { ok, _ := nodeA.Ready(); return ok })
	// Events from a reach b; an end removes.
	planeA.events <- []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: conn(3, false)}, {Kind: dataplane.ConnEnd, Conn: conn(1, false)}}
	waitFor(t, "events installed on b", func() bool {
		_, has3 := planeB.has(conn(3, false).Client)
		_, has1 := planeB.has(conn(1, false).Client)
		return has3 && !has1
	})
	planeB.events <- []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: conn(4, true)}}
	waitFor(t, "events installed on a", func() bool { _, ok := planeA.has(conn(4, true).Client); return ok })
	st := nodeB.Status()
	if !st.Ready || len(st.Peers) != 1 || !st.Peers[0].CaughtUp || st.Counters.Installed < 3 || st.Counters.Dumps != 1 {
		t.Fatalf("status %+v", st)
	}
}

// sessionPlane is a fakePlane with persistence sessions
// (dataplane.SessionSyncer).
type sessionPlane struct {
	*fakePlane
	sessions []dataplane.SyncConn
}

func (s *sessionPlane) DumpSessions(context.Context) ([]dataplane.SyncConn, error) {
	return s.sessions, nil
}

// TestSyncDumpSessions: a plane's persistence sessions go out in the
// dump a peer gets when it (re)connects, as session events, after its
// connections.
func TestSyncDumpSessions(t *testing.T) {
	a, b := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.2")
	ap := netip.MustParseAddrPort
	sess := dataplane.SyncConn{Proto: 6, Client: ap("10.100.0.9:0"), VIP: ap("10.99.0.1:80"), Backend: ap("10.200.0.12:8080"),
		Reply: ap("0.0.0.0:0"), Timeout: 250}
	planeA := &sessionPlane{fakePlane: newFakePlane(conn(1, false)), sessions: []dataplane.SyncConn{sess}}
	planeB := newFakePlane()
	startNode(t, Config{Name: "a", Listen: a, Peers: []netip.AddrPort{b}, Key: key, Wait: time.Minute}, planeA)
	nodeB := startNode(t, Config{Name: "b", Listen: b, Peers: []netip.AddrPort{a}, Key: key, Wait: time.Minute}, planeB)
	waitFor(t, "b caught up with a", func() bool { ok, _ := nodeB.Ready(); return ok })
	planeB.mu.Lock()
	defer planeB.mu.Unlock()
	if got, kind := planeB.conns[sess.Client], planeB.kinds[sess.Client]; got != sess || kind != dataplane.ConnSession {
		t.Errorf("b holds session %+v as kind %d; want %+v as a session (%d)", got, kind, sess, dataplane.ConnSession)
	}
	if kind := planeB.kinds[conn(1, false).Client]; kind != dataplane.ConnNew {
		t.Errorf("b holds the connection as kind %d, want new (%d)", kind, dataplane.ConnNew)
	}
}

// TestSyncPeerDown: a peer nobody answers for does not hold a node back.
func TestSyncPeerDown(t *testing.T) {
	a, dead := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.3")
	n := startNode(t, Config{Listen: a, Peers: []netip.AddrPort{dead}, Key: key, Wait: time.Minute}, newFakePlane())
	waitFor(t, "ready with its only peer down", func() bool { ok, _ := n.Ready(); return ok })
}

// TestSyncRefusals: an unconfigured peer, a wrong key, a replayed frame
// and a malformed batch are refused and counted; nothing is installed.
func TestSyncRefusals(t *testing.T) {
	a, b := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.2")
	plane := newFakePlane()
	n := startNode(t, Config{Listen: a, Peers: []netip.AddrPort{b}, Key: key, Wait: time.Minute}, plane)
	dialFrom := func(src string) (net.Conn, []byte) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		var c net.Conn
		var err error
		waitFor(t, "sync listener", func() bool { c, err = d.Dial("tcp", a.String()); return err == nil })
		t.Cleanup(func() { c.Close() })
		greet := make([]byte, len(magic)+nonceLen)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(c, greet); err != nil {
			return c, nil
		}
		return c, greet[len(magic):]
	}
	// Not a configured peer: closed at once.
	c, nonce := dialFrom("127.0.0.3")
	if nonce != nil {
		t.Fatal("an unconfigured peer got a greeting")
	}
	c.Close()
	waitFor(t, "refused unconfigured peer counted", func() bool { return n.Counters().RefusedPeer == 1 })

	// A forged frame (wrong key).
	c, nonce = dialFrom("127.0.0.2")
	fw := &frameWriter{w: bufio.NewWriter(c), key: []byte("not-the-cluster-key!"), nonce: nonce}
	fw.write(frameHello, []byte("mallory"))
	fw.write(frameConns, appendConns(nil, []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: conn(1, false)}}))
	fw.flush()
	waitFor(t, "bad MAC counted", func() bool { return n.Counters().RefusedMAC == 1 })

	// A frame replayed on a new connection (another nonce).
	c, nonce = dialFrom("127.0.0.2")
	var rec capture
	fw = &frameWriter{w: bufio.NewWriter(&rec), key: key, nonce: nonce}
	fw.write(frameHello, []byte("b"))
	fw.flush()
	c.Write(rec.b)
	c2, _ := dialFrom("127.0.0.2")
	c2.Write(rec.b)
	waitFor(t, "replayed frame counted", func() bool { return n.Counters().RefusedMAC == 2 })

	// A well-signed but malformed batch (kind 9), and a truncated one.
	for _, payload := range [][]byte{
		{0, 1, 9, 6, 4},
		appendConns(nil, []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: conn(1, false)}})[:20],
	} {
		c, nonce = dialFrom("127.0.0.2")
		fw = &frameWriter{w: bufio.NewWriter(c), key: key, nonce: nonce}
		fw.write(frameHello, []byte("b"))
		fw.write(frameConns, payload)
		fw.flush()
	}
	waitFor(t, "malformed frames counted", func() bool { return n.Counters().RefusedMalform == 2 })
	if cs, _ := plane.DumpConns(context.Background()); len(cs) != 0 {
		t.Fatalf("installed from refused frames: %+v", cs)
	}
}

type capture struct{ b []byte }

func (c *capture) Write(p []byte) (int, error) { c.b = append(c.b, p...); return len(p), nil }

func TestWireRoundTrip(t *testing.T) {
	evs := []dataplane.ConnEvent{{Kind: dataplane.ConnNew, Conn: conn(1, false)}, {Kind: dataplane.ConnEnd, Conn: conn(2, true)},
		{Kind: dataplane.ConnSession, Conn: conn(3, false)}}
	got, err := parseConns(nil, appendConns(nil, evs))
	if err != nil || !slices.Equal(got, evs) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
}

// BenchmarkWire is the cost per synchronised connection of encoding a
// batch of 256, MACing it, and checking and decoding it on the other side.
func BenchmarkWire(b *testing.B) {
	evs := make([]dataplane.ConnEvent, 256)
	for i := range evs {
		evs[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: conn(i, false)}
	}
	var rec capture
	nonce := make([]byte, nonceLen)
	fw := &frameWriter{w: bufio.NewWriterSize(&rec, 1<<20), key: key, nonce: nonce}
	b.ReportAllocs()
	buf := make([]byte, 0, 64<<10)
	var dec []dataplane.ConnEvent
	for b.Loop() {
		rec.b = rec.b[:0]
		fw.seq = 0
		fw.write(frameConns, appendConns(buf[:0], evs))
		fw.flush()
		fr := &frameReader{r: bufio.NewReader(&byteReader{b: rec.b}), key: key, nonce: nonce}
		_, p, err := fr.read()
		if err != nil {
			b.Fatal(err)
		}
		if dec, err = parseConns(dec, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/conn")
}

type byteReader struct{ b []byte }

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestSyncStalledPeer: a peer that greets and then never reads (hung, or
// hostile) never holds back the data plane's events: its queue fills, its
// batches are dropped and counted, and the node takes every batch the
// plane gives as fast as the plane gives them; within sendTimeout its
// stream counts as broken and is made again (a full resync).
func TestSyncStalledPeer(t *testing.T) {
	a, b := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.2")
	ln, err := net.Listen("tcp", b.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stalled := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// The greeting, then nothing: no reads, ever.
			c.Write(append([]byte(magic), make([]byte, nonceLen)...))
			stalled <- c
		}
	}()
	defer func() {
		for len(stalled) > 0 {
			(<-stalled).Close()
		}
	}()
	plane := newFakePlane()
	n := startNode(t, Config{Listen: a, Peers: []netip.AddrPort{b}, Key: key, Wait: time.Minute}, plane)
	waitFor(t, "the stream to the stalled peer connected", func() bool {
		st := n.Status()
		return len(st.Peers) == 1 && st.Peers[0].Sending == "connected"
	})
	// Far more than the socket buffers and the queue hold: 4,000 batches
	// of 256 connections (about 40 MB on the wire).
	batch := make([]dataplane.ConnEvent, 256)
	for i := range batch {
		batch[i] = dataplane.ConnEvent{Kind: dataplane.ConnNew, Conn: conn(i, false)}
	}
	deadline := time.After(20 * time.Second)
	for i := range 4000 {
		select {
		case plane.events <- batch:
		case <-deadline:
			t.Fatalf("the node took only %d of 4000 batches in 20s: a stalled peer holds back the data plane's events", i)
		}
	}
	waitFor(t, "dropped batches counted", func() bool { return n.Counters().Dropped > 0 })
	// The stream to it counts as broken within sendTimeout, and is made
	// again (with a full dump when the peer reads again).
	waitFor(t, "the stalled stream broken", func() bool { return n.Counters().SendErrors > 0 })
	t.Logf("counters: %+v", n.Counters())
}
