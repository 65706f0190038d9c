package nft

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Tables holds named tables and farms' policies in a table of its own,
// "inet <prefix>-tables", apart from the farms' tables (which change in
// the core's files): the farms' NAT never sees a policy, and a policy's
// kernel objects never touch a farm's.
//
//	chain policy { type filter hook prerouting priority -110
//	    ip daddr . meta l4proto . th dport vmap @fp4    # farms with policies
//	    ip6 daddr . meta l4proto . th dport vmap @fp6
//	    meta mark vmap @fpm }                           # firewall-mark farms
//	chain p-<farm hash> { jump t<id> ... }              # the farm's policies, in priority order
//	chain t<id> {                                       # a deny table, bound to slot S
//	    ip saddr & 255.255.255.0 @s<S>-4-24 drop        # one rule per prefix length present
//	    ip saddr @s<S>-4-32 drop ... }
//	chain t<id> { ... return ...; drop }                # an allow table: match returns, the rest drops
//	set s<S>-4-<len> { type ipv4_addr }                 # the slot's prefixes of one length, masked
//
// Why one hash set per prefix length, not one interval set: nested
// prefixes (10.0.0.0/8 and 10.1.0.0/16 in one table, as ipfw allows) are
// overlapping intervals, which the kernel's interval sets refuse; prefixes
// of one length never overlap, and a masked hash lookup per length present
// is what ipfw's radix lookup amounts to. Adding an entry adds one element.
//
// A swap rebinds two tables to each other's slot: each t<id> chain is
// flushed and given the rules of its new slot's sets (a rule per prefix
// length present), in one batch. No element moves, whatever the sizes.
//
// Only addr tables have kernel objects here: they are the ones farms use
// (policies). Tables of the other types live in the daemon (lookups,
// listings, save and restore) until a farm feature uses them.
type Tables struct {
	log   *slog.Logger
	opts  Options
	conn  *nftables.Conn
	table *nftables.Table
	bases []*nftables.Chain // prerouting, and output with Options.PoliciesOnOutput
	// created: the nft table exists (made on first use, so a daemon
	// without tables adds nothing to the ruleset); baseRules: the base
	// chain has its dispatch rules, only while a farm has policies (a
	// packet pays for them only then).
	created, baseRules bool

	mu     sync.Mutex
	maps   map[string]*nftables.Set // fp4, fp6, fpm
	slots  map[uint32]*slotState    // what the kernel holds, by slot (addr tables)
	others map[uint32]*otherSlot    // the same for the other types (tables_types.go)
	tables map[string]*model.Table  // as applied, by name
	farms  map[string]*model.Farm   // farms with policies as applied
	// srcFarms: farms chosen by source table as applied, srcGroups their
	// keys' chains (sourcetable.go).
	srcFarms  map[string]*model.Farm
	srcGroups map[string]*sourceGroup
	users     map[uint32]map[string]bool // slot -> tables bound to it
	setID     uint32
}

// lenKey is a family (4 or 6) and prefix length.
type lenKey struct {
	fam  uint8
	bits uint8
}

// slotState is one slot's sets and how many entries each holds, and its
// value objects when its table's valtype has mark or limit
// (tables_values.go).
type slotState struct {
	sets  map[lenKey]*nftables.Set
	count map[lenKey]int
	vals  *valueSets
}

// newSlotState is an empty slot for table tb.
func newSlotState(tb *model.Table) *slotState {
	s := &slotState{sets: map[lenKey]*nftables.Set{}, count: map[lenKey]int{}}
	if hasValues(tb) {
		s.vals = newValueSets()
	}
	return s
}

const (
	tablesSuffix   = "-tables"
	policyChain    = "prerouting"
	policyOutChain = "output" // Options.PoliciesOnOutput: the node's own connections
	policyPriority = -110     // after mangle (-150, where users set marks), before dstnat (-100)
	setFP4         = "fp4"
	setFP6         = "fp6"
	setFPM         = "fpm"
	tableElemChunk = 1000 // elements per netlink message (attributes stay under 64 KiB)
)

