// Package sessionsync carries a data plane's persistence sessions in
// connection sync when the plane's connection syncer does not: on the nft
// plane the kernel's conntrack carries the flows, and the sessions are in
// nft's dynamic maps, which send no event when the data path adds or
// refreshes an element. Syncer polls the plane's sessions, sends the new,
// moved and refreshed ones as dataplane.ConnSession events, lists them for
// a dump, and installs a peer's into the plane (docs/ha.md).
//
// Only what the wire carries: farms with one virtual address whose
// persistence keys on the client's address and/or port.
package sessionsync

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// Syncer is a dataplane.ConnSyncer with the plane's persistence sessions
// added.
type Syncer struct {
	dataplane.ConnSyncer
	Store     dataplane.SessionStore
	Installer dataplane.SessionInstaller
	// Farms returns the node's farms now.
	Farms func() []*model.Farm
	// Every is the poll interval (default 1 s).
	Every time.Duration
}

var _ dataplane.SessionSyncer = (*Syncer)(nil)

// eligible reports whether f's sessions go on the wire.
func eligible(f *model.Farm) bool {
	return f.Persistence != 0 && f.Persistence&^(model.KeySrcIP|model.KeySrcPort) == 0 &&
		f.VirtualAddr.IsValid() && !f.VirtualAddr2.IsValid() && f.Protocol.Number() != 0
}

// toWire is session s of farm f as the wire carries it; false if it
// cannot (no backend, or a client key it does not parse).
func toWire(f *model.Farm, s dataplane.Session) (dataplane.SyncConn, bool) {
	k, err := model.ParseSessionClient(f.Persistence, s.Client)
	b, i := f.Backend(s.Backend)
	if err != nil || i < 0 || s.Expires <= 0 {
		return dataplane.SyncConn{}, false
	}
	client := k.SrcIP
	if !client.IsValid() {
		client = netip.IPv4Unspecified()
		if f.VirtualAddr.Is6() {
			client = netip.IPv6Unspecified()
		}
	}
	var vport uint16
	if len(f.VirtualPorts) > 0 {
		vport = f.VirtualPorts[0].First
	}
	reply := netip.IPv4Unspecified()
	if client.Is6() {
		reply = netip.IPv6Unspecified()
	}
	return dataplane.SyncConn{
		Proto:   f.Protocol.Number(),
		Client:  netip.AddrPortFrom(client, k.SrcPort),
		VIP:     netip.AddrPortFrom(f.VirtualAddr, vport),
		Backend: netip.AddrPortFrom(b.Addr, b.Port),
		Reply:   netip.AddrPortFrom(reply, 0),
		// Whole seconds down: a peer that sends it back does not make it
		// look younger than the original.
		Timeout: uint32(s.Expires / time.Second),
	}, true
}

// fromWire finds the farm and the session of a peer's c.
func fromWire(farms []*model.Farm, c dataplane.SyncConn) (*model.Farm, dataplane.Session, error) {
	for _, f := range farms {
		if !eligible(f) || f.VirtualAddr != c.VIP.Addr().Unmap() || f.Protocol.Number() != c.Proto || !hasPort(f, c.VIP.Port()) {
			continue
		}
		var name string
		for _, b := range f.Backends {
			if b.Addr == c.Backend.Addr().Unmap() && b.Port == c.Backend.Port() {
				name = b.Name
				break
			}
		}
		if name == "" {
			return nil, dataplane.Session{}, fmt.Errorf("session of %s to %s: farm %q has no such backend", c.Client, c.Backend, f.Name)
		}
		var parts []string
		if f.Persistence&model.KeySrcIP != 0 {
			parts = append(parts, c.Client.Addr().Unmap().String())
		}
		if f.Persistence&model.KeySrcPort != 0 {
			parts = append(parts, strconv.Itoa(int(c.Client.Port())))
		}
		return f, dataplane.Session{Client: strings.Join(parts, "-"), Backend: name,
			Expires: time.Duration(c.Timeout) * time.Second}, nil
	}
	return nil, dataplane.Session{}, fmt.Errorf("session of %s to %s: no farm here with persistence on %s", c.Client, c.Backend, c.VIP)
}

