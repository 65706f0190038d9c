package bgp

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Speaker is an embedded GoBGP server that announces host routes (/32,
// /128) of VIPs to the configured peers. It never listens for incoming
// sessions: it connects out to each peer.
type Speaker struct {
	log *slog.Logger
	cfg *Config
	srv *server.BgpServer

	mu        sync.Mutex
	announced map[netip.Addr]Attrs // what GoBGP holds now
	stopped   bool
}

var (
	familyV4 = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	familyV6 = &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
)

// NewSpeaker starts GoBGP with cfg's router id and AS and adds every peer.
// Sessions come up in the background; nothing is announced yet.
func NewSpeaker(ctx context.Context, log *slog.Logger, cfg *Config) (*Speaker, error) {
	srv := server.NewBgpServer(server.LoggerOption(&logAdapter{log: log}))
	go srv.Serve()
	s := &Speaker{log: log, cfg: cfg, srv: srv, announced: map[netip.Addr]Attrs{}}
	err := srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:        cfg.AS,
		RouterId:   cfg.RouterID.String(),
		ListenPort: -1, // connect out only: no listener on port 179
	}})
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("start BGP speaker (router-id %s, as %d): %w", cfg.RouterID, cfg.AS, err)
	}
	hold := uint64(cfg.HoldTime / time.Second)
	for _, p := range cfg.Peers {
		peer := &api.Peer{
			Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.AS, AuthPassword: p.Password},
			Timers: &api.Timers{Config: &api.TimersConfig{
				HoldTime: hold, KeepaliveInterval: max(hold/3, 1),
				// Reconnect within a second or two after a router
				// restarts (GoBGP's defaults are 120s and 30s).
				ConnectRetry: 1, IdleHoldTimeAfterReset: 1,
			}},
			Transport: &api.Transport{RemotePort: uint32(p.Port)},
			// IPv4 and IPv6 routes over every session, whatever its
			// family.
			AfiSafis: []*api.AfiSafi{
				{Config: &api.AfiSafiConfig{Family: familyV4, Enabled: true}},
				{Config: &api.AfiSafiConfig{Family: familyV6, Enabled: true}},
			},
		}
		if p.LocalAddress.IsValid() {
			peer.Transport.LocalAddress = p.LocalAddress.String()
		}
		if err := srv.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
			srv.Stop()
			return nil, fmt.Errorf("add BGP peer %s (as %d): %w", p.Address, p.AS, err)
		}
	}
	log.Info("BGP speaker started", "router_id", cfg.RouterID, "as", cfg.AS, "peers", len(cfg.Peers))
	return s, nil
}

// Set makes the announced routes exactly want: new VIPs are announced,
// changed attributes re-announced, missing ones withdrawn. It returns the
// first error after trying every route; routes that failed are tried again
// at the next Set.
func (s *Speaker) Set(ctx context.Context, want map[netip.Addr]Attrs) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("BGP speaker stopped")
	}
	var first error
	for vip, a := range s.announced {
		if _, ok := want[vip]; ok {
			continue
		}
		if err := s.srv.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL,
			Family: family(vip), Path: s.path(vip, a)}); err != nil {
			first = cmpErr(first, fmt.Errorf("withdraw %s: %w", vip, err))
			continue
		}
		delete(s.announced, vip)
		s.log.Info("route withdrawn", "vip", vip)
	}
	for vip, a := range want {
		if old, ok := s.announced[vip]; ok && sameAttrs(old, a) {
			continue
		}
		// Adding a path with the same prefix replaces the old one (an
		// implicit withdraw of the old attributes).
		if _, err := s.srv.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL,
			Path: s.path(vip, a)}); err != nil {
			first = cmpErr(first, fmt.Errorf("announce %s: %w", vip, err))
			continue
		}
		s.announced[vip] = a
		s.log.Info("route announced", "vip", vip, "communities", a.Communities, "med", ptrStr(a.MED), "local_pref", ptrStr(a.LocalPref))
	}
	return first
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func family(vip netip.Addr) *api.Family {
	if vip.Is4() {
		return familyV4
	}
	return familyV6
}