var (
	_ dataplane.TablePlane         = (*Tables)(nil)
	_ dataplane.TableDescriber     = (*Tables)(nil)
	_ dataplane.TableCounterReader = (*Tables)(nil)
)

// OpenTables connects to nftables in opts.NetNS and makes sure the tables'
// nft table, base chain and maps exist (Reconcile fills them).
func OpenTables(ctx context.Context, log *slog.Logger, opts Options) (*Tables, error) {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	c, err := dialNFT(opts.NetNS)
	if err != nil {
		return nil, err
	}
	t := &Tables{
		log:   log,
		opts:  opts,
		conn:  c,
		table: &nftables.Table{Name: opts.Table + tablesSuffix, Family: nftables.TableFamilyINet},
	}
	t.reset()
	return t, nil
}

// redial replaces the connection after a failed batch (which can leave
// unread acks behind).
func (t *Tables) redial() {
	t.conn.CloseLasting()
	if c, err := dialNFT(t.opts.NetNS); err == nil {
		t.conn = c
	} else {
		t.log.Error("reconnect to nftables failed", "err", err)
	}
}

// committed forgets the batch IDs of the sets a batch made: rules of
// later batches refer to them by name (the kernel refused a lookup that
// carried the ID of a set of an earlier batch, ENODATA).
func (t *Tables) committed() {
	for _, s := range t.maps {
		s.ID = 0
	}
	for _, sl := range t.slots {
		for _, s := range sl.sets {
			s.ID = 0
		}
		if sl.vals != nil {
			for _, s := range sl.vals.sets() {
				s.ID = 0
			}
		}
	}
	for _, o := range t.others {
		for _, s := range o.sets {
			s.ID = 0
		}
	}
}

// ensure queues the nft table and its static objects if not made yet.
func (t *Tables) ensure() {
	if !t.created {
		t.conn.AddTable(t.table)
		t.addStatic()
	}
}

func (t *Tables) reset() {
	t.maps = map[string]*nftables.Set{}
	t.slots = map[uint32]*slotState{}
	t.others = map[uint32]*otherSlot{}
	t.tables = map[string]*model.Table{}
	t.farms = map[string]*model.Farm{}
	t.users = map[uint32]map[string]bool{}
	t.srcFarms = map[string]*model.Farm{}
	t.srcGroups = map[string]*sourceGroup{}
}

// Close releases the netlink connection; the kernel objects stay.
func (t *Tables) Close() error { return t.conn.CloseLasting() }

func (t *Tables) nextID() uint32 {
	t.setID++
	return t.setID
}

// addStatic queues the base chain and the dispatch maps (idempotent:
// existing ones are kept, their elements too). The base chain's rules are
// replaced.
func (t *Tables) addStatic() {
	vmap := func(name string, kt nftables.SetDatatype, interval bool) *nftables.Set {
		return &nftables.Set{Table: t.table, Name: name, IsMap: true, Interval: interval, Concatenation: interval,
			KeyType: kt, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.BigEndian, ID: t.nextID()}
	}
	t.maps[setFP4] = vmap(setFP4, typeSvc4, true)
	t.maps[setFP6] = vmap(setFP6, typeSvc6, true)
	t.maps[setFPM] = vmap(setFPM, nftables.TypeMark, false)
	t.maps[setFPM].KeyByteOrder = binaryutil.NativeEndian
	t.maps[setFS4] = vmap(setFS4, typeSvc4, true)
	t.maps[setFS6] = vmap(setFS6, typeSvc6, true)
	for _, name := range []string{setFP4, setFP6, setFPM, setFS4, setFS6} {
		t.conn.AddSet(t.maps[name], nil)
	}
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriority(policyPriority)
	t.bases = []*nftables.Chain{t.conn.AddChain(&nftables.Chain{Name: policyChain, Table: t.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: &prio, Policy: &accept})}
	if t.opts.PoliciesOnOutput {
		// The node's own connections, before the output hook's dnat
		// (kube-proxy's filter-output-pre-dnat).
		t.bases = append(t.bases, t.conn.AddChain(&nftables.Chain{Name: policyOutChain, Table: t.table, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookOutput, Priority: &prio, Policy: &accept}))
	}
	for _, b := range t.bases {
		t.conn.FlushChain(b)
	}
}