func hasPort(f *model.Farm, p uint16) bool {
	if len(f.VirtualPorts) == 0 || p == 0 {
		return true
	}
	for _, r := range f.VirtualPorts {
		if p >= r.First && p <= r.Last {
			return true
		}
	}
	return false
}

// sessions lists the live sessions of every eligible farm, by farm and
// client, with what the wire carries.
func (s *Syncer) sessions(ctx context.Context) (map[string]dataplane.SyncConn, error) {
	out := map[string]dataplane.SyncConn{}
	for _, f := range s.Farms() {
		if !eligible(f) {
			continue
		}
		ss, err := s.Store.Sessions(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, x := range ss {
			if x.Static {
				continue
			}
			if c, ok := toWire(f, x); ok {
				out[f.Name+" "+x.Client] = c
			}
		}
	}
	return out, nil
}

// DumpSessions implements dataplane.SessionSyncer.
func (s *Syncer) DumpSessions(ctx context.Context) ([]dataplane.SyncConn, error) {
	m, err := s.sessions(ctx)
	if err != nil {
		return nil, fmt.Errorf("list persistence sessions: %w", err)
	}
	out := make([]dataplane.SyncConn, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	return out, nil
}

// sent is what the peers last heard of a session.
type sent struct {
	backend netip.AddrPort
	expires time.Time
	left    time.Duration
}

// WatchConns implements dataplane.ConnSyncer: the plane's connection
// events, and every Every the sessions that are new, moved to another
// backend, or whose expiry moved by a third of the time they had when last
// sent (the client's new connections refresh them here; the peers' copies
// must not expire meanwhile). Sessions installed from peers come back as
// new once; the peer keeps its own (as much time left).
func (s *Syncer) WatchConns(ctx context.Context, fn func([]dataplane.ConnEvent)) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.poll(ctx, fn)
	}()
	err := s.ConnSyncer.WatchConns(ctx, fn)
	cancel()
	wg.Wait()
	return err
}

func (s *Syncer) poll(ctx context.Context, fn func([]dataplane.ConnEvent)) {
	every := s.Every
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	known := map[string]sent{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m, err := s.sessions(ctx)
		if err != nil {
			continue // the next poll, or a peer's dump, brings them
		}
		now := time.Now()
		var evs []dataplane.ConnEvent
		for k, c := range m {
			left := time.Duration(c.Timeout) * time.Second
			exp := now.Add(left)
			if old, ok := known[k]; ok && old.backend == c.Backend && exp.Sub(old.expires) < old.left/3 {
				continue
			}
			known[k] = sent{backend: c.Backend, expires: exp, left: left}
			evs = append(evs, dataplane.ConnEvent{Kind: dataplane.ConnSession, Conn: c})
		}
		for k := range known {
			if _, ok := m[k]; !ok {
				delete(known, k)
			}
		}
		for i := 0; i < len(evs); i += 256 {
			fn(evs[i:min(i+256, len(evs))])
		}
	}
}

// InstallConns implements dataplane.ConnSyncer: connections go to the
// plane's syncer, sessions into the farms' persistence maps.
func (s *Syncer) InstallConns(ctx context.Context, evs []dataplane.ConnEvent) (int, error) {
	var conns []dataplane.ConnEvent
	byFarm := map[*model.Farm][]dataplane.Session{}
	var farms []*model.Farm
	var errs []error
	for _, ev := range evs {
		if ev.Kind != dataplane.ConnSession {
			conns = append(conns, ev)
			continue
		}
		if farms == nil {
			farms = s.Farms()
		}
		f, x, err := fromWire(farms, ev.Conn)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		byFarm[f] = append(byFarm[f], x)
	}
	n := 0
	if len(conns) > 0 {
		k, err := s.ConnSyncer.InstallConns(ctx, conns)
		n += k
		errs = append(errs, err)
	}
	for f, ss := range byFarm {
		k, err := s.Installer.InstallSessions(ctx, f, ss)
		n += k
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}