// path builds the GoBGP path of a VIP's host route.
func (s *Speaker) path(vip netip.Addr, a Attrs) *api.Path {
	nlri := mustAny(&api.IPAddressPrefix{Prefix: vip.String(), PrefixLen: uint32(vip.BitLen())})
	attrs := []*anypb.Any{mustAny(&api.OriginAttribute{Origin: 0})} // IGP
	if vip.Is4() {
		nh := "0.0.0.0" // GoBGP puts the session's local address
		if s.cfg.NextHop4.IsValid() {
			nh = s.cfg.NextHop4.String()
		}
		attrs = append(attrs, mustAny(&api.NextHopAttribute{NextHop: nh}))
	} else {
		nh := "::"
		if s.cfg.NextHop6.IsValid() {
			nh = s.cfg.NextHop6.String()
		}
		attrs = append(attrs, mustAny(&api.MpReachNLRIAttribute{Family: familyV6, NextHops: []string{nh}, Nlris: []*anypb.Any{nlri}}))
	}
	if len(a.Communities) > 0 {
		cs := make([]uint32, len(a.Communities))
		for i, c := range a.Communities {
			cs[i] = uint32(c)
		}
		attrs = append(attrs, mustAny(&api.CommunitiesAttribute{Communities: cs}))
	}
	if a.MED != nil {
		attrs = append(attrs, mustAny(&api.MultiExitDiscAttribute{Med: *a.MED}))
	}
	if a.LocalPref != nil {
		attrs = append(attrs, mustAny(&api.LocalPrefAttribute{LocalPref: *a.LocalPref}))
	}
	return &api.Path{Family: family(vip), Nlri: nlri, Pattrs: attrs}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err) // only for types of GoBGP's api package, which always marshal
	}
	return a
}

func sameAttrs(a, b Attrs) bool {
	eq := func(x, y *uint32) bool { return x == nil && y == nil || x != nil && y != nil && *x == *y }
	return slices.Equal(a.Communities, b.Communities) && eq(a.MED, b.MED) && eq(a.LocalPref, b.LocalPref)
}

func ptrStr(p *uint32) string {
	if p == nil {
		return ""
	}
	return fmt.Sprint(*p)
}

// Drain withdraws every route, waits the configured drain time (so the
// routers move flows away while this node still carries them), and stops
// the speaker, closing the sessions.
func (s *Speaker) Drain(ctx context.Context) {
	n := len(s.Routes())
	if err := s.Set(ctx, nil); err != nil {
		s.log.Warn("withdraw routes before stopping", "err", err)
	}
	if n > 0 && s.cfg.DrainWait > 0 {
		s.log.Info("routes withdrawn; draining before closing the BGP sessions", "routes", n, "wait", s.cfg.DrainWait)
		select {
		case <-time.After(s.cfg.DrainWait):
		case <-ctx.Done():
		}
	}
	s.Stop()
}

// Stop closes every session at once (the routers withdraw this node's
// routes) and stops GoBGP.
func (s *Speaker) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	s.srv.Stop()
	s.log.Info("BGP speaker stopped")
}

// Session is one peer's state as `xlb bgp` shows it.
type Session struct {
	Address  string `json:"address"`
	AS       uint32 `json:"as"`
	State    string `json:"state"` // idle, connect, active, opensent, openconfirm, established
	Uptime   string `json:"uptime,omitempty"`
	Received uint64 `json:"received-updates"`
	Sent     uint64 `json:"sent-updates"`
}

// Route is one announced route.
type Route struct {
	Prefix      string   `json:"prefix"`
	NextHop     string   `json:"next-hop"`
	Communities []string `json:"communities,omitempty"`
	MED         *uint32  `json:"med,omitempty"`
	LocalPref   *uint32  `json:"local-pref,omitempty"`
}