// setBaseRules queues the base chains' dispatch rules, or their removal:
// the policies' (on) and the source tables' (sources).
func (t *Tables) setBaseRules(on, sources bool) {
	for _, b := range t.bases {
		t.conn.FlushChain(b)
		if on {
			for _, v6 := range []bool{false, true} {
				m := t.maps[pick(v6, setFP4, setFP6)]
				t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: b, Exprs: append(svcKeyLoads(v6),
					&expr.Lookup{SourceRegister: reg1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: regVerdict})})
			}
			m := t.maps[setFPM]
			t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: b, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
				&expr.Lookup{SourceRegister: reg1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: regVerdict}}})
		}
		if sources {
			// After the policies: a shared key has none (the engine's
			// rule), so a policy's chain never ends the chain first.
			for _, v6 := range []bool{false, true} {
				t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: b, Exprs: t.sourceBaseRules(v6)})
			}
		}
	}
}

// CheckTable implements dataplane.TablePlane: every table is accepted;
// only addr tables get kernel objects.
func (t *Tables) CheckTable(tb *model.Table) error { return nil }

// CheckPolicies refuses policies on farms whose packets never reach the
// prerouting hook: modes dsr and stlsdnat are forwarded at netdev ingress.
func CheckPolicies(f *model.Farm) error {
	if len(f.Policies) > 0 && (f.Mode == model.ModeDSR || f.Mode == model.ModeStlsDNAT) {
		return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: "policies", Value: f.Policies[0].Name,
			Problem: fmt.Sprintf("the nft data plane enforces policies at prerouting, which mode %s bypasses (it forwards at netdev ingress): use mode snat or dnat, or the ebpf data plane (it checks policies in every mode)", f.Mode)}
	}
	return nil
}

