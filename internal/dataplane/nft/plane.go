package nft

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/conntrack"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// PlaneName is the name users select this data plane by.
const PlaneName = "nft"

// DefaultTable is the name of xlb's table (family inet).
const DefaultTable = "xlb"

// sockBuf is the send and receive buffer of the netlink socket. A batch is
// one sendmsg, and the kernel queues one ack per message before we read
// any, so both must hold a whole batch (nft sizes its buffers the same way).
const sockBuf = 64 << 20

// Options configure a Plane.
type Options struct {
	// NetNS is the network namespace to program; 0 or -1 (netns.None())
	// means the current one. The handle must stay open while the Plane
	// is in use.
	NetNS netns.NsHandle
	// Table is the name of the inet table xlb owns (default "xlb"). With
	// Shards > 1 it is the prefix of the tables: xlb-00, xlb-01, ...
	Table string
	// Shards spreads farms over this many tables (at most MaxShards).
	// 0 or 1: one table. See Plane for why.
	Shards int
	// LogGroup, when not 0, sends the log lines of farms with "log" to
	// this NFLOG group instead of the kernel log.
	LogGroup uint16
	// NoCounters leaves out the traffic counters (counters.go): no
	// counter table, no per-packet lookup. Counters then answer that
	// the plane keeps none.
	NoCounters bool
	// SNATPorts are the source ports of this node's snat connections
	// (zero: the kernel's choice). Nodes that share a farm's source-addr
	// take disjoint ranges (docs/ha.md).
	SNATPorts model.PortRange
	// PoliciesOnOutput checks farms' policies (named tables) for the
	// node's own connections too, at the output hook, as kube-proxy
	// checks loadBalancerSourceRanges (xlb kube-proxy sets it). Without
	// it, as nftlb, only what arrives on an interface is checked.
	PoliciesOnOutput bool
}

// dialNFT opens a lasting nftables netlink connection in namespace ns.
func dialNFT(ns netns.NsHandle) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(setBuffers, recordPort)}
	if ns.IsOpen() {
		opts = append(opts, nftables.WithNetNSFd(int(ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nftables: %w", err)
	}
	return c, nil
}

// setBuffers raises the socket buffers past the sysctl limits (root only),
// falling back to what the limits allow.
func setBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		for _, o := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], sockBuf); e != nil {
				if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], sockBuf); e != nil {
					serr = e
				}
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// DefaultShards is the number of tables the daemon spreads farms over.
const DefaultShards = 32

// MaxShards bounds Options.Shards: each shard's set IDs live in a range of
// their own (nextIDBase), 2^24 apart.
const MaxShards = 256

// Plane is the nftables data plane. It owns Options.Shards tables of family
// inet (and their netdev twins of the same names, for mode dsr), each a
// complete shard (static sets, base chains, its farms), and never touches
// any other table. A farm's table is chosen by a hash of its name. Its
// methods are safe for concurrent use, but the engine calls them from one
// goroutine.
//
// A farm's way into the kernel (Apply): the diff is split once
// (plan.SplitDiff) and cut by table; each table's part is queued into the
// one batch (shard.queue, apply.go), where each farm is planned (planFarm,
// plan.go: its rule content; placement.go: where it goes) and written
// (putFarm or removeFarm, farm.go) from the rule builders (rules.go,
// sets.go); the batch (batch.go) is sent as one netlink transaction and
// the shards commit what it holds.
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
type Plane struct {
	log  *slog.Logger
	opts Options

	mu     sync.Mutex
	conn   *nftables.Conn // shared by the shards: one batch spans tables
	shards []*shard
	idBase uint32

	// lastElemMsgs: the static sets' element messages of the last Apply
	// (tests check that a bulk change shares them, see batch.runs).
	lastElemMsgs int

	// tables holds named tables and policies (tables_plane.go).
	tables lazyTables

	// ctr is the counter table (counters.go); nil with NoCounters.
	ctr *counters
	// watch sees changes to xlb's tables by others (watch.go).
	watch driftWatch

	// passive watches the handshakes of farms with passive checks
	// (passive.go), passiveFarms.
	passive      *conntrack.Passive
	passiveFarms map[string]*model.Farm
}

var _ dataplane.Dataplane = (*Plane)(nil)

// New connects to nftables in opts.NetNS and makes sure xlb's tables, their
// static sets and base chains exist, without touching farms: call
// Reconcile for that. It replaces the base chains' rules atomically, so
// traffic through existing farms keeps flowing.
func New(ctx context.Context, log *slog.Logger, opts Options) (*Plane, error) {
	if opts.Shards < 0 || opts.Shards > MaxShards {
		return nil, fmt.Errorf("nft tables %d: allowed 1-%d", opts.Shards, MaxShards)
	}
	opts.Shards = max(opts.Shards, 1)
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.NetNS == 0 {
		opts.NetNS = netns.None()
	}
	s := &Plane{log: log, opts: opts, passive: conntrack.NewPassive(log.With("component", "passive"), opts.NetNS), passiveFarms: map[string]*model.Farm{}}
	c, err := dialNFT(opts.NetNS)
	if err != nil {
		return nil, err
	}
	s.conn = c
	for i := range opts.Shards {
		o := opts
		o.Shards = 0
		if opts.Shards > 1 {
			o.Table = ShardTable(opts.Table, i)
		}
		p, err := newShard(ctx, log, o, s)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.shards = append(s.shards, p)
	}
	if err := s.openCounters(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// ShardTable names table i of several: <prefix>-<two hex digits>. One
// table (--nft-tables 1) is named prefix.
func ShardTable(prefix string, i int) string { return fmt.Sprintf("%s-%02x", prefix, i) }

// shardOf returns the index of the table that holds farm name (both halves
// of a dual farm are in the farm's table).
func (s *Plane) shardOf(name string) int {
	h := fnv.New32a()
	h.Write([]byte(plan.FarmOf(name)))
	return int(h.Sum32() % uint32(len(s.shards)))
}

// nextIDBase gives each shard a range of set IDs of its own: IDs name new
// sets within one batch, and a batch spans all tables.
func (s *Plane) nextIDBase() uint32 {
	s.idBase += 1 << 24
	return s.idBase
}

// Name implements dataplane.Dataplane.
func (s *Plane) Name() string { return PlaneName }

// Check implements dataplane.Dataplane: it refuses every farm field value
// this data plane does not implement (check.go).
func (s *Plane) Check(f *model.Farm) error {
	if err := checkSource(f); err != nil || f.SourceTable != "" { // sourcetable.go
		return err
	}
	return check(f)
}

// Close releases the netlink connection. The tables stay in the kernel, so
// traffic keeps flowing while xlb restarts.
func (s *Plane) Close() error {
	s.tables.close()
	if s.passive != nil {
		s.passive.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	err := s.conn.CloseLasting()
	s.conn = nil
	for _, p := range s.shards {
		p.conn = nil
	}
	return err
}

// errClosed is the error of a call after Close.
var errClosed = errors.New("nft data plane is closed")

// redial replaces the shared connection after an error (a failed batch can
// leave unread acks behind). The caller holds s.mu.
func (s *Plane) redial() {
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

var _ dataplane.SessionStore = (*Plane)(nil)
