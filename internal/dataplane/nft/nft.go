package nft

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
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
	// Shards spreads farms over this many tables (Open; at most 256).
	// 0 or 1: one table. See Sharded for why.
	Shards int
	// LogGroup, when not 0, sends the log lines of farms with "log" to
	// this NFLOG group instead of the kernel log.
	LogGroup uint16
}

// Plane is the nftables data plane. It owns one inet table (and its netdev
// twin of the same name, for mode dsr) and never touches any other. Its
// methods are safe for concurrent use, but the engine calls them from one
// goroutine.
type Plane struct {
	log   *slog.Logger
	opts  Options
	table *nftables.Table
	// ntable is the netdev table of the same name: mode dsr (dsr.go).
	ntable *nftables.Table

	mu     sync.Mutex
	conn   *nftables.Conn
	static map[string]*nftables.Set
	farms  map[string]*farmState // what the kernel holds, by farm name
	gen    uint64                // generation of backend maps (unique names)
	setID  uint32

	// shared is set when this Plane is one table of a Sharded plane: the
	// netlink connection belongs to the Sharded plane, which redials it.
	shared *Sharded

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

	// lastElemMsgs: the static sets' element messages of the last Apply
	// (tests check that a bulk change shares them, see batch.runs).
	lastElemMsgs int

	// tables holds named tables and policies (tables_plane.go).
	tables lazyTables
}

// hookState is which of the table's per-packet base chains exist. The NAT
// chains see only a connection's first packet, but the raw (stateless
// farms) and filter (per-farm filters) chains see every packet, so a table
// has them only while one of its farms needs them: with farms spread over
// many tables, idle ones would otherwise cost every packet a few lookups
// per table.
//
// devs lists (sorted, comma-separated) the devices whose ingress the netdev
// table hooks: the ifaces of its dsr farms.
type hookState struct {
	raw, filter bool
	devs        string
}

// hookUsers counts the farms of the table that need each per-packet base
// chain, so that a change updates it in O(changed farms) rather than by
// scanning every farm of the table.
type hookUsers struct {
	raw, filter int
	devs        map[string]int // dsr iface -> farms
}

// count adds n (1 or -1) users for what s needs.
func (u *hookUsers) count(s *farmState, n int) {
	if s == nil || s.plan == nil {
		return
	}
	if s.plan.stls {
		u.raw += n
	}
	if s.plan.fchain != "" {
		u.filter += n
	}
	if s.plan.dsr != nil {
		if u.devs == nil {
			u.devs = map[string]int{}
		}
		u.devs[s.plan.dsr.iface] += n
		if u.devs[s.plan.dsr.iface] == 0 {
			delete(u.devs, s.plan.dsr.iface)
		}
	}
}

func (u hookUsers) clone() hookUsers {
	u.devs = maps.Clone(u.devs)
	return u
}

// state returns the base chains the counted farms need.
func (u hookUsers) state() hookState {
	devs := slices.Sorted(maps.Keys(u.devs))
	return hookState{raw: u.raw > 0, filter: u.filter > 0, devs: strings.Join(devs, ",")}
}

// pending is what a queued batch will have put in the kernel once flushed.
type pending struct {
	farms   map[string]*farmState // nil value: the farm is gone
	users   hookUsers
	hooks   hookState
	groups  groupCounts
	touched map[string]groupRef // group chains the batch changes
	// err: the batch could not be built (listing a group chain failed);
	// it must not be sent.
	err error
}

// farmState is what Apply or Reconcile programmed for one farm.
type farmState struct {
	plan    *farmPlan // nil: the farm is known but not in the kernel (not up)
	mapName string    // "" when the chain only drops
}

// sets returns the names of the farm's sets and maps in the kernel.
func (s *farmState) sets() []string {
	if s == nil || s.plan == nil || s.mapName == "" {
		return nil
	}
	out := []string{s.mapName}
	if s.plan.ids {
		out = append(out, activeName(s.mapName))
	}
	if s.plan.persist != "" {
		out = append(out, s.plan.persist)
	}
	for _, l := range s.plan.limitList() {
		out = append(out, idsName(s.mapName, l), countName(s.plan.name, l))
	}
	return out
}

var _ dataplane.Dataplane = (*Plane)(nil)

// New connects to nftables in opts.NetNS and makes sure xlb's table, its
// static sets and its base chains exist (without touching farms: call
// Reconcile for that). It replaces the base chains' rules atomically, so
// traffic through existing farms keeps flowing.
func New(ctx context.Context, log *slog.Logger, opts Options) (*Plane, error) {
	return newTablePlane(ctx, log, opts, nil)
}

// newTablePlane is New; with shared, the Plane is one table of a Sharded plane
// and uses its connection.
func newTablePlane(ctx context.Context, log *slog.Logger, opts Options, shared *Sharded) (*Plane, error) {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.NetNS == 0 {
		opts.NetNS = netns.None()
	}
	p := &Plane{
		log:      log,
		opts:     opts,
		table:    &nftables.Table{Name: opts.Table, Family: nftables.TableFamilyINet},
		ntable:   &nftables.Table{Name: opts.Table, Family: nftables.TableFamilyNetdev},
		farms:    map[string]*farmState{},
		ghandles: map[string]map[string][]uint64{},
		gen:      uint64(time.Now().UnixNano()),
	}
	p.static = map[string]*nftables.Set{}
	for _, s := range staticSets(p.table) {
		p.static[s.Name] = s
	}
	for _, s := range netdevSets(p.ntable) {
		p.static[s.Name] = s
	}
	if shared != nil {
		p.shared, p.conn = shared, shared.conn
		p.setID = shared.nextIDBase()
	} else if err := p.dial(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		p.Close()
		return nil, err
	}
	b := p.newBatch()
	b.ensureStatic()
	if err := b.flush(); err != nil {
		p.Close()
		return nil, fmt.Errorf("create table inet %s: %w", opts.Table, err)
	}
	if err := p.programPostrouting(); err != nil {
		p.Close()
		return nil, fmt.Errorf("program postrouting chain: %w", err)
	}
	if err := p.programDSR(); err != nil {
		p.Close()
		return nil, fmt.Errorf("program dsr chain of table netdev %s: %w", opts.Table, err)
	}
	return p, nil
}

