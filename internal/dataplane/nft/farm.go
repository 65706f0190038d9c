package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// buildFarm (re)creates a farm's chain and a new backend map with a fresh
// name, and points the chain's rules at it. existing says whether the chain
// is already in the kernel (then its rules are flushed in this batch).
func (b *batch) buildFarm(pl *farmPlan, f *model.Farm, existing bool) *farmState {
	t := b.tableOf(pl)
	ch := &nftables.Chain{Table: t, Name: pl.chain}
	switch {
	case pl.grouped(): // the group chain exists (joinGroup)
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
		pl.sset = nil
		if pset != nil && len(pl.static) > 0 {
			pl.sset = pl.staticSet(t, f, staticName(s.mapName), b.nextID())
			_ = b.c.AddSet(pl.sset, nil)
			for i := 0; i < len(pl.static); i += elemChunk {
				_ = b.c.SetAddElements(pl.sset, pl.static[i:min(i+elemChunk, len(pl.static))])
			}
		}
	}
	var rules [][]expr.Any
	switch {
	case pl.dsrMode:
		rules = pl.dsrFarmRules(f, s.mapName, id, modulus)
	case pl.l2:
		// The map of clients' MACs is idempotent (it keeps them across
		// rebuilds); the backends' MACs are a map of this generation.
		learnt := pl.learntSet(t, f, b.nextID())
		_ = b.c.AddSet(learnt, nil)
		var hw *nftables.Set
		if set != nil {
			var els []nftables.SetElement
			hw, els = pl.hwSet(t, hwName(s.mapName), b.nextID())
			_ = b.c.AddSet(hw, els)
		}
		rules = pl.l2FarmRules(f, s.mapName, id, modulus, hw, learnt)
	default:
		rules = pl.farmRules(f, s.mapName, id, modulus, pset, aset)
	}
	if pl.grouped() {
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
	if oldPlan != nil && oldPlan.grouped() {
		b.leaveGroup(oldPlan)
		if oldPlan.v6 == pl.v6 {
			prefer = oldPlan.group
		}
	}
	if pl.grouped() {
		b.joinGroup(pl, prefer)
	}
	// A farm that enters or leaves mode dsr moves between tables, and one
	// that becomes direct or grouped leaves its chain for a shared one:
	// its old chain goes (after the elements that point to it, below).
	// Shared chains never go here.
	ownChain := oldPlan != nil && !oldPlan.isDirect() && !oldPlan.grouped()
	moved := ownChain && oldPlan.chain != pl.chain
	if moved {
		// Its rules use the old maps, deleted below.
		b.c.FlushChain(&nftables.Chain{Table: b.tableOf(oldPlan), Name: oldPlan.chain})
	}
	// Objects the farm's rules refer to come first: its per-client limit
	// sets and verdict chains.
	b.addClientSets(pl, f)
	pl.vchains = b.putVerdictChains(verdictChains(f, pl.logGroup, pl.fchain != ""))
	s := &farmState{plan: pl}
	if !pl.isDirect() {
		s = b.buildFarm(pl, f, ownChain && !moved)
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
	b.diffElems(oldPlan, pl, oldSvc, pl.svc, func(p *farmPlan) string { return p.svcSet })
	b.diffElems(oldPlan, pl, oldPost, pl.post, func(p *farmPlan) string { return p.postSet })
	b.diffElems(oldPlan, pl, oldDirect, pl.direct, func(p *farmPlan) string { return p.dstSet })
	oldBsnat := map[string]elem{}
	if oldPlan != nil {
		for _, e := range oldPlan.bsnat {
			oldBsnat[e.id()] = e
		}
	}
	b.diffElems(oldPlan, pl, oldBsnat, pl.bsnat, (*farmPlan).bsnatSet)
	oldL2Back := map[string]elem{}
	if oldPlan != nil {
		for _, e := range oldPlan.l2back {
			oldL2Back[e.id()] = e
		}
	}
	b.diffElems(oldPlan, pl, oldL2Back, pl.l2back, (*farmPlan).l2backSet)
	oldNoLocal := map[string]elem{}
	if oldPlan != nil {
		for _, e := range oldPlan.nolocal {
			oldNoLocal[e.id()] = e
		}
	}
	b.diffElems(oldPlan, pl, oldNoLocal, pl.nolocal, (*farmPlan).noLocalSet)
	if oldPlan != nil {
		b.hairpin(oldPlan.hair, pl.hair, oldPlan.v6, pl.v6)
	} else {
		b.hairpin(nil, pl.hair, pl.v6, pl.v6)
	}
	for _, x := range auxes {
		b.putAux(x, oldPlan, pl, f)
	}
	if oldPlan != nil && oldPlan.helper != "" && oldPlan.helper != pl.helper {
		b.c.DeleteObject(&nftables.NamedObj{Table: b.p.table, Name: oldPlan.helper, Type: nftables.ObjTypeCtHelper})
	}
	if moved {
		b.delChain(&nftables.Chain{Table: b.tableOf(oldPlan), Name: oldPlan.chain})
	}
	// Last, the old sets and verdict chains the farm no longer uses: the
	// rules that referred to them (farm, filter chains) are rebuilt above.
	keep := map[string]bool{pl.persist: true}
	for _, name := range s.sets() {
		keep[name] = true
	}
	for _, name := range old.sets() {
		if !keep[name] {
			b.c.DelSet(&nftables.Set{Table: b.tableOf(oldPlan), Name: name})
		}
	}
	if oldPlan != nil {
		b.dropVerdictChains(oldPlan.vchains, pl.vchains)
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
			return pl.filterRules(f, pl.helper)
		},
	},
	{
		chain: func(p *farmPlan) string { return p.rchain },
		elems: func(p *farmPlan) []elem { return p.rev },
		set:   (*farmPlan).revSet,
		rules: func(b *batch, pl *farmPlan, f *model.Farm) [][]expr.Any {
			if pl.l2 {
				// Idempotent: the farm's chain adds it too.
				learnt := pl.learntSet(b.p.ntable, f, b.nextID())
				_ = b.c.AddSet(learnt, nil)
				return pl.l2ReplyRules(f, learnt)
			}
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

// buildAux (re)creates a farm's side chain (in the farm's table).
func (b *batch) buildAux(x aux, pl *farmPlan, f *model.Farm, existing bool) {
	t := b.tableOf(pl)
	ch := &nftables.Chain{Table: t, Name: x.chain(pl)}
	if existing {
		b.c.FlushChain(ch)
	} else {
		b.c.AddChain(ch)
	}
	for _, r := range x.rules(b, pl, f) {
		b.c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
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
	// A chain that changes name or table is a new one; the old goes
	// below, after the elements that point to it.
	moved := had && want && (x.chain(oldPlan) != x.chain(pl) || oldPlan.netdev != pl.netdev)
	if want {
		b.buildAux(x, pl, f, had && !moved)
	}
	if had || want {
		var op *farmPlan
		if had {
			op = oldPlan
		}
		b.diffElems(op, pl, old, x.elems(pl), x.set)
	}
	if had && (!want || moved) {
		ch := &nftables.Chain{Table: b.tableOf(oldPlan), Name: x.chain(oldPlan)}
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
	b.hairpin(pl.hair, nil, pl.v6, pl.v6)
	b.delFrom(pl.svcSet, pl.svc)
	if len(pl.post) > 0 {
		b.delFrom(pl.postSet, pl.post)
	}
	if len(pl.l2back) > 0 {
		b.delFrom(pl.l2backSet(), pl.l2back)
	}
	if len(pl.bsnat) > 0 {
		b.delFrom(pl.bsnatSet(), pl.bsnat)
	}
	if len(pl.nolocal) > 0 {
		b.delFrom(pl.noLocalSet(), pl.nolocal)
	}
	switch {
	case pl.isDirect():
		b.delElems(b.p.static[pl.dstSet], pl.direct)
	case pl.grouped():
		b.leaveGroup(pl)
	default:
		ch := &nftables.Chain{Table: b.tableOf(pl), Name: pl.chain}
		b.c.FlushChain(ch)
		b.delChain(ch)
	}
	for _, x := range auxes {
		if name := x.chain(pl); name != "" {
			b.delElems(b.p.static[x.set(pl)], x.elems(pl))
			ch := &nftables.Chain{Table: b.tableOf(pl), Name: name}
			b.c.FlushChain(ch)
			b.delChain(ch)
		}
	}
	if pl.helper != "" {
		b.c.DeleteObject(&nftables.NamedObj{Table: b.p.table, Name: pl.helper, Type: nftables.ObjTypeCtHelper})
	}
	b.dropVerdictChains(pl.vchains, nil)
	for _, name := range old.sets() {
		b.c.DelSet(&nftables.Set{Table: b.tableOf(pl), Name: name})
	}
}