// TableAlgorithm implements dataplane.TableDescriber.
func (t *Tables) TableAlgorithm(tb *model.Table) string {
	if tb.Type != model.TableAddr {
		return fmt.Sprintf("nftables: one hash set per family its keys need (o%d-FAMILY, element counters) in table inet %s", tb.Slot, t.table.Name)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	if s := t.slots[tb.Slot]; s != nil {
		n = len(s.sets)
	}
	return fmt.Sprintf("nftables: %d hash sets (one per family and prefix length present) in table inet %s", n, t.table.Name)
}

func slotSetName(slot uint32, k lenKey) string {
	return "s" + strconv.FormatUint(uint64(slot), 10) + "-" + strconv.Itoa(int(k.fam)) + "-" + strconv.Itoa(int(k.bits))
}

func tableChainName(id uint16) string { return "t" + strconv.Itoa(int(id)) }

func farmPolicyChain(farm string) string {
	s := sha256.Sum256([]byte(farm))
	return "p-" + hex.EncodeToString(s[:hashLen/2])
}

func entryLen(k model.TableKey) (lenKey, []byte) {
	p := k.Prefix()
	fam := uint8(4)
	if p.Addr().Is6() {
		fam = 6
	}
	return lenKey{fam, uint8(p.Bits())}, p.Addr().AsSlice()
}

// batch is one ApplyTables or ReconcileTables transaction being built.
type tablesBatch struct {
	t *Tables
	// rechain: tables whose t<id> chain must be rewritten (binding,
	// verdict, log prefix or the prefix lengths of their slot changed).
	rechain map[string]bool
	// dropSets: sets to delete once no rule refers to them.
	dropSets []*nftables.Set
	slots    map[uint32]*slotState // the slots as the batch leaves them
	others   map[uint32]*otherSlot
	tables   map[string]*model.Table
	users    map[uint32]map[string]bool
}

func (t *Tables) begin() *tablesBatch {
	b := &tablesBatch{t: t, rechain: map[string]bool{}, slots: map[uint32]*slotState{}, others: map[uint32]*otherSlot{},
		tables: map[string]*model.Table{}, users: map[uint32]map[string]bool{}}
	for k, o := range t.others {
		b.others[k] = o.clone()
	}
	for k, v := range t.slots {
		c := &slotState{sets: map[lenKey]*nftables.Set{}, count: map[lenKey]int{}}
		if v.vals != nil {
			c.vals = v.vals.clone()
		}
		for lk, s := range v.sets {
			c.sets[lk] = s
		}
		for lk, n := range v.count {
			c.count[lk] = n
		}
		b.slots[k] = c
	}
	for k, v := range t.tables {
		b.tables[k] = v
	}
	for k, v := range t.users {
		b.users[k] = map[string]bool{}
		for n := range v {
			b.users[k][n] = true
		}
	}
	return b
}

// addEntries queues elements into their length sets, creating sets as
// needed; new lengths make the slot's tables' chains be rewritten.
func (b *tablesBatch) addEntries(slot uint32, entries func(func(model.TableEntry) bool)) {
	s := b.slots[slot]
	groups := map[lenKey][]nftables.SetElement{}
	entries(func(e model.TableEntry) bool {
		lk, key := entryLen(e.Key)
		groups[lk] = append(groups[lk], nftables.SetElement{Key: key})
		return true
	})
	for _, lk := range sortedLens(groups) {
		els := groups[lk]
		set, ok := s.sets[lk]
		if !ok {
			kt := nftables.TypeIPAddr
			if lk.fam == 6 {
				kt = nftables.TypeIP6Addr
			}
			// Counter: every element counts the packets and bytes it
			// matched (the lookup updates it), which TableCounters reads.
			set = &nftables.Set{Table: b.t.table, Name: slotSetName(slot, lk), KeyType: kt, Counter: true, ID: b.t.nextID()}
			b.t.conn.AddSet(set, nil)
			s.sets[lk] = set
			b.rechainSlot(slot)
		}
		chunk := tableElemChunk
		if lk.fam == 6 {
			chunk /= 2
		}
		for len(els) > 0 {
			n := min(chunk, len(els))
			b.t.conn.SetAddElements(set, els[:n])
			els = els[n:]
		}
		s.count[lk] += len(groups[lk])
	}
}

// delEntries queues the removal of elements; a length whose last entry
// goes has its set dropped (after the chains stop referring to it).
func (b *tablesBatch) delEntries(slot uint32, entries []model.TableEntry) {
	s := b.slots[slot]
	groups := map[lenKey][]nftables.SetElement{}
	for _, e := range entries {
		lk, key := entryLen(e.Key)
		groups[lk] = append(groups[lk], nftables.SetElement{Key: key})
	}
	for _, lk := range sortedLens(groups) {
		set, ok := s.sets[lk]
		if !ok {
			continue
		}
		s.count[lk] -= len(groups[lk])
		if s.count[lk] <= 0 {
			delete(s.sets, lk)
			delete(s.count, lk)
			b.dropSets = append(b.dropSets, set)
			b.rechainSlot(slot)
			continue
		}
		els := groups[lk]
		for len(els) > 0 {
			n := min(tableElemChunk/2, len(els))
			b.t.conn.SetDeleteElements(set, els[:n])
			els = els[n:]
		}
	}
}

func (b *tablesBatch) rechainSlot(slot uint32) {
	for name := range b.users[slot] {
		b.rechain[name] = true
	}
}

func sortedLens[V any](m map[lenKey]V) []lenKey {
	out := make([]lenKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b lenKey) int {
		if c := cmp.Compare(a.fam, b.fam); c != 0 {
			return c
		}
		return cmp.Compare(b.bits, a.bits) // longest first
	})
	return out
}