func (p *Plane) dial() error {
	c, err := dialNFT(p.opts.NetNS)
	if err != nil {
		return err
	}
	p.conn = c
	return nil
}

// dialNFT opens a lasting nftables netlink connection in namespace ns.
func dialNFT(ns netns.NsHandle) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(setBuffers)}
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

// Name implements dataplane.Dataplane.
func (p *Plane) Name() string { return PlaneName }

// Close releases the netlink connection. The table stays in the kernel, so
// traffic keeps flowing while xlb restarts.
func (p *Plane) Close() error {
	p.tables.close()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	if p.shared != nil { // the Sharded plane closes the connection
		p.conn = nil
		return nil
	}
	err := p.conn.CloseLasting()
	p.conn = nil
	return err
}

// Check refuses every farm field value this data plane does not implement.
func (p *Plane) Check(f *model.Farm) error {
	no := func(field, value string) error { return dataplane.Unsupported(PlaneName, f, field, value) }
	if err := dataplane.CheckNftlbFields(PlaneName, f); err != nil {
		return err
	}
	switch {
	case !f.VirtualAddr.IsValid() && !f.IsMarkFarm():
		return no("virtual-addr", "")
	case f.IsMarkFarm() && (f.Family == model.FamilyDual || f.Helper != model.HelperNone || f.TCPStrict || f.RstRTLimit != 0 || f.Log != 0):
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "mark", Value: fmt.Sprint(f.Mark),
			Problem: "firewall-mark farms in the " + PlaneName + " data plane do not take family dual, helper, tcp-strict, rst-rtlimit or log yet"}
	case f.Family == model.FamilyDual:
		return p.checkDual(f)
	case f.Mode == model.ModeStlsDNAT && f.IsMarkFarm():
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "mode", Value: f.Mode.String(),
			Problem: "the " + PlaneName + " data plane does stlsdnat for VIP farms only (a firewall mark is set after the raw hook)"}
	case f.Mode == model.ModeStlsDNAT && f.Scheduler != model.SchedHash && f.Scheduler != model.SchedSymhash && f.Scheduler != model.SchedMaglev:
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "scheduler", Value: f.Scheduler.String(),
			Problem: "mode stlsdnat picks a backend for every packet, so it needs a scheduler that hashes the flow: hash, symhash or maglev"}
	case f.Mode == model.ModeStlsDNAT && (f.Protocol != model.ProtoTCP && f.Protocol != model.ProtoUDP):
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "protocol", Value: f.Protocol.String(),
			Problem: "mode stlsdnat rewrites ports and checksums of tcp or udp only"}
	case f.Mode == model.ModeStlsDNAT && (f.NewRTLimit != 0 || f.RstRTLimit != 0 || f.Log != 0 || len(f.Backends) > 0 && stlsPortProblem(f)):
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "mode", Value: f.Mode.String(),
			Problem: "stlsdnat farms in the " + PlaneName + " data plane take no new-rtlimit, rst-rtlimit, log, backend marks or backend est-connlimit; all backends need the same port, and a port needs a single virtual port"}
	case f.Persistence != 0 && persistKeySize(f) > maxKeySize:
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "persistence", Value: f.Persistence.String(),
			Problem: fmt.Sprintf("key is %d bytes, the %s data plane holds at most %d (e.g. srcip-srcport, srcip-dstport)", persistKeySize(f), PlaneName, maxKeySize)}
	case f.Mark != 0 && !f.IsMarkFarm():
		return no("mark", fmt.Sprint(f.Mark))
	case f.Priority != 1:
		// Backend priority groups follow model.Farm.ActiveBackends; a farm
		// priority other than the default has no meaning here yet.
		return no("priority", fmt.Sprint(f.Priority))
	case len(f.Policies) > 0:
		if err := CheckPolicies(f); err != nil { // tables.go
			return err
		}
	}
	if f.Mode == model.ModeDSR {
		if err := dsrCheck(f); err != nil {
			return err
		}
	}
	var zeroPort, port bool
	marks := map[uint32]string{}
	for i := range f.Backends {
		b := &f.Backends[i]
		if b.Mark != 0 && marks[b.Mark] == "" {
			marks[b.Mark] = netip.AddrPortFrom(b.Addr, b.Port).String()
		}
		bno := func(field, value string) error {
			return &model.FieldError{Object: fmt.Sprintf("farm %q backend %q", f.Name, b.Name), Field: field, Value: value,
				Problem: "is not implemented by the " + PlaneName + " data plane yet"}
		}
		switch {
		case b.Mark != 0 && marks[b.Mark] != "" && marks[b.Mark] != netip.AddrPortFrom(b.Addr, b.Port).String():
			return &model.FieldError{Object: fmt.Sprintf("farm %q backend %q", f.Name, b.Name), Field: "mark", Value: fmt.Sprint(b.Mark),
				Problem: "is already the mark of another backend of this farm; in the " + PlaneName + " data plane a backend mark names the backend, so marks must be unique per farm"}
		case b.EstConnLimit != 0 && f.Persistence != 0:
			return bno("est-connlimit", fmt.Sprint(b.EstConnLimit)+" with persistence")
		}
		zeroPort = zeroPort || b.Port == 0
		port = port || b.Port != 0
	}
	single := len(f.VirtualPorts) == 1 && f.VirtualPorts[0].First == f.VirtualPorts[0].Last
	if zeroPort && port && !single {
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "backends.port", Value: "0",
			Problem: "backends with port 0 (keep the client's port) and backends with a port cannot be mixed in a farm with several virtual ports in the " + PlaneName + " data plane"}
	}
	return nil
}

