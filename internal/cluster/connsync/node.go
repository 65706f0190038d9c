// Package connsync streams the connection state of the modes that keep
// state (snat, dnat) between the nodes of a cluster, so that a node can
// carry a flow it has never seen when the routers move it there (a node
// lost or added under ECMP).
//
// Each node sends its data plane's new, updated and ended connections
// (dataplane.ConnSyncer) in batches to every peer over TCP, each frame
// authenticated with HMAC-SHA256 under a key the nodes share (wire.go),
// and installs what its peers send. A sender that (re)connects sends its
// whole state first: a node that (re)joins is caught up with a peer once
// that peer's dump has arrived, and the BGP announcer waits for that
// (Ready) before it announces. Connections from addresses that are not
// configured peers, frames that fail their MAC and malformed frames are
// refused and counted. Sync never holds up local traffic: a peer that
// falls behind loses its queue and is sent a full resync on reconnect.
package connsync

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// Config of a node.
type Config struct {
	Name   string         // this node's name in logs and the peers' status (default: Listen)
	Listen netip.AddrPort // where peers connect to
	Peers  []netip.AddrPort
	Key    []byte // shared by every node; at least 16 bytes
	// Wait bounds how long announcements wait for peers' dumps (default
	// 10s): a peer that never sends one does not keep a node out forever.
	Wait time.Duration
}

// MinKeyLen is the shortest key accepted.
const MinKeyLen = 16

// Counters of a node, as GET /sync shows them.
type Counters struct {
	FramesSent      uint64 `json:"frames-sent"`
	FramesReceived  uint64 `json:"frames-received"`
	ConnsSent       uint64 `json:"conns-sent"`
	ConnsReceived   uint64 `json:"conns-received"`
	Installed       uint64 `json:"installed"`
	InstallErrors   uint64 `json:"install-errors"`
	Dumps           uint64 `json:"dumps-sent"`
	Dropped         uint64 `json:"events-dropped"` // queue full: that peer gets a full resync
	RefusedPeer     uint64 `json:"refused-unconfigured-peer"`
	RefusedMAC      uint64 `json:"refused-bad-mac"`
	RefusedMalform  uint64 `json:"refused-malformed"`
	WatchErrors     uint64 `json:"watch-errors"`
	SendErrors      uint64 `json:"send-errors"`
	ReceiveSessions uint64 `json:"receive-sessions"`
}

type counters struct {
	framesSent, framesRecv, connsSent, connsRecv, installed, installErr, dumps, dropped,
	refusedPeer, refusedMAC, refusedMalformed, watchErr, sendErr, recvSessions atomic.Uint64
}

// PeerStatus is one peer as seen from here.
type PeerStatus struct {
	Address string `json:"address"`
	Sending string `json:"sending"` // connected, connecting, down
	// CaughtUp: its whole state has arrived here since this node started.
	CaughtUp bool   `json:"caught-up"`
	LastErr  string `json:"last-error,omitempty"`
}

// Status is what GET /sync answers.
type Status struct {
	Name     string       `json:"name"`
	Listen   string       `json:"listen"`
	Ready    bool         `json:"ready"`
	Waiting  string       `json:"waiting,omitempty"`
	Peers    []PeerStatus `json:"peers"`
	Counters Counters     `json:"counters"`
}

// Node is one node's sync: a receiver for its peers and a sender to each.
type Node struct {
	log *slog.Logger
	cfg Config
	dp  dataplane.ConnSyncer
	c   counters

	mu       sync.Mutex
	peers    map[netip.Addr]*peer
	changed  chan struct{}
	start    time.Time
	waitOver bool
}

type peer struct {
	addr     netip.AddrPort
	queue    chan *payload
	resync   atomic.Bool // the queue overflowed: reconnect and dump
	sending  string
	caughtUp bool
	down     bool // our dial failed: it has no state to wait for
	lastErr  string
}

// payload is a batch of events encoded once for every peer (a frame's
// payload, appendConns), handed to each peer's sender and back to
// payloads by the last one done with it: the watcher keeps no batch (the
// data plane reuses its own) and makes no garbage per batch.
type payload struct {
	b    []byte
	n    int // events in b
	refs atomic.Int32
}

var payloads = sync.Pool{New: func() any { return &payload{b: make([]byte, 0, 2+256*connSize(true))} }}

// release gives up one peer's hold on pl.
func (pl *payload) release() {
	if pl.refs.Add(-1) == 0 {
		payloads.Put(pl)
	}
}

// queueBatches bounds what a slow peer may fall behind by (batches of up
// to 256 connections).
const queueBatches = 1024

