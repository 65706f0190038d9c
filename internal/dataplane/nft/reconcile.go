package nft

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Reconcile implements dataplane.Dataplane: each table is reconciled with
// its farms (shard.reconcile), one batch per table; then the tables of
// another --nft-tables layout are deleted.
func (s *Plane) Reconcile(ctx context.Context, farms []*model.Farm) error {
	byVIP := farms             // the counters count a farm chosen by source table by its VIP
	farms = asMarkFarms(farms) // farms chosen by source table (sourcetable.go)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return errClosed
	}
	// Everything is looked at: what others changed so far is repaired.
	s.watch.takeDirty()
	parts := s.split(farms)
	keep := map[string]bool{}
	for i, p := range s.shards {
		if err := p.reconcile(ctx, parts[i]); err != nil {
			return fmt.Errorf("table inet %s: %w", p.opts.Table, err)
		}
		keep[p.opts.Table] = true
	}
	if err := s.reconcileCounters(byVIP); err != nil {
		return err
	}
	s.watchPassiveAll(farms)
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

// split cuts farms by table (dual farms split: plan.SplitFarms).
func (s *Plane) split(farms []*model.Farm) [][]*model.Farm {
	parts := make([][]*model.Farm, len(s.shards))
	for _, f := range plan.SplitFarms(farms) {
		i := s.shardOf(f.Name)
		parts[i] = append(parts[i], f)
	}
	return parts
}

// reconcile makes the shard's table hold exactly farms (dual farms split:
// plan.SplitFarms). It reads the table from the kernel and, in one batch,
// ensures the static objects, rebuilds every farm's chain and backend map,
// adds missing and removes wrong service and snat elements, and deletes
// chains and sets that belong to no farm. The service maps are never
// flushed, so no farm is missing at any moment; established connections
// keep their conntrack NAT bindings.
func (p *shard) reconcile(ctx context.Context, farms []*model.Farm) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	farms, links, err := resolveLenient(p.log, p.opts.NetNS, farms)
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
	keepChains := map[string]bool{chainPrerouting: true, chainOutput: true, chainPostrouting: true, chainPostSrc: true, chainChecks: true, chainDsr: true, chainL2To: true, chainL2Back: true,
		chainDir4: true, chainDir6: true}
	keepSets, keepHelpers := map[string]bool{}, map[string]bool{}
	for name := range wantElems {
		keepSets[name] = true
	}
	// Group chains are packed afresh: every one in use is emptied and
	// refilled (addGroupChain), those no farm needs are strays.
	b.groups, b.touched = groupCounts{}, map[string]groupRef{}
	hair := map[string]int{}
	for _, f := range farms {
		if _, dup := next[f.Name]; dup {
			return fmt.Errorf("reconcile: farm %q given twice", f.Name)
		}
		pl := b.plan(f)
		if pl == nil {
			next[f.Name] = &farmState{}
			continue
		}
		if pl.grouped() {
			b.joinGroup(pl, -1)
		}
		keepChains[pl.chain] = true
		b.addClientSets(pl, f)
		pl.vchains = b.putVerdictChains(verdictChains(f, pl.logGroup, pl.fchain != ""))
		for _, name := range pl.vchains {
			keepChains[name] = true
		}
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
				wantElems[pl.dstSet][e.id()] = e
			}
		} else {
			s = b.buildFarm(pl, f, k.chains[pl.chain] == b.tableOf(pl))
		}
		for _, name := range s.sets() {
			keepSets[name] = true
		}
		next[f.Name] = s
		for _, e := range pl.svc {
			wantElems[elemSet(pl.svcSet, e)][e.id()] = e
		}
		for _, e := range pl.post {
			wantElems[elemSet(pl.postSet, e)][e.id()] = e
		}
		for _, e := range pl.hair {
			wantElems[hairpinSet(pl.v6)][e.id()] = e
			hair[e.id()]++
		}
		for _, e := range pl.l2back {
			wantElems[pl.l2backSet()][e.id()] = e
		}
		for _, e := range pl.bsnat {
			wantElems[pl.bsnatSet()][e.id()] = e
		}
		for _, e := range pl.nolocal {
			wantElems[pl.noLocalSet()][e.id()] = e
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
		if k.filterPrio != nil && *k.filterPrio != filterPriority {
			// Left by an older version (or by hand) at another priority.
			ch := &nftables.Chain{Table: p.table, Name: chainFilter}
			b.c.FlushChain(ch)
			b.delChain(ch)
		}
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
	p.hair = hair
	p.hooks, p.users = hooks, users
	p.groups, p.ghandles = b.groups, map[string]map[string][]uint64{}
	if err := p.programPostrouting(); err != nil {
		return fmt.Errorf("reconcile postrouting chain: %w", err)
	}
	if err := p.programDSR(); err != nil {
		return fmt.Errorf("reconcile dsr chain: %w", err)
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
	helpers []string // ct helper objects
	// filterPrio is the filter base chain's priority, if it exists.
	filterPrio *nftables.ChainPriority
	elems      map[string]map[string]elem // static set -> id -> element
}

func (p *shard) readKernel() (*kernelState, error) {
	k := &kernelState{chains: map[string]*nftables.Table{}, sets: map[string]*nftables.Table{}, elems: map[string]map[string]elem{}}
	for _, t := range []*nftables.Table{p.table, p.ntable} {
		if err := p.readTable(k, t); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// readTable adds what table t holds to k.
func (p *shard) readTable(k *kernelState, t *nftables.Table) error {
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
			if c.Name == chainFilter && t == p.table && c.Priority != nil {
				prio := *c.Priority
				k.filterPrio = &prio
			}
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