// Apply implements dataplane.Dataplane: the whole diff is one netlink
// batch, so the kernel applies all of it or none of it. Its cost is in
// proportion to the changed farms: nothing is listed from the kernel.
func (p *Plane) Apply(ctx context.Context, d dataplane.Diff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	links, err := resolveDSR(p.opts.NetNS, diffFarms(expandDiff(d)))
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return errors.New("nft data plane is closed")
	}
	b := p.newBatch()
	b.links = links
	pd := p.queue(b, d)
	if pd.err != nil {
		p.redial() // drops the queued messages
		return fmt.Errorf("apply %d farm changes: %w", len(d.Changes), pd.err)
	}
	if err := b.flush(); err != nil {
		return fmt.Errorf("apply %d farm changes: %w", len(d.Changes), err)
	}
	p.commit(pd)
	p.lastElemMsgs = b.n
	return nil
}

// queue adds the messages of d to batch b (nothing is sent) and returns the
// farms' states to commit once the batch is in the kernel.
func (p *Plane) queue(b *batch, d dataplane.Diff) *pending {
	d = expandDiff(d)
	next := map[string]*farmState{}
	users := p.users.clone()
	b.groups, b.touched = p.groups.clone(), map[string]groupRef{}
	cur := func(name string) *farmState {
		if s, ok := next[name]; ok {
			return s
		}
		return p.farms[name]
	}
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
		old := cur(name)
		users.count(old, -1)
		if c.New == nil {
			b.removeFarm(old)
			next[name] = nil
			continue
		}
		next[name] = b.putFarm(old, c.New)
		users.count(next[name], 1)
	}
	b.dropEmptyGroups()
	want := users.state()
	b.syncHooks(p.hooks, want)
	b.syncDevs(p.hooks.devs, want.devs)
	b.drain() // a Sharded batch is flushed by its caller
	return &pending{farms: next, users: users, hooks: want, groups: b.groups, touched: b.touched, err: b.err}
}

// commit records what a queued batch put in the kernel.
func (p *Plane) commit(pd *pending) {
	for name, s := range pd.farms {
		if s == nil {
			delete(p.farms, name)
		} else {
			p.farms[name] = s
		}
	}
	p.hooks, p.users = pd.hooks, pd.users
	p.groups = pd.groups
	for ch := range pd.touched {
		delete(p.ghandles, ch)
	}
}

