package nft

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// DefaultShards is the number of tables the daemon spreads farms over.
const DefaultShards = 32

// MaxShards bounds Options.Shards: each shard's set IDs live in a range of
// their own (nextIDBase), 2^24 apart.
const MaxShards = 256

// Sharded is the nftables data plane spread over several tables, each a
// complete Plane (static sets, base chains, its farms), with a farm's table
// chosen by a hash of its name.
//
// Why: the kernel's cost of a commit grows with the size of the tables it
// touches, not with the change. It looks a table's sets up by name in a
// linear list, and it re-validates every chain reachable from a table's
// base chains whenever a commit adds a NAT rule or a goto (measured with
// perf on 6.18: adding one farm cost 15-21 ms next to 10,000 farms in the
// same table, 0.65-0.8 ms in another table of the same namespace). With
// farms over N tables a change pays for about 1/N of them.
//
// The price: a new connection that is not for a VIP passes the NAT base
// chains of every table (a few hash lookups each); a VIP's connection
// stops at its farm's table. Established connections do not see the NAT
// chains at all (conntrack). Apply is still one netlink batch over all
// tables, so a change is atomic; Reconcile sends one batch per table.
type Sharded struct {
	log  *slog.Logger
	opts Options

	mu     sync.Mutex
	conn   *nftables.Conn // shared by the shards: one batch spans tables
	shards []*Plane
	idBase uint32

	// tables holds named tables and policies (tables_plane.go).
	tables lazyTables
}

var _ dataplane.Dataplane = (*Sharded)(nil)

// Open returns the nftables data plane: one table, or opts.Shards tables.
func Open(ctx context.Context, log *slog.Logger, opts Options) (dataplane.Dataplane, error) {
	if opts.Shards <= 1 {
		return New(ctx, log, opts)
	}
	return NewSharded(ctx, log, opts)
}

// NewSharded makes sure the opts.Shards tables exist (see New) and returns
// the plane spread over them.
func NewSharded(ctx context.Context, log *slog.Logger, opts Options) (*Sharded, error) {
	if opts.Shards < 2 || opts.Shards > MaxShards {
		return nil, fmt.Errorf("nft shards %d: allowed 2-%d", opts.Shards, MaxShards)
	}
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.NetNS == 0 {
		opts.NetNS = netns.None()
	}
	s := &Sharded{log: log, opts: opts}
	c, err := dialNFT(opts.NetNS)
	if err != nil {
		return nil, err
	}
	s.conn = c
	for i := range opts.Shards {
		o := opts
		o.Table, o.Shards = ShardTable(opts.Table, i), 0
		p, err := newTablePlane(ctx, log, o, s)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.shards = append(s.shards, p)
	}
	return s, nil
}

// ShardTable names shard i's table: <prefix>-<two hex digits>.
func ShardTable(prefix string, i int) string { return fmt.Sprintf("%s-%02x", prefix, i) }

// shardOf returns the index of the table that holds farm name.
func (s *Sharded) shardOf(name string) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(len(s.shards)))
}

// nextIDBase gives each shard a range of set IDs of its own: IDs name new
// sets within one batch, and a batch spans all tables.
func (s *Sharded) nextIDBase() uint32 {
	s.idBase += 1 << 24
	return s.idBase
}

// Name implements dataplane.Dataplane.
func (s *Sharded) Name() string { return PlaneName }

// Check implements dataplane.Dataplane (the same rules for every table).
func (s *Sharded) Check(f *model.Farm) error { return s.shards[0].Check(f) }

