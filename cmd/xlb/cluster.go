package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/xlb-lb/xlb/internal/cluster/bgp"
	"github.com/xlb-lb/xlb/internal/cluster/connsync"
	"github.com/xlb-lb/xlb/internal/cluster/sessionsync"
	"github.com/xlb-lb/xlb/internal/conntrack"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// startBGP starts the BGP speaker and its announcer (--bgp-config). The
// returned function blocks until the announcer has drained (every route
// withdrawn, DrainWait waited, sessions closed) after ctx ends.
func startBGP(ctx context.Context, log *slog.Logger, cfg *bgp.Config, eng *engine.Engine, checks bgp.Checks, gate bgp.Gate) (*bgp.Announcer, func(), error) {
	log = log.With("component", "bgp")
	sp, err := bgp.NewSpeaker(ctx, log, cfg)
	if err != nil {
		return nil, nil, err
	}
	an := bgp.NewAnnouncer(log, cfg, sp, eng, eng.Events(), checks, gate)
	done := make(chan struct{})
	go func() { defer close(done); an.Run(ctx) }()
	return an, func() { <-done }, nil
}

// syncOptions are the daemon's --sync-* flags.
type syncOptions struct {
	listen  string
	peers   []string
	keyFile string
	wait    time.Duration
}

func (o syncOptions) enabled() bool { return o.listen != "" }

// config checks the --sync-* flags (before anything starts) and returns
// the sync configuration (zero Listen: no sync).
func (o syncOptions) config() (connsync.Config, error) {
	var c connsync.Config
	if !o.enabled() {
		if len(o.peers) > 0 || o.keyFile != "" {
			return c, fmt.Errorf("--sync-peers and --sync-key-file need --sync-listen")
		}
		return c, nil
	}
	var err error
	if c.Listen, err = netip.ParseAddrPort(o.listen); err != nil || c.Listen.Addr().IsUnspecified() {
		return c, fmt.Errorf("--sync-listen %q: must be this node's address:port on the peers' network (peers know the node by it)", o.listen)
	}
	if len(o.peers) == 0 {
		return c, fmt.Errorf("--sync-peers: at least one peer address:port is required with --sync-listen")
	}
	for _, p := range o.peers {
		ap, err := netip.ParseAddrPort(p)
		if err != nil {
			return c, fmt.Errorf("--sync-peers %q: must be address:port", p)
		}
		c.Peers = append(c.Peers, ap)
	}
	if o.keyFile == "" {
		return c, fmt.Errorf("--sync-key-file: required with --sync-listen (a secret of at least %d bytes shared by every node)", connsync.MinKeyLen)
	}
	key, err := os.ReadFile(o.keyFile)
	if err != nil {
		return c, fmt.Errorf("--sync-key-file: %w", err)
	}
	c.Key = bytes.TrimSpace(key)
	if len(c.Key) < connsync.MinKeyLen {
		return c, fmt.Errorf("--sync-key-file %q: %d bytes, at least %d required", o.keyFile, len(c.Key), connsync.MinKeyLen)
	}
	if o.wait <= 0 || o.wait > 10*time.Minute {
		return c, fmt.Errorf("--sync-wait %s: allowed values are 1ns to 10m", o.wait)
	}
	c.Wait = o.wait
	return c, nil
}

// syncerFor returns the data plane's connection syncer: the eBPF plane's
// own (its conntrack), or for the nft plane the kernel's conntrack.
func syncerFor(dp dataplane.Dataplane) (dataplane.ConnSyncer, error) {
	if s, ok := dp.(dataplane.ConnSyncer); ok {
		return s, nil
	}
	if dp.Name() == "nft" {
		// The nft plane's connections are the kernel's conntrack.
		if err := conntrack.Liberal(); err != nil {
			return nil, err
		}
		cs := &conntrack.Syncer{}
		// Its persistence sessions are nft's dynamic maps: polled.
		store, ok1 := dp.(dataplane.SessionStore)
		inst, ok2 := dp.(dataplane.SessionInstaller)
		if ok1 && ok2 {
			return &sessionsync.Syncer{ConnSyncer: cs, Store: store, Installer: inst}, nil
		}
		return cs, nil
	}
	return nil, fmt.Errorf("connection sync is not implemented for the %s data plane yet", dp.Name())
}

// startSync runs connection sync between the nodes; the syncer is told
// which destinations are VIPs from the engine's published states.
func startSync(ctx context.Context, log *slog.Logger, cfg connsync.Config, syncer dataplane.ConnSyncer, eng *engine.Engine) (*connsync.Node, error) {
	cs, _ := syncer.(*conntrack.Syncer)
	if ss, ok := syncer.(*sessionsync.Syncer); ok {
		ss.Farms = func() []*model.Farm { return eng.Snapshot().Farms() }
		cs, _ = ss.ConnSyncer.(*conntrack.Syncer)
	}
	if s := cs; s != nil {
		var vips atomic.Pointer[map[netip.Addr]struct{}]
		update := func(st *engine.State) {
			m := map[netip.Addr]struct{}{}
			for _, f := range st.Farms() {
				for _, v := range f.VirtualAddrs() {
					m[v.Unmap()] = struct{}{}
				}
			}
			vips.Store(&m)
		}
		update(eng.Snapshot())
		states := make(chan *engine.State, 1)
		eng.Subscribe(states)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case st := <-states:
					update(st)
				}
			}
		}()
		s.IsVIP = func(a netip.Addr) bool { _, ok := (*vips.Load())[a]; return ok }
	}
	n, err := connsync.New(log.With("component", "sync"), cfg, syncer)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := n.Run(ctx); err != nil {
			log.Error("connection sync stopped", "err", err)
		}
	}()
	return n, nil
}