// Status is what GET /bgp answers.
type Status struct {
	RouterID string    `json:"router-id"`
	AS       uint32    `json:"as"`
	Ready    bool      `json:"ready"`             // allowed to announce (sync caught up)
	Waiting  string    `json:"waiting,omitempty"` // why not, if not
	Sessions []Session `json:"sessions"`
	Routes   []Route   `json:"routes"`
}

// Sessions lists the peers and their session states.
func (s *Speaker) Sessions(ctx context.Context) ([]Session, error) {
	var out []Session
	err := s.srv.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		ss := Session{Address: p.GetConf().GetNeighborAddress(), AS: p.GetConf().GetPeerAsn(), State: "idle"}
		if st := p.GetState(); st != nil {
			ss.State = sessionState(st.SessionState)
			if m := st.GetMessages(); m != nil {
				ss.Received = m.GetReceived().GetUpdate()
				ss.Sent = m.GetSent().GetUpdate()
			}
		}
		if up := p.GetTimers().GetState().GetUptime(); up != nil && ss.State == "established" {
			ss.Uptime = time.Since(up.AsTime()).Truncate(time.Second).String()
		}
		out = append(out, ss)
	})
	if err != nil {
		return nil, fmt.Errorf("list BGP peers: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out, nil
}

func sessionState(st api.PeerState_SessionState) string {
	switch st {
	case api.PeerState_IDLE:
		return "idle"
	case api.PeerState_CONNECT:
		return "connect"
	case api.PeerState_ACTIVE:
		return "active"
	case api.PeerState_OPENSENT:
		return "opensent"
	case api.PeerState_OPENCONFIRM:
		return "openconfirm"
	case api.PeerState_ESTABLISHED:
		return "established"
	}
	return "unknown"
}

// Routes lists the announced routes, by prefix.
func (s *Speaker) Routes() []Route {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Route, 0, len(s.announced))
	for vip, a := range s.announced {
		r := Route{Prefix: netip.PrefixFrom(vip, vip.BitLen()).String(), MED: a.MED, LocalPref: a.LocalPref, NextHop: "session address"}
		if vip.Is4() && s.cfg.NextHop4.IsValid() {
			r.NextHop = s.cfg.NextHop4.String()
		} else if vip.Is6() && s.cfg.NextHop6.IsValid() {
			r.NextHop = s.cfg.NextHop6.String()
		}
		for _, c := range a.Communities {
			r.Communities = append(r.Communities, c.String())
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Prefix < out[j].Prefix })
	return out
}

// logAdapter sends GoBGP's logs to slog.
type logAdapter struct{ log *slog.Logger }

func (l *logAdapter) attrs(f gobgplog.Fields) []any {
	out := make([]any, 0, 2*len(f))
	for k, v := range f {
		out = append(out, k, v)
	}
	return out
}

func (l *logAdapter) Panic(msg string, f gobgplog.Fields) {
	l.log.Error(msg, l.attrs(f)...)
	panic(msg)
}
func (l *logAdapter) Fatal(msg string, f gobgplog.Fields) { l.log.Error(msg, l.attrs(f)...) }
func (l *logAdapter) Error(msg string, f gobgplog.Fields) { l.log.Error(msg, l.attrs(f)...) }
func (l *logAdapter) Warn(msg string, f gobgplog.Fields)  { l.log.Warn(msg, l.attrs(f)...) }
func (l *logAdapter) Info(msg string, f gobgplog.Fields)  { l.log.Info(msg, l.attrs(f)...) }
func (l *logAdapter) Debug(msg string, f gobgplog.Fields) { l.log.Debug(msg, l.attrs(f)...) }
func (l *logAdapter) SetLevel(gobgplog.LogLevel)          {}
func (l *logAdapter) GetLevel() gobgplog.LogLevel {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		return gobgplog.DebugLevel
	}
	return gobgplog.InfoLevel
}