// bind records that table tb (nil: none) now uses its slot.
func (b *tablesBatch) bind(old, nw *model.Table) {
	if old != nil {
		delete(b.users[old.Slot], old.Name)
		delete(b.tables, old.Name)
	}
	if nw != nil {
		if b.users[nw.Slot] == nil {
			b.users[nw.Slot] = map[string]bool{}
		}
		b.users[nw.Slot][nw.Name] = true
		b.tables[nw.Name] = nw
	}
}

// tableRules are the rules of a policy table's chain t<id>.
func (b *tablesBatch) tableRules(tb *model.Table) [][]expr.Any {
	var logx []expr.Any
	if tb.LogPrefix != "" {
		logx = []expr.Any{logExpr(tb.LogPrefix, b.t.opts.LogGroup)}
	}
	if tb.Type != model.TableAddr {
		if o := b.others[tb.Slot]; o != nil && tb.IsPolicy() {
			return o.otherRules(tb, logx)
		}
		return nil
	}
	s := b.slots[tb.Slot]
	if s == nil || !tb.Attachable() {
		return nil
	}
	verdict := expr.VerdictDrop
	if tb.Verdict != model.ListDeny {
		verdict = expr.VerdictReturn // allow, or values only: the most specific entry ends the table
	}
	var rules [][]expr.Any
	for _, lk := range sortedLens(s.sets) {
		set := s.sets[lk]
		r := saddrMatch(lk)
		if verdict == expr.VerdictReturn {
			rules = append(rules, valueRules(s.vals, lk, r)...)
		}
		r = append(slices.Clone(r), &expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID})
		if verdict == expr.VerdictDrop {
			r = append(r, logx...)
		}
		rules = append(rules, append(r, &expr.Verdict{Kind: verdict}))
	}
	if tb.Verdict == model.ListAllow {
		rules = append(rules, append(slices.Clone(logx), &expr.Verdict{Kind: expr.VerdictDrop}))
	}
	return rules
}

// saddrMatch loads the client's address of family and prefix length lk,
// masked to the length, into reg1: what a slot's set of that length is
// looked up with (policies and source tables alike).
func saddrMatch(lk lenKey) []expr.Any {
	v6 := lk.fam == 6
	off, alen := uint32(12), uint32(4)
	if v6 {
		off, alen = 8, 16
	}
	r := append(nfproto(v6), &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen})
	if int(lk.bits) < int(alen)*8 {
		mask := make([]byte, alen)
		for i := 0; i < int(lk.bits); i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		r = append(r, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: alen, Mask: mask, Xor: make([]byte, alen)})
	}
	return r
}

func (b *tablesBatch) chain(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: b.t.table}
}

// writeTableChain creates or rewrites t<id> (flush and add, one batch).
func (b *tablesBatch) writeTableChain(tb *model.Table) {
	c := b.t.conn.AddChain(b.chain(tableChainName(tb.ID)))
	b.t.conn.FlushChain(c)
	for _, r := range b.tableRules(tb) {
		b.t.conn.AddRule(&nftables.Rule{Table: b.t.table, Chain: c, Exprs: r})
	}
}

// farmKeys are the dispatch map elements of a farm: its listeners'
// addresses, protocols and port ranges (model.Farm.Listeners), or its mark.
func farmKeys(f *model.Farm, chain string) (v4, v6, marks []nftables.SetElement) {
	verdict := &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}
	if f.IsMarkFarm() {
		return nil, nil, []nftables.SetElement{{Key: binaryutil.NativeEndian.PutUint32(f.Mark), VerdictData: verdict}}
	}
	for _, l := range f.Listeners() {
		for _, e := range listenerElems(nil, l.Addr, l.Protocol, l.Ports, "", nil) {
			se := nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd, VerdictData: verdict}
			if l.Addr.Is4() {
				v4 = append(v4, se)
			} else {
				v6 = append(v6, se)
			}
		}
	}
	return v4, v6, marks
}