// sendTimeout is how long a peer may take no data (a write that does not
// complete, or data the peer's kernel does not acknowledge) before its
// stream counts as broken: it is made again, with a full dump. Without
// it a peer gone silent (a partition, a node lost without a reset) would
// show as connected for the kernel's retransmission time (~15 minutes).
const sendTimeout = 5 * time.Second

// New checks cfg and returns a node; Run starts it.
func New(log *slog.Logger, cfg Config, dp dataplane.ConnSyncer) (*Node, error) {
	if len(cfg.Key) < MinKeyLen {
		return nil, fmt.Errorf("sync key: %d bytes, at least %d required", len(cfg.Key), MinKeyLen)
	}
	if !cfg.Listen.IsValid() {
		return nil, errors.New("sync listen address: required (address:port)")
	}
	if len(cfg.Peers) == 0 {
		return nil, errors.New("sync peers: at least one peer is required")
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Listen.String()
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 10 * time.Second
	}
	n := &Node{log: log, cfg: cfg, dp: dp, peers: map[netip.Addr]*peer{}, changed: make(chan struct{}, 1)}
	for _, p := range cfg.Peers {
		a := p.Addr().Unmap()
		if _, dup := n.peers[a]; dup {
			return nil, fmt.Errorf("sync peers: %s listed twice", a)
		}
		if a == cfg.Listen.Addr().Unmap() {
			return nil, fmt.Errorf("sync peers: %s is this node's own listen address", p)
		}
		n.peers[a] = &peer{addr: p, queue: make(chan *payload, queueBatches), sending: "connecting"}
	}
	return n, nil
}

// Run listens for peers, sends to each, and watches the data plane, until
// ctx ends. It returns an error only if it cannot listen.
func (n *Node) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", n.cfg.Listen.String())
	if err != nil {
		return fmt.Errorf("sync: listen on %s: %w", n.cfg.Listen, err)
	}
	n.mu.Lock()
	n.start = time.Now()
	n.mu.Unlock()
	n.log.Info("connection sync started", "listen", n.cfg.Listen, "peers", len(n.peers))
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); ln.Close(); wg.Wait() }()
	wg.Add(3 + len(n.peers))
	go func() { defer wg.Done(); n.accept(ctx, ln) }()
	go func() { defer wg.Done(); <-ctx.Done(); ln.Close() }()
	go func() { defer wg.Done(); n.watch(ctx) }()
	for _, p := range n.peers {
		go func() { defer wg.Done(); n.send(ctx, p) }()
	}
	// The wait for peers' dumps is bounded.
	select {
	case <-ctx.Done():
	case <-time.After(n.cfg.Wait):
		n.mu.Lock()
		n.waitOver = true
		n.mu.Unlock()
		n.signal()
		<-ctx.Done()
	}
	return nil
}

func (n *Node) signal() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// Changed is signalled when Ready may have changed (bgp.Gate).
func (n *Node) Changed() <-chan struct{} { return n.changed }

// Ready reports whether this node has caught up: every peer's dump has
// arrived, or the peer is down (our connection to it failed), or the wait
// is over (bgp.Gate).
func (n *Node) Ready() (bool, string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.waitOver {
		return true, ""
	}
	var waiting []string
	for _, p := range n.peers {
		if !p.caughtUp && !p.down {
			waiting = append(waiting, p.addr.Addr().String())
		}
	}
	if len(waiting) == 0 {
		return true, ""
	}
	slices.Sort(waiting)
	return false, fmt.Sprintf("connection sync: waiting for the state of %v", waiting)
}

// Status returns the node's peers and counters.
func (n *Node) Status() Status {
	ok, why := n.Ready()
	st := Status{Name: n.cfg.Name, Listen: n.cfg.Listen.String(), Ready: ok, Waiting: why, Counters: n.Counters()}
	n.mu.Lock()
	for _, p := range n.peers {
		st.Peers = append(st.Peers, PeerStatus{Address: p.addr.String(), Sending: p.sending, CaughtUp: p.caughtUp, LastErr: p.lastErr})
	}
	n.mu.Unlock()
	slices.SortFunc(st.Peers, func(a, b PeerStatus) int { return strings.Compare(a.Address, b.Address) })
	return st
}

// Counters returns a copy of the counters.
func (n *Node) Counters() Counters {
	c := &n.c
	return Counters{
		FramesSent: c.framesSent.Load(), FramesReceived: c.framesRecv.Load(),
		ConnsSent: c.connsSent.Load(), ConnsReceived: c.connsRecv.Load(),
		Installed: c.installed.Load(), InstallErrors: c.installErr.Load(),
		Dumps: c.dumps.Load(), Dropped: c.dropped.Load(),
		RefusedPeer: c.refusedPeer.Load(), RefusedMAC: c.refusedMAC.Load(), RefusedMalform: c.refusedMalformed.Load(),
		WatchErrors: c.watchErr.Load(), SendErrors: c.sendErr.Load(), ReceiveSessions: c.recvSessions.Load(),
	}
}

