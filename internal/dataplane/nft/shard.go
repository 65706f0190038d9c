package nft

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/nftables"
)

// shard is the nftables data plane. It owns one inet table (and its netdev
// twin of the same name, for mode dsr) and never touches any other. Its
// methods are safe for concurrent use, but the engine calls them from one
// goroutine.
// shard is one table of the plane (and its netdev twin of the same name,
// for mode dsr): what the kernel holds for the farms of that table. Its
// methods run with the plane's lock held; the netlink connection is the
// plane's.
type shard struct {
	log   *slog.Logger
	opts  Options
	table *nftables.Table
	// ntable is the netdev table of the same name: mode dsr (dsr.go).
	ntable *nftables.Table

	conn   *nftables.Conn
	static map[string]*nftables.Set
	farms  map[string]*farmState // what the kernel holds, by farm name
	gen    uint64                // generation of backend maps (unique names)
	setID  uint32

	// owner is the plane: its netlink connection is shared by every
	// shard (one batch spans tables) and it redials it.
	owner *Plane

	// hooks says which per-packet base chains the table has (see
	// hookState) and users how many farms need each; only Apply and
	// Reconcile change them.
	hooks hookState
	users hookUsers

	// groups counts the farms of each group chain (group.go); ghandles
	// caches, per group chain, its farms' rule handles as last listed,
	// until a change touches the chain.
	groups   groupCounts
	ghandles map[string]map[string][]uint64

	// hair counts the farms of the table that hold each hairpin element
	// (hairpin.go).
	hair map[string]int
}

// farmState is what Apply or Reconcile programmed for one farm.
type farmState struct {
	plan    *farmPlan // nil: the farm is known but not in the kernel (not up)
	mapName string    // "" when the chain only drops
}

// sets returns the names of the farm's sets and maps in the kernel.
func (s *farmState) sets() []string {
	if s == nil || s.plan == nil {
		return nil
	}
	out := s.plan.clients.names()
	if s.plan.l2 {
		out = append(out, s.plan.learnt)
	}
	if s.mapName == "" {
		return out
	}
	out = append(out, s.mapName)
	if s.plan.l2 {
		out = append(out, hwName(s.mapName))
	}
	if s.plan.ids {
		out = append(out, activeName(s.mapName))
	}
	if s.plan.persist != "" {
		out = append(out, s.plan.persist)
		if len(s.plan.static) > 0 {
			out = append(out, staticName(s.mapName))
		}
	}
	for _, l := range s.plan.limitList() {
		out = append(out, idsName(s.mapName, l), countName(s.plan.name, l))
	}
	return out
}

// newShard makes sure table opts.Table, its static sets and base chains
// exist (without touching farms: reconcile does that), over the plane's
// connection. It replaces the base chains' rules atomically, so traffic
// through existing farms keeps flowing.
func newShard(ctx context.Context, log *slog.Logger, opts Options, owner *Plane) (*shard, error) {
	p := &shard{
		log:      log,
		opts:     opts,
		table:    &nftables.Table{Name: opts.Table, Family: nftables.TableFamilyINet},
		ntable:   &nftables.Table{Name: opts.Table, Family: nftables.TableFamilyNetdev},
		farms:    map[string]*farmState{},
		ghandles: map[string]map[string][]uint64{},
		gen:      uint64(time.Now().UnixNano()),
		owner:    owner,
		conn:     owner.conn,
		setID:    owner.nextIDBase(),
	}
	p.static = map[string]*nftables.Set{}
	for _, s := range staticSets(p.table) {
		p.static[s.Name] = s
	}
	for _, s := range netdevSets(p.ntable) {
		p.static[s.Name] = s
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b := p.newBatch()
	b.ensureStatic()
	if err := b.flush(); err != nil {
		return nil, fmt.Errorf("create table inet %s: %w", opts.Table, err)
	}
	if err := p.programPostrouting(); err != nil {
		return nil, fmt.Errorf("program postrouting chain: %w", err)
	}
	if err := p.programDSR(); err != nil {
		return nil, fmt.Errorf("program dsr chain of table netdev %s: %w", opts.Table, err)
	}
	return p, nil
}

// redial replaces the plane's netlink connection after an error: a failed
// batch can leave unread acks on the socket that would confuse the next
// one.
func (p *shard) redial() { p.owner.redial() }