// policyOrder is a farm's policies in the order they are checked.
func (b *tablesBatch) policyOrder(f *model.Farm) []*model.Table {
	return plan.PolicyOrder(f, b.tables)
}

func (b *tablesBatch) farmElems(f *model.Farm, del bool) {
	v4, v6, marks := farmKeys(f, farmPolicyChain(f.Name))
	for name, els := range map[string][]nftables.SetElement{setFP4: v4, setFP6: v6, setFPM: marks} {
		if len(els) == 0 {
			continue
		}
		if del {
			b.t.conn.SetDeleteElements(b.t.maps[name], els)
		} else {
			b.t.conn.SetAddElements(b.t.maps[name], els)
		}
	}
}

// writeFarm creates or rewrites a farm's policy chain.
func (b *tablesBatch) writeFarm(f *model.Farm) {
	c := b.t.conn.AddChain(b.chain(farmPolicyChain(f.Name)))
	b.t.conn.FlushChain(c)
	for _, tb := range b.policyOrder(f) {
		b.t.conn.AddRule(&nftables.Rule{Table: b.t.table, Chain: c, Exprs: []expr.Any{
			&expr.Verdict{Kind: expr.VerdictJump, Chain: tableChainName(tb.ID)}}})
	}
}

// ApplyTables implements dataplane.TablePlane: one netlink batch.
func (t *Tables) ApplyTables(ctx context.Context, d plan.TableDiff) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	srcFarms := maps.Clone(t.srcFarms)
	for _, c := range d.Farms {
		if c.Old != nil && c.Old.SourceTable != "" {
			delete(srcFarms, c.Old.Name)
		}
		if c.New != nil && c.New.SourceTable != "" {
			srcFarms[c.New.Name] = c.New
		}
	}
	if err := sourceMarksFree(srcFarms); err != nil {
		return err // before anything is queued
	}
	t.ensure()
	b := t.begin()
	// dropChains: the farms' policy chains go before the table chains
	// they jump to (dropTables), or the kernel refuses to delete a chain
	// still referenced (EBUSY) when one change detaches a table from its
	// last farm and destroys it.
	var dropChains, dropTables []string
	// Slots: new ones get their entries, freed ones lose their sets,
	// changed ones get the difference.
	for _, c := range d.Slots {
		switch {
		case c.Old == nil && c.New != nil:
			if c.New.Type != model.TableAddr {
				o := newOtherSlot(c.New)
				b.others[c.Slot] = o
				b.otherEntries(c.Slot, o, allEntries(c.New), false)
				continue
			}
			b.slots[c.Slot] = newSlotState(c.New)
			b.addEntries(c.Slot, func(fn func(model.TableEntry) bool) { c.New.Entries("", fn) })
			b.addValues(c.Slot, c.New)
		case c.New == nil && c.Old != nil:
			if o := b.others[c.Slot]; o != nil {
				for _, s := range o.sets {
					b.dropSets = append(b.dropSets, s)
				}
				delete(b.others, c.Slot)
			}
			if s := b.slots[c.Slot]; s != nil {
				for _, lk := range sortedLens(s.sets) {
					b.dropSets = append(b.dropSets, s.sets[lk])
				}
				if s.vals != nil {
					b.dropSets = append(b.dropSets, s.vals.sets()...)
				}
				delete(b.slots, c.Slot)
			}
		default:
			if o := b.others[c.Slot]; o != nil {
				added := c.Added()
				grew := b.otherEntries(c.Slot, o, added, false)
				if shrank := b.otherEntries(c.Slot, o, c.Del, true); grew || shrank {
					b.rechainSlot(c.Slot)
				}
				continue
			}
			if b.slots[c.Slot] == nil {
				continue
			}
			// A value change (Replaced) changes no element of the
			// length sets, only value objects. Adds go first, so a
			// length that loses its last entry and gains another in
			// one change keeps its set.
			replaced := make(map[model.TableKey]bool, len(c.Replaced))
			for _, e := range c.Replaced {
				replaced[e.Key] = true
			}
			b.addEntries(c.Slot, func(fn func(model.TableEntry) bool) {
				for _, e := range c.Put {
					if !replaced[e.Key] && !fn(e) {
						return
					}
				}
			})
			b.delEntries(c.Slot, c.Del)
			if s := b.slots[c.Slot]; s.vals != nil {
				dels := append(append([]model.TableEntry(nil), c.Del...), c.Replaced...)
				if b.valueChange(c.Slot, s.vals, dels, c.Put) {
					b.rechainSlot(c.Slot)
				}
			}
		}
	}
	for _, c := range d.Tables {
		b.bind(c.Old, c.New)
		switch {
		case c.New == nil:
			dropTables = append(dropTables, tableChainName(c.Old.ID))
		default:
			b.rechain[c.New.Name] = true
		}
	}
	for name := range b.rechain {
		if tb, ok := b.tables[name]; ok {
			b.writeTableChain(tb)
		}
	}
	// Farms: old elements and chains out, new in. A farm whose tables'
	// order changed (priority) is rewritten too.
	farms := maps.Clone(t.farms)
	for _, c := range d.Farms {
		if c.Old != nil && len(c.Old.Policies) > 0 {
			b.farmElems(c.Old, true)
			delete(farms, c.Old.Name)
			if c.New == nil || len(c.New.Policies) == 0 {
				dropChains = append(dropChains, farmPolicyChain(c.Old.Name))
			}
		}
		if c.New != nil && len(c.New.Policies) > 0 {
			b.writeFarm(c.New)
			b.farmElems(c.New, false)
			farms[c.New.Name] = c.New
		}
	}
	for _, c := range d.Tables {
		if c.Old != nil && c.New != nil && c.Old.Priority != c.New.Priority {
			for _, f := range farms {
				if f.UsesPolicy(c.New.Name) {
					b.writeFarm(f)
				}
			}
		}
	}
	// Farms chosen by source table: their keys' chains rewritten (their
	// tables' sets or order may have changed), elements of new and gone
	// keys.
	srcGroups := t.srcGroups
	if len(srcFarms) > 0 || len(t.srcFarms) > 0 {
		var drop []string
		srcGroups, drop = b.writeSources(t.srcGroups, srcFarms)
		dropChains = append(dropChains, drop...)
	}
	for _, name := range append(dropChains, dropTables...) {
		ch := b.chain(name)
		b.t.conn.FlushChain(ch)
		b.t.conn.DelChain(ch)
	}
	for _, s := range b.dropSets {
		t.conn.DelSet(s)
	}
	on, sources := len(farms) > 0, len(srcFarms) > 0
	if on != t.baseRules || sources != (len(t.srcFarms) > 0) || !t.created {
		t.setBaseRules(on, sources)
	}
	if err := t.conn.Flush(); err != nil {
		t.redial()
		return fmt.Errorf("apply tables to table inet %s: %w", t.table.Name, err)
	}
	t.slots, t.others, t.tables, t.users, t.farms = b.slots, b.others, b.tables, b.users, farms
	t.srcFarms, t.srcGroups = srcFarms, srcGroups
	t.created, t.baseRules = true, len(farms) > 0
	t.committed()
	return nil
}