// watch feeds the data plane's events to every peer's queue, each batch's
// records of a connection folded into one (coalesce.go) and encoded once
// for all; a full queue drops the batch for that peer and marks it for a
// full resync.
func (n *Node) watch(ctx context.Context) {
	var (
		mu sync.Mutex // fn may be called from two goroutines (sessionsync's poll)
		co coalescer
	)
	for ctx.Err() == nil {
		err := n.dp.WatchConns(ctx, func(evs []dataplane.ConnEvent) {
			mu.Lock()
			defer mu.Unlock()
			evs = co.fold(evs)
			pl := payloads.Get().(*payload)
			pl.b, pl.n = appendConns(pl.b[:0], evs), len(evs)
			pl.refs.Store(int32(len(n.peers)))
			for _, p := range n.peers {
				select {
				case p.queue <- pl:
				default:
					pl.release()
					n.c.dropped.Add(uint64(len(evs)))
					if !p.resync.Swap(true) {
						n.log.Warn("sync queue of a peer full: it gets a full resync", "peer", p.addr)
					}
				}
			}
		})
		if err != nil && ctx.Err() == nil {
			// Events lost meanwhile reach the peers with their next
			// full resync.
			n.c.watchErr.Add(1)
			n.log.Warn("connection events", "err", err)
			for _, p := range n.peers {
				p.resync.Store(true)
			}
			sleep(ctx, time.Second)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// send keeps a connection to p and sends it a dump, then events.
func (n *Node) send(ctx context.Context, p *peer) {
	// From the listen address: the peer knows this node by it.
	d := net.Dialer{Timeout: 2 * time.Second, KeepAlive: 5 * time.Second}
	if a := n.cfg.Listen.Addr(); !a.IsUnspecified() {
		d.LocalAddr = &net.TCPAddr{IP: a.AsSlice()}
	}
	// Unacknowledged data older than sendTimeout breaks the connection
	// (TCP_USER_TIMEOUT): a keepalive frame a second is always in flight.
	d.Control = func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(sendTimeout/time.Millisecond))
		})
		if err != nil {
			return err
		}
		return serr
	}
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", p.addr.String())
		if err != nil {
			n.setSending(p, "down", err, true)
			sleep(ctx, time.Second)
			continue
		}
		err = n.session(ctx, p, c)
		c.Close()
		if ctx.Err() != nil {
			return
		}
		n.c.sendErr.Add(1)
		n.setSending(p, "connecting", err, false)
		n.log.Warn("sync to a peer interrupted", "peer", p.addr, "err", err)
		sleep(ctx, 200*time.Millisecond)
	}
}

func (n *Node) setSending(p *peer, state string, err error, down bool) {
	n.mu.Lock()
	changed := p.down != down
	p.sending, p.down = state, down
	if err != nil {
		p.lastErr = err.Error()
	}
	n.mu.Unlock()
	if changed {
		n.signal()
	}
}

// session runs one connection to a peer: greeting, hello, dump, events.
func (n *Node) session(ctx context.Context, p *peer, c net.Conn) error {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	r := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	greet := make([]byte, len(magic)+nonceLen)
	if _, err := io.ReadFull(r, greet); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if string(greet[:len(magic)]) != magic {
		return fmt.Errorf("greeting: not an xlb sync peer")
	}
	c.SetReadDeadline(time.Time{})
	// Every write that goes to the socket must complete within
	// sendTimeout: a peer that stops reading is a broken stream.
	fw := &frameWriter{w: bufio.NewWriterSize(deadlineWriter{c}, 64<<10), key: n.cfg.Key, nonce: greet[len(magic):]}
	if err := fw.write(frameHello, []byte(n.cfg.Name)); err != nil {
		return err
	}
	// Events queued before this point are in the dump that follows.
	for len(p.queue) > 0 {
		(<-p.queue).release()
	}
	p.resync.Store(false)
	n.setSending(p, "connected", nil, false)
	conns, err := n.dp.DumpConns(ctx)
	if err != nil {
		return fmt.Errorf("dump connections: %w", err)
	}
	nconns := len(conns)
	if ss, ok := n.dp.(dataplane.SessionSyncer); ok {
		sessions, err := ss.DumpSessions(ctx)
		if err != nil {
			return fmt.Errorf("dump persistence sessions: %w", err)
		}
		conns = append(conns, sessions...)
	}
	if err := fw.write(frameDumpBegin, nil); err != nil {
		return err
	}
	buf := make([]byte, 0, 2+256*connSize(true))
	evs := make([]dataplane.ConnEvent, 0, 256)
	for i := 0; i < len(conns); i += 256 {
		evs = evs[:0]
		for j, cn := range conns[i:min(i+256, len(conns))] {
			kind := dataplane.ConnNew
			if i+j >= nconns {
				kind = dataplane.ConnSession
			}
			evs = append(evs, dataplane.ConnEvent{Kind: kind, Conn: cn})
		}
		if err := fw.write(frameConns, appendConns(buf[:0], evs)); err != nil {
			return err
		}
		n.c.framesSent.Add(1)
		n.c.connsSent.Add(uint64(len(evs)))
	}
	if err := fw.write(frameDumpEnd, nil); err != nil {
		return err
	}
	if err := fw.flush(); err != nil {
		return err
	}
	n.c.dumps.Add(1)
	keep := time.NewTicker(time.Second)
	defer keep.Stop()
	for {
		if p.resync.Load() {
			return errors.New("events dropped: full resync")
		}
		select {
		case <-ctx.Done():
			return nil
		case pl := <-p.queue:
			if err := n.sendPayload(fw, pl); err != nil {
				return err
			}
			// Batch the frames already queued into one write.
			for more := true; more; {
				select {
				case pl := <-p.queue:
					if err := n.sendPayload(fw, pl); err != nil {
						return err
					}
				default:
					more = false
				}
			}
			if err := fw.flush(); err != nil {
				return err
			}
		case <-keep.C:
			if err := fw.write(frameKeepalive, nil); err != nil {
				return err
			}
			if err := fw.flush(); err != nil {
				return err
			}
		}
	}
}

