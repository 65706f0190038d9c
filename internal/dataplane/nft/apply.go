package nft

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
)

// Apply implements dataplane.Dataplane: each changed farm's messages go to
// its table, all in one netlink batch, so the kernel applies all of it or
// none of it. Its cost is in proportion to the changed farms: nothing is
// listed from the kernel.
//
// The path of a farm: the diff is split once (plan.SplitDiff: a dual farm
// is its two halves) and cut by table (shardOf); shard.queue writes each
// change into the batch (putFarm or removeFarm, farm.go), then the batch
// is sent and each shard records what its table now holds (commit).
func (s *Plane) Apply(ctx context.Context, d plan.Diff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The counters take whole farms, a farm chosen by source table by its
	// VIP as any farm (counters.go); the rest, such a farm as a
	// firewall-mark farm of its tag (sourcetable.go).
	byVIP := d
	d = asMarkDiff(d)
	whole := d
	d = plan.SplitDiff(d)
	links, err := resolveDSR(s.opts.NetNS, d.NewFarms())
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return errClosed
	}
	parts := make([]plan.Diff, len(s.shards))
	for _, c := range d.Changes {
		if name := c.Name(); name != "" {
			i := s.shardOf(name)
			parts[i].Changes = append(parts[i].Changes, c)
		}
	}
	nexts := make([]*pending, len(s.shards))
	msgs := 0
	var buildErr error
	for i, part := range parts {
		if len(part.Changes) == 0 {
			continue
		}
		b := s.shards[i].newBatch()
		b.links = links
		nexts[i] = s.shards[i].queue(b, part)
		buildErr = cmp.Or(buildErr, nexts[i].err)
		msgs += b.n
	}
	if buildErr != nil {
		s.redial() // drops the queued messages
		return fmt.Errorf("apply %d farm changes: %w", len(d.Changes), buildErr)
	}
	var ctrNext *ctrPending
	if s.ctr != nil {
		ctrNext = s.ctr.queue(s.conn, byVIP)
	}
	if err := s.conn.Flush(); err != nil {
		s.redial()
		return fmt.Errorf("apply %d farm changes: %w", len(d.Changes), explain(err))
	}
	for i, next := range nexts {
		if next != nil {
			s.shards[i].commit(next)
		}
	}
	if ctrNext != nil {
		s.ctr.commit(ctrNext)
	}
	s.watchPassive(whole)
	s.lastElemMsgs = msgs
	return nil
}

// queue adds the messages of d, a diff whose dual farms are split
// (plan.SplitDiff), to batch b (nothing is sent) and returns the farms'
// states to commit once the batch is in the kernel.
func (p *shard) queue(b *batch, d plan.Diff) *pending {
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
		name := c.Name()
		if name == "" {
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
	b.drain() // Plane.Apply sends the batch
	return &pending{farms: next, users: users, hooks: want, groups: b.groups, touched: b.touched, hair: b.hair, err: b.err}
}

// commit records what a queued batch put in the kernel.
func (p *shard) commit(pd *pending) {
	for name, s := range pd.farms {
		if s == nil {
			delete(p.farms, name)
		} else {
			p.farms[name] = s
		}
	}
	p.hooks, p.users = pd.hooks, pd.users
	p.groups = pd.groups
	p.commitHairpin(pd.hair)
	for ch := range pd.touched {
		delete(p.ghandles, ch)
	}
}

// hookState is which of the table's per-packet base chains exist. The NAT
// chains see only a connection's first packet, but the raw (stateless
// farms) and filter (per-farm filters) chains see every packet, so a table
// has them only while one of its farms needs them: with farms spread over
// many tables, idle ones would otherwise cost every packet a few lookups
// per table.
//
// devs lists (sorted, comma-separated) the devices whose ingress the netdev
// table hooks: the ifaces of its dsr farms, the ifaces and ofaces of its
// stlsdnat farms at ingress.
type hookState struct {
	raw, filter bool
	devs        string
}

// hookUsers counts the farms of the table that need each per-packet base
// chain, so that a change updates it in O(changed farms) rather than by
// scanning every farm of the table.
type hookUsers struct {
	raw, filter int
	devs        map[string]int // device hooked at ingress -> farms
}

// count adds n (1 or -1) users for what s needs.
func (u *hookUsers) count(s *farmState, n int) {
	if s == nil || s.plan == nil {
		return
	}
	if s.plan.stls && !s.plan.l2 { // at ingress: the netdev table
		u.raw += n
	}
	if s.plan.fchain != "" {
		u.filter += n
	}
	if s.plan.dsr != nil {
		if u.devs == nil {
			u.devs = map[string]int{}
		}
		devs := []string{s.plan.dsr.iface}
		if s.plan.l2 && s.plan.dsr.oface != s.plan.dsr.iface {
			devs = append(devs, s.plan.dsr.oface) // the backends' replies
		}
		for _, d := range devs {
			u.devs[d] += n
			if u.devs[d] == 0 {
				delete(u.devs, d)
			}
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
	hair    hairpinDelta
	// err: the batch could not be built (listing a group chain failed);
	// it must not be sent.
	err error
}