// ReconcileTables implements dataplane.TablePlane. It rebuilds the whole
// nft table in one batch (delete it and make it again): the kernel swaps
// the old ruleset for the new at commit, so filtering never stops, and
// whatever was changed by hand is repaired. It costs O(entries).
func (t *Tables) ReconcileTables(ctx context.Context, tables []*model.Table, farms []*model.Farm) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// "add table; delete table": the delete never fails for want of the
	// table, and whatever was there goes.
	t.conn.AddTable(t.table)
	t.conn.DelTable(t.table)
	t.reset()
	t.created, t.baseRules = false, false
	if len(tables) == 0 && len(farms) == 0 {
		if err := t.conn.Flush(); err != nil {
			t.redial()
			return fmt.Errorf("remove table inet %s: %w", t.table.Name, err)
		}
		return nil
	}
	t.conn.AddTable(t.table)
	t.addStatic()
	b := t.begin()
	for _, tb := range tables {
		b.bind(nil, tb)
		if tb.Type != model.TableAddr {
			o := newOtherSlot(tb)
			b.others[tb.Slot] = o
			b.otherEntries(tb.Slot, o, allEntries(tb), false)
			continue
		}
		b.slots[tb.Slot] = newSlotState(tb)
		b.addEntries(tb.Slot, func(fn func(model.TableEntry) bool) { tb.Entries("", fn) })
		b.addValues(tb.Slot, tb)
	}
	for _, tb := range tables {
		b.writeTableChain(tb)
	}
	fs, srcFarms := map[string]*model.Farm{}, map[string]*model.Farm{}
	for _, f := range farms {
		if f.SourceTable != "" {
			srcFarms[f.Name] = f
		}
		if len(f.Policies) == 0 {
			continue
		}
		b.writeFarm(f)
		b.farmElems(f, false)
		fs[f.Name] = f
	}
	srcGroups, _ := b.writeSources(nil, srcFarms)
	t.setBaseRules(len(fs) > 0, len(srcFarms) > 0)
	if err := t.conn.Flush(); err != nil {
		t.reset()
		t.redial()
		return fmt.Errorf("rebuild table inet %s: %w", t.table.Name, err)
	}
	t.slots, t.others, t.tables, t.users, t.farms = b.slots, b.others, b.tables, b.users, fs
	t.srcFarms, t.srcGroups = srcFarms, srcGroups
	t.created, t.baseRules = true, len(fs) > 0
	t.committed()
	return nil
}