// Apply implements dataplane.Dataplane: each changed farm's messages go to
// its table, all in one netlink batch, so the kernel applies all of it or
// none of it.
func (s *Sharded) Apply(ctx context.Context, d dataplane.Diff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	links, err := resolveDSR(s.opts.NetNS, diffFarms(expandDiff(d)))
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return errors.New("nft data plane is closed")
	}
	parts := make([]dataplane.Diff, len(s.shards))
	for _, c := range d.Changes {
		var name string
		switch {
		case c.New != nil:
			name = c.New.Name
		case c.Old != nil:
			name = c.Old.Name
		default:
			continue
		}
		i := s.shardOf(name)
		parts[i].Changes = append(parts[i].Changes, c)
	}
	nexts := make([]*pending, len(s.shards))
	for i, part := range parts {
		if len(part.Changes) == 0 {
			continue
		}
		p := s.shards[i]
		p.mu.Lock()
		b := p.newBatch()
		b.links = links
		nexts[i] = p.queue(b, part)
	}
	var buildErr error
	for _, next := range nexts {
		if next != nil && next.err != nil {
			buildErr = cmp.Or(buildErr, next.err)
		}
	}
	if buildErr == nil {
		err = s.conn.Flush()
	}
	for i, next := range nexts {
		if next == nil {
			continue
		}
		if err == nil && buildErr == nil {
			s.shards[i].commit(next)
		}
		s.shards[i].mu.Unlock()
	}
	if buildErr != nil {
		s.redial() // drops the queued messages
		return fmt.Errorf("apply %d farm changes: %w", len(d.Changes), buildErr)
	}
	if err != nil {
		s.redial()
		return fmt.Errorf("apply %d farm changes: %w", len(d.Changes), explain(err))
	}
	return nil
}

// Reconcile implements dataplane.Dataplane: each table is reconciled with
// its farms (see Plane.Reconcile), one batch per table.
func (s *Sharded) Reconcile(ctx context.Context, farms []*model.Farm) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return errors.New("nft data plane is closed")
	}
	parts := make([][]*model.Farm, len(s.shards))
	for _, f := range farms {
		i := s.shardOf(f.Name)
		parts[i] = append(parts[i], f)
	}
	keep := map[string]bool{}
	for i, p := range s.shards {
		if err := p.Reconcile(ctx, parts[i]); err != nil {
			return fmt.Errorf("table inet %s: %w", p.opts.Table, err)
		}
		keep[p.opts.Table] = true
	}
	dropped, err := dropOtherLayouts(s.conn, s.opts.Table, keep)
	if err != nil {
		s.redial()
		return err
	}
	if len(dropped) > 0 {
		s.log.Info("deleted the tables of another --nft-tables layout", "tables", dropped)
	}
	return nil
}

// Close releases the netlink connection; the tables stay in the kernel.
func (s *Sharded) Close() error {
	s.tables.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.shards {
		p.Close()
	}
	if s.conn == nil {
		return nil
	}
	err := s.conn.CloseLasting()
	s.conn = nil
	return err
}

// redial replaces the shared connection after an error (a failed batch can
// leave unread acks behind). The caller holds s.mu, so no shard is in use
// by anyone else; the shard that failed may hold its own lock.
func (s *Sharded) redial() {
	if s.conn != nil {
		_ = s.conn.CloseLasting()
		s.conn = nil
	}
	c, err := dialNFT(s.opts.NetNS)
	if err != nil {
		s.log.Error("nft reconnect failed", "err", err)
	}
	s.conn = c
	for _, p := range s.shards {
		p.conn = c
	}
}

var _ dataplane.SessionStore = (*Sharded)(nil)

// Sessions implements dataplane.SessionStore on the farm's table.
func (s *Sharded) Sessions(ctx context.Context, f *model.Farm) ([]dataplane.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil, errors.New("nft data plane is closed")
	}
	return s.shards[s.shardOf(f.Name)].Sessions(ctx, f)
}

// DeleteSessions implements dataplane.SessionStore on the farm's table.
func (s *Sharded) DeleteSessions(ctx context.Context, f *model.Farm, client, backend string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return 0, errors.New("nft data plane is closed")
	}
	return s.shards[s.shardOf(f.Name)].DeleteSessions(ctx, f, client, backend)
}