// Reconcile implements dataplane.Dataplane. It reads xlb's table from the
// kernel and, in one batch, ensures the static objects, rebuilds every
// farm's chain and backend map, adds missing and removes wrong service and
// snat elements, and deletes chains and sets that belong to no farm. The
// service maps are never flushed, so no farm is missing at any moment;
// established connections keep their conntrack NAT bindings.
func (p *Plane) Reconcile(ctx context.Context, farms []*model.Farm) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return errors.New("nft data plane is closed")
	}
	farms, links, err := resolveLenient(p.log, p.opts.NetNS, expandFarms(farms))
	if err != nil {
		return err
	}
	k, err := p.readKernel()
	if err != nil {
		return err
	}
	b := p.newBatch()
	b.links = links
	b.ensureStatic()
	next := map[string]*farmState{}
	wantElems := map[string]map[string]elem{} // set -> id -> element
	for _, s := range staticSets(p.table) {
		wantElems[s.Name] = map[string]elem{}
	}
	for _, s := range netdevSets(p.ntable) {
		wantElems[s.Name] = map[string]elem{}
	}
	keepChains := map[string]bool{chainPrerouting: true, chainOutput: true, chainPostrouting: true, chainDsr: true,
		chainDir4: true, chainDir6: true}
	keepSets, keepHelpers := map[string]bool{}, map[string]bool{}
	for name := range wantElems {
		keepSets[name] = true
	}
	// Group chains are packed afresh: every one in use is emptied and
	// refilled (addGroupChain), those no farm needs are strays.
	b.groups, b.touched = groupCounts{}, map[string]groupRef{}
	for _, f := range farms {
		if _, dup := next[f.Name]; dup {
			return fmt.Errorf("reconcile: farm %q given twice", f.Name)
		}
		pl := b.plan(f)
		if pl == nil {
			next[f.Name] = &farmState{}
			continue
		}
		if pl.grouped {
			b.joinGroup(pl, -1)
		}
		keepChains[pl.chain] = true
		if pl.helper != "" {
			keepHelpers[pl.helper] = true
		}
		for _, x := range auxes {
			if name := x.chain(pl); name != "" {
				keepChains[name] = true
				b.buildAux(x, pl, f, k.chains[name] != nil)
				for _, e := range x.elems(pl) {
					wantElems[x.set(pl)][e.id()] = e
				}
			}
		}
		s := &farmState{plan: pl}
		if pl.isDirect() {
			for _, e := range pl.direct {
				wantElems[pl.directSet()][e.id()] = e
			}
		} else {
			s = b.buildFarm(pl, f, k.chains[pl.chain] == b.tableOf(pl))
		}
		for _, name := range s.sets() {
			keepSets[name] = true
		}
		next[f.Name] = s
		for _, e := range pl.svc {
			wantElems[elemSet(pl.svcSet(), e)][e.id()] = e
		}
		for _, e := range pl.post {
			wantElems[elemSet(pl.postSet(), e)][e.id()] = e
		}
	}
	// Per-packet base chains: (re)made if a farm needs them, else strays.
	var users hookUsers
	for _, s := range next {
		users.count(s, 1)
	}
	hooks := users.state()
	if hooks.raw {
		keepChains[chainRaw] = true
		b.addHook(chainRaw)
	}
	if hooks.filter {
		keepChains[chainFilter] = true
		b.addHook(chainFilter)
	}
	for _, d := range splitDevs(hooks.devs) {
		keepChains[devChain+d] = true
		b.addDevChain(d)
	}
	// Service and snat elements: remove what is wrong, add what is missing.
	for name, want := range wantElems {
		have := k.elems[name]
		var del, add []elem
		for id, e := range have {
			if w, ok := want[id]; !ok || !w.same(e) {
				del = append(del, e)
			}
		}
		for id, e := range want {
			if h, ok := have[id]; !ok || !h.same(e) {
				add = append(add, e)
			}
		}
		b.delElems(p.static[name], del)
		b.addElems(p.static[name], add)
	}
	// Strays: anything else in xlb's table.
	var strayChains []*nftables.Chain
	for name, t := range k.chains {
		if !keepChains[name] {
			ch := &nftables.Chain{Table: t, Name: name}
			strayChains = append(strayChains, ch)
			b.c.FlushChain(ch)
		}
	}
	for _, ch := range strayChains {
		b.delChain(ch)
	}
	for name, t := range k.sets {
		if !keepSets[name] {
			b.c.DelSet(&nftables.Set{Table: t, Name: name})
		}
	}
	for _, name := range k.helpers {
		if !keepHelpers[name] {
			b.c.DeleteObject(&nftables.NamedObj{Table: p.table, Name: name, Type: nftables.ObjTypeCtHelper})
		}
	}
	if err := b.flush(); err != nil {
		return fmt.Errorf("reconcile %d farms: %w", len(farms), err)
	}
	p.farms = next
	p.hooks, p.users = hooks, users
	p.groups, p.ghandles = b.groups, map[string]map[string][]uint64{}
	if err := p.programPostrouting(); err != nil {
		return fmt.Errorf("reconcile postrouting chain: %w", err)
	}
	if err := p.programDSR(); err != nil {
		return fmt.Errorf("reconcile dsr chain: %w", err)
	}

	if p.shared == nil {
		// A table of a Sharded plane leaves this to the Sharded plane,
		// which knows every table of its layout.
		dropped, err := dropOtherLayouts(p.conn, p.opts.Table, map[string]bool{p.opts.Table: true})
		if err != nil {
			p.redial()
			return err
		}
		if len(dropped) > 0 {
			p.log.Info("deleted the tables of another --nft-tables layout", "tables", dropped)
		}
	}
	p.log.Debug("nft reconciled", "farms", len(farms), "stray_chains", len(strayChains))
	return nil
}

// kernelState is what Reconcile read from xlb's table.
type kernelState struct {
	// chains and sets of xlb's inet and netdev tables, by name (names
	// are unique across the two), with the table each is in.
	chains  map[string]*nftables.Table
	sets    map[string]*nftables.Table
	helpers []string                   // ct helper objects
	elems   map[string]map[string]elem // static set -> id -> element
}