// TableCounters implements dataplane.TableCounterReader: the packets and
// bytes (IP bytes, as the eBPF plane counts) each entry of an addr table
// matched, read from its slot's sets' element counters. Entries that never
// matched are left out.
func (t *Tables) TableCounters(ctx context.Context, tb *model.Table) (dataplane.TableCounters, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := dataplane.TableCounters{}
	if o := t.others[tb.Slot]; o != nil && tb.Type != model.TableAddr {
		if err := t.otherCounters(o, out); err != nil {
			return nil, fmt.Errorf("table %q: read counters: %w", tb.Name, err)
		}
		return out, ctx.Err()
	}
	s := t.slots[tb.Slot]
	if tb.Type != model.TableAddr || s == nil {
		return out, ctx.Err()
	}
	for _, lk := range sortedLens(s.sets) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		els, err := t.conn.GetSetElements(s.sets[lk])
		if err != nil {
			t.redial()
			return nil, fmt.Errorf("table %q: read counters of set %s: %w", tb.Name, s.sets[lk].Name, err)
		}
		for _, el := range els {
			if el.Counter == nil || el.Counter.Packets == 0 {
				continue
			}
			a, ok := netip.AddrFromSlice(el.Key)
			if !ok {
				continue
			}
			out[model.AddrKey(netip.PrefixFrom(a, int(lk.bits)))] = dataplane.EntryCounters{Packets: el.Counter.Packets, Bytes: el.Counter.Bytes}
		}
	}
	return out, nil
}

// addValues queues the value objects of every entry of a new slot.
func (b *tablesBatch) addValues(slot uint32, tb *model.Table) {
	s := b.slots[slot]
	if s.vals == nil {
		return
	}
	var all []model.TableEntry
	tb.Entries("", func(e model.TableEntry) bool {
		if e.Value != nil && (e.Value.Mark != 0 || e.Value.Limit != 0 || e.Value.DSCP != 0) {
			all = append(all, e)
		}
		return true
	})
	if b.valueChange(slot, s.vals, nil, all) {
		b.rechainSlot(slot)
	}
}

// allEntries lists a table's entries.
func allEntries(tb *model.Table) []model.TableEntry {
	out := make([]model.TableEntry, 0, tb.Len())
	tb.Entries("", func(e model.TableEntry) bool { out = append(out, e); return true })
	return out
}
