package nft

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// batch collects one netlink transaction.
type batch struct {
	p     *shard
	c     *nftables.Conn
	n     int                 // element messages of static sets queued
	links map[string]*dsrLink // resolved links of the dsr farms, by farm name
	// groups and touched: the group chains' farm counts after this batch,
	// and the group chains it changes (see pending).
	groups  groupCounts
	touched map[string]groupRef
	hair    hairpinDelta // the hairpin counts' change (hairpin.go)
	err     error        // the first error building the batch: it must not be sent
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

// plan is planFarm(f), completed with the farm's resolved links in mode dsr.
func (b *batch) plan(f *model.Farm) *farmPlan {
	pl := planFarm(f)
	if pl != nil {
		pl.logGroup = b.p.opts.LogGroup
	}
	if pl != nil && (pl.dsrMode || pl.l2) {
		l := b.links[f.Name]
		if l == nil {
			// Apply and Reconcile resolve every farm at ingress they
			// are given.
			panic("nft: farm " + f.Name + " at ingress applied without resolved links")
		}
		if pl.l2 {
			pl.setL2(f, l)
		} else {
			pl.setDSR(f, l)
		}
	}
	return pl
}

// tableOf returns the table a farm's chain and maps are in.
func (b *batch) tableOf(pl *farmPlan) *nftables.Table {
	if pl.netdev {
		return b.p.ntable
	}
	return b.p.table
}

func (p *shard) newBatch() *batch { return &batch{p: p, c: p.conn} }

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
	// A connection tagged for a farm chosen by source table whose chain is
	// in another table leaves this one untranslated (sourcetable.go).
	svc := [][]expr.Any{fwmRule(false), fwmRule(true), sourceTaggedRule(), svcExactRule(false), svcExactRule(true), svcRule(false), svcRule(true)}
	base(chainPrerouting, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, svc)
	base(chainOutput, nftables.ChainHookOutput, nftables.ChainPriorityNATDest,
		append([][]expr.Any{noLocalRule(false), noLocalRule(true)}, svc...)) // intraconnect.go
	// The health checks' own connections (marked by their sockets) are
	// not tracked: no conntrack entry, no NAT chains for each check.
	checks := b.c.AddChain(&nftables.Chain{Table: t, Name: chainChecks, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRaw, Policy: &accept})
	b.c.FlushChain(checks)
	b.c.AddRule(&nftables.Rule{Table: t, Chain: checks, Exprs: checksNotrackRule()})
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
	b.c.AddChain(&nftables.Chain{Table: t, Name: chainPostSrc})
	// The netdev table (mode dsr): static maps and the regular chain dsr,
	// whose rules programDSR sends; device chains come and go (syncDevs).
	b.c.AddTable(b.p.ntable)
	for _, s := range netdevSets(b.p.ntable) {
		s.ID = b.nextID()
		b.p.static[s.Name] = s
		_ = b.c.AddSet(s, nil)
	}
	b.c.AddChain(&nftables.Chain{Table: b.p.ntable, Name: chainDsr})
	b.c.AddChain(&nftables.Chain{Table: b.p.ntable, Name: chainL2To})
	b.c.AddChain(&nftables.Chain{Table: b.p.ntable, Name: chainL2Back})
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

// filterPriority is the filter chain's: per-farm filters after conntrack
// (-200) so ct state is known, before dnat (-100) so the VIP is still the
// destination, and after the tables' chain (policyPriority, -110), which
// chooses the farm by source table: a connection steered to another farm
// is labelled before its first packet meets the filters the VIP finds (the
// default farm's queue and helper), and a client a policy drops never
// reaches a farm's limits. It was mangle (-150) before: reconcile replaces
// a chain left at another priority (the kernel cannot change it).
const filterPriority nftables.ChainPriority = -105

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
		prio := filterPriority
		filt := b.c.AddChain(&nftables.Chain{Table: t, Name: chainFilter, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: &prio, Policy: &accept})
		b.c.FlushChain(filt)
		// A connection steered to a farm chosen by source table is not
		// the default farm's whose filters the VIP finds (sourcetable.go).
		b.c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: sourceLabelRule()})
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