func (p *Plane) readKernel() (*kernelState, error) {
	k := &kernelState{chains: map[string]*nftables.Table{}, sets: map[string]*nftables.Table{}, elems: map[string]map[string]elem{}}
	for _, t := range []*nftables.Table{p.table, p.ntable} {
		if err := p.readTable(k, t); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// readTable adds what table t holds to k.
func (p *Plane) readTable(k *kernelState, t *nftables.Table) error {
	tables, err := p.conn.ListTablesOfFamily(t.Family)
	if err != nil {
		p.redial()
		return fmt.Errorf("list tables: %w", err)
	}
	found := false
	for _, kt := range tables {
		found = found || kt.Name == t.Name
	}
	if !found {
		return nil
	}
	chains, err := p.conn.ListChainsOfTableFamily(t.Family)
	if err != nil {
		p.redial()
		return fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name == t.Name {
			k.chains[c.Name] = t
		}
	}
	if t.Family == nftables.TableFamilyINet {
		helpers, err := p.listHelperObjects()
		if err != nil {
			return fmt.Errorf("list objects: %w", err)
		}
		k.helpers = helpers
	}
	sets, err := p.conn.GetSets(t)
	if err != nil {
		p.redial()
		return fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		k.sets[s.Name] = t
		if st, ok := p.static[s.Name]; !ok || st.Table.Family != t.Family {
			continue
		}
		els, err := p.conn.GetSetElements(s)
		if err != nil {
			p.redial()
			return fmt.Errorf("list elements of %s: %w", s.Name, err)
		}
		m := map[string]elem{}
		for _, se := range els {
			e := elem{Key: se.Key, KeyEnd: se.KeyEnd}
			if s.IsMap {
				if se.VerdictData != nil {
					e.Chain = se.VerdictData.Chain
					switch se.VerdictData.Kind {
					case expr.VerdictGoto:
					case expr.VerdictJump:
						e.Jump = true
					default:
						e.Chain = "\x00wrong verdict"
					}
				} else {
					e.Val = se.Val
				}
			}
			m[e.id()] = e
		}
		k.elems[s.Name] = m
	}
	return nil
}

// redial replaces the netlink connection after an error: a failed batch can
// leave unread acks on the socket that would confuse the next one.
func (p *Plane) redial() {
	if p.shared != nil {
		p.shared.redial()
		return
	}
	if p.conn != nil {
		_ = p.conn.CloseLasting()
		p.conn = nil
	}
	if err := p.dial(); err != nil {
		p.log.Error("nft reconnect failed", "err", err)
	}
}

// batch collects one netlink transaction.
type batch struct {
	p     *Plane
	c     *nftables.Conn
	n     int                 // element messages of static sets queued
	links map[string]*dsrLink // resolved links of the dsr farms, by farm name
	// groups and touched: the group chains' farm counts after this batch,
	// and the group chains it changes (see pending).
	groups  groupCounts
	touched map[string]groupRef
	err     error // the first error building the batch: it must not be sent
	// runs holds back element adds and deletes of static sets, so that
	// the elements of many farms go into one message per set (elemChunk
	// elements a message) instead of one message per farm and set: the
	// library reads every message's acknowledgement with a receive call
	// of its own, and a restore of 16,000 farms sent about 50,000
	// messages, which cost most of its time. A set's run is sent when an
	// operation of the other kind (add or delete) comes for that set, so
	// each set sees its operations in order; all runs are sent before a
	// chain is deleted (a held-back delete may be of an element pointing
	// at it) and at the end of the batch (drain).
	runs  []elemRun
	runOf map[setRef]int // index into runs
}

// setRef names a set (not its *nftables.Set: ensureStatic replaces those).
type setRef struct {
	family      nftables.TableFamily
	table, name string
}

// elemRun is a held-back add or delete of elements of one set.
type elemRun struct {
	set *nftables.Set
	del bool
	els []nftables.SetElement
}

// plan is plan(f), completed with the farm's resolved links in mode dsr.
func (b *batch) plan(f *model.Farm) *farmPlan {
	pl := plan(f)
	if pl != nil && pl.dsrMode {
		l := b.links[f.Name]
		if l == nil {
			// Apply and Reconcile resolve every dsr farm they are given.
			panic("nft: dsr farm " + f.Name + " applied without resolved links")
		}
		pl.setDSR(f, l)
	}
	return pl
}

// tableOf returns the table a farm's chain and maps are in.
func (b *batch) tableOf(pl *farmPlan) *nftables.Table {
	if pl.dsrMode {
		return b.p.ntable
	}
	return b.p.table
}

// diffFarms returns the new farms of a diff.
func diffFarms(d dataplane.Diff) []*model.Farm {
	var out []*model.Farm
	for _, c := range d.Changes {
		if c.New != nil {
			out = append(out, c.New)
		}
	}
	return out
}

func (p *Plane) newBatch() *batch { return &batch{p: p, c: p.conn} }

func (b *batch) flush() error {
	b.drain()
	if err := b.c.Flush(); err != nil {
		b.p.redial()
		return explain(err)
	}
	return nil
}

// explain turns the library's joined per-message errors into the first
// errno, which is what the kernel rejected.
func explain(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return fmt.Errorf("netlink batch rejected: %w", errno)
	}
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i > 0 {
		msg = msg[:i]
	}
	return fmt.Errorf("netlink batch rejected: %s", msg)
}

func (b *batch) nextID() uint32 {
	b.p.setID++
	if b.p.setID == 0 {
		b.p.setID++
	}
	return b.p.setID
}

// ensureStatic adds (idempotently) the table, the static sets and the base
// chains, and replaces the base chains' rules in this same transaction.
func (b *batch) ensureStatic() {
	t := b.p.table
	b.c.AddTable(t)
	for _, s := range staticSets(t) {
		s.ID = b.nextID()
		b.p.static[s.Name] = s
		_ = b.c.AddSet(s, nil) // only fails for anonymous sets
	}
	accept := nftables.ChainPolicyAccept
	base := func(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority, rules [][]expr.Any) {
		ch := b.c.AddChain(&nftables.Chain{Table: t, Name: name, Type: nftables.ChainTypeNAT,
			Hooknum: hook, Priority: prio, Policy: &accept})
		b.c.FlushChain(ch)
		for _, r := range rules {
			b.c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
		}
	}
	// Firewall-mark farms first, as IPVS looks up fwmark services first.
	svc := [][]expr.Any{fwmRule(false), fwmRule(true), svcExactRule(false), svcExactRule(true), svcRule(false), svcRule(true)}
	base(chainPrerouting, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, svc)
	base(chainOutput, nftables.ChainHookOutput, nftables.ChainPriorityNATDest, svc)
	// The shared chains of direct farms (setDirect).
	for _, v6 := range []bool{false, true} {
		ch := b.c.AddChain(&nftables.Chain{Table: t, Name: pick(v6, chainDir4, chainDir6)})
		b.c.FlushChain(ch)
		for _, r := range directRules(v6) {
			b.c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
		}
	}
	// The raw and filter base chains come and go with the farms that need
	// them (syncHooks). The postrouting chain's rules are sent by programPostrouting.
	b.c.AddChain(&nftables.Chain{Table: t, Name: chainPostrouting, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	// The netdev table (mode dsr): static maps and the regular chain dsr,
	// whose rules programDSR sends; device chains come and go (syncDevs).
	b.c.AddTable(b.p.ntable)
	for _, s := range netdevSets(b.p.ntable) {
		s.ID = b.nextID()
		b.p.static[s.Name] = s
		_ = b.c.AddSet(s, nil)
	}
	b.c.AddChain(&nftables.Chain{Table: b.p.ntable, Name: chainDsr})
}

// syncHooks adds or deletes the per-packet base chains so the table has
// want (see hookState); have is what it has now.
func (b *batch) syncHooks(have, want hookState) {
	if want.raw && !have.raw {
		b.addHook(chainRaw)
	}
	if want.filter && !have.filter {
		b.addHook(chainFilter)
	}
	for _, gone := range []struct {
		name string
		drop bool
	}{{chainRaw, have.raw && !want.raw}, {chainFilter, have.filter && !want.filter}} {
		if gone.drop {
			ch := &nftables.Chain{Table: b.p.table, Name: gone.name}
			b.c.FlushChain(ch)
			b.delChain(ch)
		}
	}
}

// addHook adds (or, if it exists, re-fills) the raw or filter base chain.
func (b *batch) addHook(name string) {
	t := b.p.table
	accept := nftables.ChainPolicyAccept
	switch name {
	case chainRaw:
		// Stateless farms, before conntrack.
		raw := b.c.AddChain(&nftables.Chain{Table: t, Name: chainRaw, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept})
		b.c.FlushChain(raw)
		for _, v6 := range []bool{false, true} {
			b.c.AddRule(&nftables.Rule{Table: t, Chain: raw, Exprs: vmapRule(v6, pick(v6, setStls4, setStls6))})
			b.c.AddRule(&nftables.Rule{Table: t, Chain: raw, Exprs: revRule(v6)})
		}
	case chainFilter:
		// Per-farm filters, after conntrack (-200) so ct state is known and
		// before dnat (-100) so the VIP is still the destination.
		filt := b.c.AddChain(&nftables.Chain{Table: t, Name: chainFilter, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept})
		b.c.FlushChain(filt)
		for _, v6 := range []bool{false, true} {
			b.c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: vmapRule(v6, pick(v6, setFsvc4, setFsvc6))})
		}
	}
}

// addElems adds els to static set s (held back: see batch.runs).
func (b *batch) addElems(s *nftables.Set, els []elem) {
	if len(els) == 0 {
		return
	}
	r := b.run(s, false)
	for _, e := range els {
		r.els = append(r.els, e.setElement())
	}
}

// run returns s's held-back run of kind del, sending the run of the other
// kind first if there is one.
func (b *batch) run(s *nftables.Set, del bool) *elemRun {
	key := setRef{s.Table.Family, s.Table.Name, s.Name}
	i, ok := b.runOf[key]
	if !ok {
		if b.runOf == nil {
			b.runOf = map[setRef]int{}
		}
		i = len(b.runs)
		b.runOf[key] = i
		b.runs = append(b.runs, elemRun{set: s, del: del})
	}
	r := &b.runs[i]
	if r.del != del {
		b.send(r)
		r.del = del
	}
	return r
}

// send queues run r's elements as messages of elemChunk elements and
// empties it.
func (b *batch) send(r *elemRun) {
	for i := 0; i < len(r.els); i += elemChunk {
		chunk := r.els[i:min(i+elemChunk, len(r.els))]
		if r.del {
			_ = b.c.SetDeleteElements(r.set, chunk)
		} else {
			_ = b.c.SetAddElements(r.set, chunk) // only fails for anonymous sets
		}
		b.n++
	}
	r.els = r.els[:0]
}

// drain queues every held-back run, in the order the runs began.
func (b *batch) drain() {
	for i := range b.runs {
		b.send(&b.runs[i])
	}
}

// delChain deletes chain ch after the held-back element deletes, one of
// which may be of an element that points at it.
func (b *batch) delChain(ch *nftables.Chain) {
	b.drain()
	b.c.DelChain(ch)
}

// addTo adds els to the static set name, single-port keys to its hash
// twin (exactSet).
func (b *batch) addTo(name string, els []elem) {
	interval, exact := splitExact(els)
	b.addElems(b.p.static[name], interval)
	if len(exact) > 0 {
		b.addElems(b.p.static[exactSet(name)], exact)
	}
}

// delFrom deletes els from the static set name and its hash twin.
func (b *batch) delFrom(name string, els []elem) {
	interval, exact := splitExact(els)
	b.delElems(b.p.static[name], interval)
	if len(exact) > 0 {
		b.delElems(b.p.static[exactSet(name)], exact)
	}
}

func splitExact(els []elem) (interval, exact []elem) {
	for _, e := range els {
		if e.Exact {
			exact = append(exact, e)
		} else {
			interval = append(interval, e)
		}
	}
	return interval, exact
}

// delElems deletes els from static set s (held back: see batch.runs).
func (b *batch) delElems(s *nftables.Set, els []elem) {
	if len(els) == 0 {
		return
	}
	r := b.run(s, true)
	for _, e := range els {
		// Deletes match on the key; data is not needed.
		r.els = append(r.els, nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
	}
}

// buildFarm (re)creates a farm's chain and a new backend map with a fresh
// name, and points the chain's rules at it. existing says whether the chain
// is already in the kernel (then its rules are flushed in this batch).
func (b *batch) buildFarm(pl *farmPlan, f *model.Farm, existing bool) *farmState {
	t := b.tableOf(pl)
	ch := &nftables.Chain{Table: t, Name: pl.chain}
	switch {
	case pl.grouped: // the group chain exists (joinGroup)
	case existing:
		b.c.FlushChain(ch)
	default:
		b.c.AddChain(ch)
	}
	s := &farmState{plan: pl}
	var set *nftables.Set
	var modulus uint32
	if pl.kind != kindNone {
		b.p.gen++
		s.mapName = mapName(f.Name, b.p.gen)
		set = pl.mapSet(t, f, s.mapName, b.nextID())
		var els []nftables.SetElement
		els, modulus = pl.mapElems(f)
		if !set.Interval {
			// A backend map is never added to after it is built (a
			// change builds a new one), so its size is known. Given a
			// size, the kernel picks its fixed-size hash (nft_hash_fast
			// for these 4-byte keys) over the resizable rhashtable,
			// which grew step by step as a map of 100 backends filled.
			set.Size = uint32(len(els))
		}
		_ = b.c.AddSet(set, nil)
		for i := 0; i < len(els); i += elemChunk {
			_ = b.c.SetAddElements(set, els[i:min(i+elemChunk, len(els))])
		}
	}
	var id uint32
	var pset, aset *nftables.Set
	if set != nil {
		id = set.ID
		if pl.ids {
			aset = pl.activeSet(t, activeName(s.mapName), b.nextID())
			_ = b.c.AddSet(aset, nil)
			_ = b.c.SetAddElements(aset, pl.activeElems())
		}
		pl.lsets = nil
		for _, l := range pl.limitList() {
			ls := limitSets{limit: l}
			ls.ids = &nftables.Set{Table: t, Name: idsName(s.mapName, l), ID: b.nextID(), KeyType: nftables.TypeMark,
				KeyByteOrder: binaryutil.NativeEndian}
			_ = b.c.AddSet(ls.ids, nil)
			var els []nftables.SetElement
			for _, id := range pl.limits[l] {
				els = append(els, nftables.SetElement{Key: binaryutil.NativeEndian.PutUint32(id)})
			}
			_ = b.c.SetAddElements(ls.ids, els)
			// Idempotent, like the persistence map: counts survive
			// rebuilds of the farm.
			ls.count = &nftables.Set{Table: t, Name: countName(f.Name, l), ID: b.nextID(), KeyType: nftables.TypeMark,
				KeyByteOrder: binaryutil.NativeEndian, Dynamic: true}
			_ = b.c.AddSet(ls.count, nil)
			pl.lsets = append(pl.lsets, ls)
		}
		if pl.persist != "" {
			// Idempotent: an existing map of the same name (same shape)
			// keeps its sessions.
			pset = pl.persistSet(t, f, b.nextID())
			_ = b.c.AddSet(pset, nil)
		}
	}
	rules := pl.farmRules(f, s.mapName, id, modulus, pset, aset)
	if pl.dsrMode {
		rules = pl.dsrFarmRules(f, s.mapName, id, modulus)
	}
	if pl.grouped {
		b.insertGroupRules(pl, f, rules)
		return s
	}
	for _, r := range rules {
		b.c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
	}
	return s
}

// putFarm adds or updates a farm. The farm's chain and backend map are
// rebuilt (O(backends)); service and snat elements are changed only where
// they differ.
func (b *batch) putFarm(old *farmState, f *model.Farm) *farmState {
	pl := b.plan(f)
	if pl == nil {
		b.removeFarm(old)
		return &farmState{}
	}
	var oldPlan *farmPlan
	if old != nil {
		oldPlan = old.plan
	}
	// A grouped farm's rules go first: they use its old maps, deleted
	// below. It stays in its group if it can, so its svc elements stay.
	prefer := -1
	if oldPlan != nil && oldPlan.grouped {
		b.leaveGroup(oldPlan)
		if oldPlan.v6 == pl.v6 {
			prefer = oldPlan.group
		}
	}
	if pl.grouped {
		b.joinGroup(pl, prefer)
	}
	// A farm that enters or leaves mode dsr moves between tables, and one
	// that becomes direct or grouped leaves its chain for a shared one:
	// its old chain goes (after the elements that point to it, below).
	// Shared chains never go here.
	ownChain := oldPlan != nil && !oldPlan.isDirect() && !oldPlan.grouped
	moved := ownChain && oldPlan.chain != pl.chain
	if moved {
		// Its rules use the old maps, deleted below.
		b.c.FlushChain(&nftables.Chain{Table: b.tableOf(oldPlan), Name: oldPlan.chain})
	}
	s := &farmState{plan: pl}
	if !pl.isDirect() {
		s = b.buildFarm(pl, f, ownChain && !moved)
	}
	keep := map[string]bool{pl.persist: true}
	for _, name := range s.sets() {
		keep[name] = true
	}
	for _, name := range old.sets() {
		if !keep[name] {
			b.c.DelSet(&nftables.Set{Table: b.tableOf(oldPlan), Name: name})
		}
	}
	// Removed keys first: a farm that moves a port to another set or
	// changes a key must not collide with itself.
	oldSvc, oldPost, oldDirect := map[string]elem{}, map[string]elem{}, map[string]elem{}
	if oldPlan != nil {
		for _, e := range oldPlan.svc {
			oldSvc[e.id()] = e
		}
		for _, e := range oldPlan.post {
			oldPost[e.id()] = e
		}
		for _, e := range oldPlan.direct {
			oldDirect[e.id()] = e
		}
	}
	b.diffElems(oldPlan, pl, oldSvc, pl.svc, (*farmPlan).svcSet)
	b.diffElems(oldPlan, pl, oldPost, pl.post, (*farmPlan).postSet)
	b.diffElems(oldPlan, pl, oldDirect, pl.direct, (*farmPlan).directSet)
	for _, x := range auxes {
		b.putAux(x, oldPlan, pl, f)
	}
	if oldPlan != nil && oldPlan.helper != "" && oldPlan.helper != pl.helper {
		b.c.DeleteObject(&nftables.NamedObj{Table: b.p.table, Name: oldPlan.helper, Type: nftables.ObjTypeCtHelper})
	}
	if moved {
		b.delChain(&nftables.Chain{Table: b.tableOf(oldPlan), Name: oldPlan.chain})
	}
	return s
}

// aux is a per-farm side chain reached through a static verdict map:
// the filter chain (g-) and the log chain (l-).
type aux struct {
	chain func(*farmPlan) string // "" when the farm needs none
	elems func(*farmPlan) []elem
	set   func(*farmPlan) string
	rules func(b *batch, pl *farmPlan, f *model.Farm) [][]expr.Any // may add objects
}

var auxes = []aux{
	{
		chain: func(p *farmPlan) string { return p.fchain },
		elems: func(p *farmPlan) []elem { return p.filt },
		set:   (*farmPlan).filtSet,
		rules: func(b *batch, pl *farmPlan, f *model.Farm) [][]expr.Any {
			if pl.helper != "" {
				// Idempotent: an object that exists is left as it is
				// (its name says everything about it).
				b.c.AddObj(helperObj(b.p.table, f, pl.helper))
			}
			return filterRules(f, pl.helper)
		},
	},
	{
		chain: func(p *farmPlan) string { return p.rchain },
		elems: func(p *farmPlan) []elem { return p.rev },
		set:   (*farmPlan).revSet,
		rules: func(b *batch, pl *farmPlan, f *model.Farm) [][]expr.Any {
			return stlsReverse(f, pl.stlsPort != 0)
		},
	},
	{
		chain: func(p *farmPlan) string { return p.lchain },
		elems: func(p *farmPlan) []elem { return p.logs },
		set:   (*farmPlan).logSet,
		rules: func(b *batch, pl *farmPlan, f *model.Farm) [][]expr.Any {
			return logRules(f, b.p.opts.LogGroup)
		},
	},
}

// buildAux (re)creates a farm's side chain.
func (b *batch) buildAux(x aux, pl *farmPlan, f *model.Farm, existing bool) {
	ch := &nftables.Chain{Table: b.p.table, Name: x.chain(pl)}
	if existing {
		b.c.FlushChain(ch)
	} else {
		b.c.AddChain(ch)
	}
	for _, r := range x.rules(b, pl, f) {
		b.c.AddRule(&nftables.Rule{Table: b.p.table, Chain: ch, Exprs: r})
	}
}

// putAux updates a farm's side chain and its elements from oldPlan (nil:
// new farm) to pl.
func (b *batch) putAux(x aux, oldPlan, pl *farmPlan, f *model.Farm) {
	had := oldPlan != nil && x.chain(oldPlan) != ""
	want := x.chain(pl) != ""
	old := map[string]elem{}
	if had {
		for _, e := range x.elems(oldPlan) {
			old[e.id()] = e
		}
	}
	if want {
		b.buildAux(x, pl, f, had)
	}
	if had || want {
		var op *farmPlan
		if had {
			op = oldPlan
		}
		b.diffElems(op, pl, old, x.elems(pl), x.set)
	}
	if had && !want {
		ch := &nftables.Chain{Table: b.p.table, Name: x.chain(oldPlan)}
		b.c.FlushChain(ch)
		b.delChain(ch)
	}
}

func (b *batch) diffElems(oldPlan, pl *farmPlan, old map[string]elem, want []elem, set func(*farmPlan) string) {
	sameSet := oldPlan != nil && set(oldPlan) == set(pl)
	var del, add []elem
	keep := map[string]bool{}
	for _, e := range want {
		if o, ok := old[e.id()]; ok && sameSet && o.same(e) {
			keep[e.id()] = true
			continue
		}
		add = append(add, e)
	}
	for id, e := range old {
		if !keep[id] {
			del = append(del, e)
		}
	}
	if oldPlan != nil && len(del) > 0 {
		b.delFrom(set(oldPlan), del)
	}
	b.addTo(set(pl), add)
}

// removeFarm deletes everything a farm has in the kernel.
func (b *batch) removeFarm(old *farmState) {
	if old == nil || old.plan == nil {
		return
	}
	pl := old.plan
	b.delFrom(pl.svcSet(), pl.svc)
	if len(pl.post) > 0 {
		b.delFrom(pl.postSet(), pl.post)
	}
	switch {
	case pl.isDirect():
		b.delElems(b.p.static[pl.directSet()], pl.direct)
	case pl.grouped:
		b.leaveGroup(pl)
	default:
		ch := &nftables.Chain{Table: b.tableOf(pl), Name: pl.chain}
		b.c.FlushChain(ch)
		b.delChain(ch)
	}
	for _, x := range auxes {
		if name := x.chain(pl); name != "" {
			b.delElems(b.p.static[x.set(pl)], x.elems(pl))
			ch := &nftables.Chain{Table: b.p.table, Name: name}
			b.c.FlushChain(ch)
			b.delChain(ch)
		}
	}
	if pl.helper != "" {
		b.c.DeleteObject(&nftables.NamedObj{Table: b.p.table, Name: pl.helper, Type: nftables.ObjTypeCtHelper})
	}
	for _, name := range old.sets() {
		b.c.DelSet(&nftables.Set{Table: b.tableOf(pl), Name: name})
	}
}

// stlsPortProblem: the backends of a stateless farm share one port (the
// rewrite is a constant), and a farm whose backends change the port has
// one virtual port (the reverse rewrite needs to know it); no marks.
func stlsPortProblem(f *model.Farm) bool {
	single := len(f.VirtualPorts) == 1 && f.VirtualPorts[0].First == f.VirtualPorts[0].Last
	for _, b := range f.Backends {
		if b.Port != 0 && !single || b.Mark != 0 || b.EstConnLimit != 0 || b.Port != f.Backends[0].Port {
			return true
		}
	}
	return false
}