// sendPayload writes a queued batch as a frame and lets it go.
func (n *Node) sendPayload(fw *frameWriter, pl *payload) error {
	defer pl.release()
	if err := fw.write(frameConns, pl.b); err != nil {
		return err
	}
	n.c.framesSent.Add(1)
	n.c.connsSent.Add(uint64(pl.n))
	return nil
}

// deadlineWriter sets a write deadline of sendTimeout before each write.
type deadlineWriter struct{ c net.Conn }

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.c.SetWriteDeadline(time.Now().Add(sendTimeout))
	return w.c.Write(p)
}

// accept takes peers' connections.
func (n *Node) accept(ctx context.Context, ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		ra, _ := netip.ParseAddrPort(c.RemoteAddr().String())
		n.mu.Lock()
		p, ok := n.peers[ra.Addr().Unmap()]
		n.mu.Unlock()
		if !ok {
			n.c.refusedPeer.Add(1)
			n.log.Warn("sync connection refused: not a configured peer", "from", ra)
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			err := n.receive(ctx, p, c)
			switch {
			case errors.Is(err, errBadMAC):
				n.c.refusedMAC.Add(1)
			case errors.Is(err, errMalformed):
				n.c.refusedMalformed.Add(1)
			}
			if err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
				n.log.Warn("sync from a peer refused or interrupted", "peer", ra, "err", err)
			}
		}()
	}
}

// receive reads one peer's frames and installs what they carry.
func (n *Node) receive(ctx context.Context, p *peer, c net.Conn) error {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	n.c.recvSessions.Add(1)
	nonce := make([]byte, nonceLen)
	rand.Read(nonce)
	if _, err := c.Write(append([]byte(magic), nonce...)); err != nil {
		return err
	}
	fr := &frameReader{r: bufio.NewReaderSize(c, 64<<10), key: n.cfg.Key, nonce: nonce}
	first := true
	var evs []dataplane.ConnEvent // each batch's, reused: InstallConns keeps none
	for {
		// A peer sends a keepalive every second.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		typ, payload, err := fr.read()
		if err != nil {
			return err
		}
		if first && typ != frameHello {
			return fmt.Errorf("%w: frame %d before hello", errMalformed, typ)
		}
		first = false
		n.c.framesRecv.Add(1)
		switch typ {
		case frameHello, frameKeepalive, frameDumpBegin:
		case frameConns:
			evs, err = parseConns(evs, payload)
			if err != nil {
				return err
			}
			n.c.connsRecv.Add(uint64(len(evs)))
			k, err := n.dp.InstallConns(ctx, evs)
			n.c.installed.Add(uint64(k))
			if err != nil {
				// One bad entry does not stop the rest of the stream.
				n.c.installErr.Add(uint64(len(evs) - k))
				n.log.Debug("install synchronised connections", "peer", p.addr, "err", err)
			}
		case frameDumpEnd:
			n.mu.Lock()
			was := p.caughtUp
			p.caughtUp = true
			n.mu.Unlock()
			if !was {
				n.log.Info("caught up with a peer's connection state", "peer", p.addr)
				n.signal()
			}
		default:
			return fmt.Errorf("%w: unknown frame type %d", errMalformed, typ)
		}
	}
}
