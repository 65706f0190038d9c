package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Named tables in the eBPF plane (bpf/xlb_tables.h). Each slot of an addr
// table is two LPM tries, one per address family, made here and held at
// the slot's index in xlb_tbl_addr4/6 (arrays of maps, pinned; the tries
// are not pinned themselves). A table id is bound to its slot's index by
// its entry in xlb_tbl_meta (with its verdict): a swap rewrites two such
// entries in one batch, whatever the sizes, and each table goes from its
// old entries to its new ones at once.
//
// Why the ids are not keys of the arrays of maps themselves: the kernel
// waits for an RCU grace period after every update of an array of maps
// (maybe_wait_bpf_programs), 8-10 ms on this VM, so a swap written there
// took 35-45 ms; a plain array takes microseconds. Making or freeing a
// slot (creating or destroying a table) still pays that wait, twice.
//
// Farms' policies are keyed by the farm's service keys in xlb_tbl_policy.
//
// Only addr tables have kernel objects: they are what farms use. Tables of
// the other types live in the daemon (lookups, listings, save and restore).

var (
	_ dataplane.TablePlane         = (*Plane)(nil)
	_ dataplane.TableDescriber     = (*Plane)(nil)
	_ dataplane.TableCounterReader = (*Plane)(nil)
)

// Sizes from bpf/xlb_tables.h.
const (
	maxTables       = uint32(xlbXlbTblSizeXLB_TBL_SIZE_TABLES)
	maxFarmPolicies = int(xlbXlbTblSizeXLB_TBL_SIZE_FARM_POLICIES)

	tblNone        = uint32(xlbXlbTblVerdictXLB_TBL_NONE)
	tblDeny        = uint32(xlbXlbTblVerdictXLB_TBL_DENY)
	tblAllow       = uint32(xlbXlbTblVerdictXLB_TBL_ALLOW)
	tblVerdictMask = uint32(xlbXlbTblVerdictXLB_TBL_VERDICT_MASK)
	tblFLog        = uint32(xlbXlbTblVerdictXLB_TBL_F_LOG)
	tblFLimit      = uint32(xlbXlbTblVerdictXLB_TBL_F_LIMIT)
	tblFMark       = uint32(xlbXlbTblVerdictXLB_TBL_F_MARK)
	tblFDSCP       = uint32(xlbXlbTblVerdictXLB_TBL_F_DSCP)

	tblConfPort    = uint32(xlbXlbTblConfFlagXLB_TBL_CONF_PORT)
	tblConfAnyPort = uint32(xlbXlbTblConfFlagXLB_TBL_CONF_ANYPORT)
	tblGenShift    = uint32(xlbXlbTblConfFlagXLB_TBL_GEN_SHIFT)
	tblGenMax      = uint32(xlbXlbTblConfFlagXLB_TBL_GEN_MAX)
	tblRefsShift   = uint32(xlbXlbTblConfFlagXLB_TBL_REFS_SHIFT)
	tblRefsMax     = uint32(xlbXlbTblConfFlagXLB_TBL_REFS_MAX)

	// tblChunk bounds the entries of one batch syscall (and the buffers
	// built for it).
	tblChunk = 65536
)

// tableState is what the plane has applied of tables.
type tableState struct {
	// inner4, inner6: the tries' template (the outer maps' inner map
	// spec), from the loaded collection.
	inner4, inner6 *ebpf.MapSpec
	// innerH: the hashes' template (xlb_tbl_hash's inner map).
	innerH *ebpf.MapSpec
	slots  map[uint32]*tblSlot // by slot (the engine's number)
	// hslots: the slots of number, mac and flow tables (tables_hash.go).
	hslots map[uint32]*hSlot
	// idx allocates slot indices (1 to maxTables-1) in xlb_tbl_addr4/6.
	idx    idxAlloc
	tables map[string]*model.Table    // as applied, by name
	byID   map[uint16]*model.Table    // the same, by id (the drop log names the table)
	farms  map[string]*model.Farm     // farms with policies, as applied
	keys   map[xlbSvcKey]string       // policy key -> farm
	vals   map[xlbSvcKey]xlbTblPolicy // policy key -> its value, as written
	// noBatch: the kernel refused batch updates of a trie once; entries
	// go one by one from then on.
	noBatch bool
	// gen is the policy generation (xlb_tbl_conf, tbl_check in
	// bpf/xlb_tables.h): 1-127, moved on after every change; 0 while
	// tracked flows' cached passes are not to be trusted.
	gen uint32
	// refs is the refs generation (xlb_tbl_conf): services' values
	// carry their farm's policy ids stamped with it (svcValue), and the
	// program trusts them only under the current one; 0: none trusted.
	refs uint32
}

func (t *tableState) reset() {
	t.slots = map[uint32]*tblSlot{}
	t.hslots = map[uint32]*hSlot{}
	t.idx = idxAlloc{next: 1}
	t.tables = map[string]*model.Table{}
	t.byID = map[uint16]*model.Table{}
	t.farms = map[string]*model.Farm{}
	t.keys = map[xlbSvcKey]string{}
	t.vals = map[xlbSvcKey]xlbTblPolicy{}
}

// tblSlot is one slot's tries and their index in the arrays of maps.
type tblSlot struct {
	idx    uint32
	v4, v6 *ebpf.Map
}

// idxAlloc hands out slot indices; a freed one is reused.
type idxAlloc struct {
	next uint32
	free []uint32
}

func (a *idxAlloc) get() (uint32, error) {
	if n := len(a.free); n > 0 {
		i := a.free[n-1]
		a.free = a.free[:n-1]
		return i, nil
	}
	if a.next >= maxTables {
		return 0, fmt.Errorf("all %d slot indices of xlb_tbl_addr4/6 are in use", maxTables-1)
	}
	a.next++
	return a.next - 1, nil
}

func (a *idxAlloc) put(i uint32) { a.free = append(a.free, i) }

func (s *tblSlot) close() {
	if s.v4 != nil {
		s.v4.Close()
	}
	if s.v6 != nil {
		s.v6.Close()
	}
}

func trieName(slot uint32, v6 bool) string {
	if v6 {
		return fmt.Sprintf("xt6_%d", slot)
	}
	return fmt.Sprintf("xt4_%d", slot)
}

// newSlot makes a slot's two empty tries and puts them at a free index of
// the arrays of maps (nothing refers to the index yet).
func (p *Plane) newSlot(slot uint32) (*tblSlot, error) {
	s := &tblSlot{}
	for _, v6 := range []bool{false, true} {
		spec := p.tbls.inner4.Copy()
		if v6 {
			spec = p.tbls.inner6.Copy()
		}
		spec.Name = trieName(slot, v6)
		m, err := ebpf.NewMap(spec)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("make trie %s: %w", spec.Name, err)
		}
		if v6 {
			s.v6 = m
		} else {
			s.v4 = m
		}
	}
	idx, err := p.tbls.idx.get()
	if err != nil {
		s.close()
		return nil, err
	}
	s.idx = idx
	if err := p.placeSlot(s); err != nil {
		p.freeSlot(s)
		return nil, err
	}
	return s, nil
}

// placeSlot puts a slot's tries at its index.
func (p *Plane) placeSlot(s *tblSlot) error {
	if err := p.objs.XlbTblAddr4.Update(s.idx, s.v4, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("put trie at slot index %d: %w", s.idx, err)
	}
	if err := p.objs.XlbTblAddr6.Update(s.idx, s.v6, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("put trie at slot index %d: %w", s.idx, err)
	}
	return nil
}

// freeSlot takes a slot's tries out of the arrays of maps (the kernel frees
// them with the last reference) and releases its index.
func (p *Plane) freeSlot(s *tblSlot) {
	for _, m := range []*ebpf.Map{p.objs.XlbTblAddr4, p.objs.XlbTblAddr6} {
		if err := m.Delete(s.idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			p.log.Error("free table slot", "index", s.idx, "err", err)
		}
	}
	s.close()
	if s.idx != 0 {
		p.tbls.idx.put(s.idx)
	}
}

// CheckTable implements dataplane.TablePlane: every table is accepted.
func (p *Plane) CheckTable(t *model.Table) error { return nil }

// checkTableUse refuses a farm's use of a table the program cannot honour:
// a table whose values set marks on a stlsdnat farm (the mark of a flow is
// kept in its conntrack entry, and stlsdnat has none). A table's DSCP is
// honoured in every mode: a flow keeps it in its conntrack entry, and a
// stlsdnat packet takes it from its own policy check (tbl_one, every such
// packet is checked).
func checkTableUse(f *model.Farm, t *model.Table) error {
	if t.Type == model.TableAddr && t.Values&model.ValMark != 0 && f.Mode == model.ModeStlsDNAT {
		return dataplane.Refuse(f, "policies", t.Name,
			fmt.Sprintf("table %q sets marks (valtype %s), and the ebpf data plane keeps a flow's mark in its conntrack entry, which stlsdnat has not: use dnat, or a table without mark", t.Name, t.Values))
	}
	return nil
}

// checkPolicies refuses more policies than the program checks.
func checkPolicies(f *model.Farm) error {
	if len(f.Policies) > maxFarmPolicies {
		return dataplane.Refuse(f, "policies", fmt.Sprint(len(f.Policies), " policies"),
			fmt.Sprintf("the ebpf data plane checks at most %d policies per farm", maxFarmPolicies))
	}
	return nil
}

// TableAlgorithm implements dataplane.TableDescriber.
func (p *Plane) TableAlgorithm(t *model.Table) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case hasHash(t):
		idx := uint32(0)
		if s := p.tbls.hslots[t.Slot]; s != nil {
			idx = s.idx
		}
		return fmt.Sprintf("eBPF: hash %s (not preallocated) at index %d of xlb_tbl_hash (array of maps), bound to id %d in xlb_tbl_meta, in %s",
			hashName(t.Slot), idx, t.ID, p.opts.PinPath)
	}
	idx := uint32(0)
	if s := p.tbls.slots[t.Slot]; s != nil {
		idx = s.idx
	}
	return fmt.Sprintf("eBPF: LPM tries %s and %s (not preallocated) at index %d of xlb_tbl_addr4/6 (arrays of maps), bound to id %d in xlb_tbl_meta, in %s",
		trieName(t.Slot, false), trieName(t.Slot, true), idx, t.ID, p.opts.PinPath)
}

// trieKey is an addr entry's key for its family's trie.
func trieKey(k model.TableKey) (any, bool) {
	pfx := k.Prefix()
	a := pfx.Addr()
	if a.Is4() {
		return xlbTblKey4{Prefixlen: uint32(pfx.Bits()), Addr: ne32(a)}, false
	}
	return xlbTblKey6{Prefixlen: uint32(pfx.Bits()), Addr: addrWords(a)}, true
}

func tblValue(v *model.TableValue) xlbTblVal {
	if v == nil {
		return xlbTblVal{}
	}
	return xlbTblVal{Mark: v.Mark, Limit: v.Limit, Dscp: v.DSCP}
}

func key4Prefix(k xlbTblKey4) netip.Prefix {
	a := wordsAddr([4]uint32{k.Addr}, afInet)
	return netip.PrefixFrom(a, int(k.Prefixlen))
}

func key6Prefix(k xlbTblKey6) netip.Prefix {
	return netip.PrefixFrom(wordsAddr(k.Addr, afInet6), int(k.Prefixlen))
}

// putEntries writes entries into a slot's tries (new keys, or values over
// existing ones, keeping their counters when keep is set).
func (p *Plane) putEntries(s *tblSlot, entries func(func(model.TableEntry) bool), keep bool) error {
	var k4 []xlbTblKey4
	var v4 []xlbTblVal
	var k6 []xlbTblKey6
	var v6 []xlbTblVal
	flush := func() error {
		if len(k4) > 0 {
			if err := p.batchPut(s.v4, k4, v4, keep); err != nil {
				return err
			}
		}
		if len(k6) > 0 {
			if err := p.batchPut(s.v6, k6, v6, keep); err != nil {
				return err
			}
		}
		k4, v4, k6, v6 = k4[:0], v4[:0], k6[:0], v6[:0]
		return nil
	}
	var err error
	entries(func(e model.TableEntry) bool {
		k, is6 := trieKey(e.Key)
		if is6 {
			k6 = append(k6, k.(xlbTblKey6))
			v6 = append(v6, tblValue(e.Value))
		} else {
			k4 = append(k4, k.(xlbTblKey4))
			v4 = append(v4, tblValue(e.Value))
		}
		if len(k4)+len(k6) >= tblChunk {
			err = flush()
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// batchPut writes keys and values into a trie: in batches where the
// kernel takes them, one by one otherwise. keep: values replace existing
// ones with their counters kept.
func (p *Plane) batchPut(m *ebpf.Map, keys any, vals []xlbTblVal, keep bool) error {
	n := len(vals)
	one := func(i int) any {
		switch ks := keys.(type) {
		case []xlbTblKey4:
			return ks[i]
		case []xlbTblKey6:
			return ks[i]
		}
		return nil
	}
	if keep {
		for i := range vals {
			var old xlbTblVal
			if err := m.Lookup(one(i), &old); err == nil {
				vals[i].Packets, vals[i].Bytes = old.Packets, old.Bytes
			}
		}
	}
	if !p.tbls.noBatch {
		_, err := m.BatchUpdate(keys, vals, nil)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("write %d entries into trie: %w", n, err)
		}
		p.tbls.noBatch = true
	}
	for i := range vals {
		if err := m.Update(one(i), vals[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write entry into trie: %w", err)
		}
	}
	return nil
}

// delEntries removes entries from a slot's tries, in batches where the
// kernel takes them. Missing entries are no error (a hand edit may have
// removed them): a batch that stops at one goes on one by one.
func (p *Plane) delEntries(s *tblSlot, entries []model.TableEntry) error {
	var k4 []xlbTblKey4
	var k6 []xlbTblKey6
	for _, e := range entries {
		k, is6 := trieKey(e.Key)
		if is6 {
			k6 = append(k6, k.(xlbTblKey6))
		} else {
			k4 = append(k4, k.(xlbTblKey4))
		}
	}
	if err := batchDel(s.v4, k4, &p.tbls.noBatch); err != nil {
		return err
	}
	return batchDel(s.v6, k6, &p.tbls.noBatch)
}

func batchDel[K any](m *ebpf.Map, keys []K, noBatch *bool) error {
	for len(keys) > 0 {
		n := min(len(keys), tblChunk)
		chunk := keys[:n]
		keys = keys[n:]
		if !*noBatch {
			done, err := m.BatchDelete(chunk, nil)
			if err == nil {
				continue
			}
			if errors.Is(err, ebpf.ErrNotSupported) {
				*noBatch = true
			} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete %d entries from trie: %w", n, err)
			}
			chunk = chunk[min(done, len(chunk)):]
		}
		for _, k := range chunk {
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete entry from trie: %w", err)
			}
		}
	}
	return nil
}

// bind points table ids at their slots, with their verdicts, in one batch
// (a swap's two tables at once). binds are parallel to ids.
func (p *Plane) bind(ids []uint32, binds []xlbTblBind) error {
	if len(ids) == 0 {
		return nil
	}
	if !p.tbls.noBatch {
		_, err := p.objs.XlbTblMeta.BatchUpdate(ids, binds, nil)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("bind %d tables: %w", len(ids), err)
		}
	}
	for i, id := range ids {
		if err := p.objs.XlbTblMeta.Update(id, binds[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("bind table id %d: %w", id, err)
		}
	}
	return nil
}

// binding is what xlb_tbl_meta holds for a table (unbound if nil or not
// an addr table, or if its slot has no tries).
func (p *Plane) binding(t *model.Table) xlbTblBind {
	if t == nil {
		return xlbTblBind{}
	}
	var idx, flags uint32
	switch {
	case t.Type == model.TableAddr:
		s := p.tbls.slots[t.Slot]
		if s == nil {
			return xlbTblBind{}
		}
		idx = s.idx
		if t.Values&model.ValLimit != 0 {
			flags |= tblFLimit
		}
		if t.Values&model.ValMark != 0 {
			flags |= tblFMark
		}
		if t.Values&model.ValDSCP != 0 {
			flags |= tblFDSCP
		}
	case hasHash(t):
		s := p.tbls.hslots[t.Slot]
		if s == nil {
			return xlbTblBind{}
		}
		idx, flags = s.idx, hashType(t)
	default:
		return xlbTblBind{}
	}
	v := verdictOf(t.Verdict)
	if t.LogPrefix != "" && v != tblNone {
		flags |= tblFLog
	}
	return xlbTblBind{Slot: idx, Verdict: v | flags}
}

// bound reports whether a table has a slot in the kernel.
func (p *Plane) bound(t *model.Table) bool {
	if t.Type == model.TableAddr {
		return p.tbls.slots[t.Slot] != nil
	}
	return p.tbls.hslots[t.Slot] != nil
}

func verdictOf(v model.ListVerdict) uint32 {
	switch v {
	case model.ListDeny:
		return tblDeny
	case model.ListAllow:
		return tblAllow
	}
	return tblNone
}

// policyKeys are a farm's service keys: each VIP's protocol and ports
// (port 0 for a farm of every port).
func policyKeys(f *model.Farm) []xlbSvcKey {
	var out []xlbSvcKey
	proto := f.Protocol.Number()
	for _, a := range f.VirtualAddrs() {
		k := xlbSvcKey{Addr: addrWords(a), Proto: proto, Family: familyOf(a)}
		if len(f.VirtualPorts) == 0 {
			out = append(out, k)
		}
		for _, r := range f.VirtualPorts {
			for port := uint32(r.First); port <= uint32(r.Last); port++ {
				k.Port = ne16(uint16(port))
				out = append(out, k)
			}
		}
	}
	return out
}

// policyValue is a farm's policy tables' ids, in the order they are
// checked (plan.PolicyOrder), of the types the program matches.
func policyValue(f *model.Farm, tables map[string]*model.Table) xlbTblPolicy {
	var v xlbTblPolicy
	for _, t := range plan.PolicyOrder(f, tables) {
		if t.Type != model.TableAddr && !hasHash(t) {
			continue
		}
		if int(v.N) == len(v.Ids) {
			break
		}
		v.Ids[v.N] = t.ID
		v.N++
	}
	return v
}

// writeFarmPolicies writes (or, with del, removes) a farm's policy keys.
func (p *Plane) writeFarmPolicies(f *model.Farm, tables map[string]*model.Table, del bool) error {
	t := &p.tbls
	if del {
		for _, k := range policyKeys(f) {
			if t.keys[k] != f.Name {
				continue
			}
			if err := p.objs.XlbTblPolicy.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("farm %q: remove policies: %w", f.Name, err)
			}
			delete(t.keys, k)
			delete(t.vals, k)
		}
		return nil
	}
	v := policyValue(f, tables)
	// The node's own source towards the VIP: what the socket programs
	// check an unbound socket with (Options.PoliciesOnOutput); zero when
	// no route gives one.
	if src, err := p.sourceFor(f.VirtualAddr); err == nil && f.VirtualAddr.IsValid() {
		v.NodeSrc = addrWords(src)
	}
	for _, k := range policyKeys(f) {
		if err := p.objs.XlbTblPolicy.Update(k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("farm %q: write policies: %w", f.Name, err)
		}
		t.keys[k] = f.Name
		t.vals[k] = v
	}
	return nil
}

// writeConf tells the program which policy lookups packets need, and the
// policy generation.
func (p *Plane) writeConf() error {
	conf := p.tbls.gen<<tblGenShift | p.tbls.refs<<tblRefsShift
	if p.macFarms() {
		conf |= tblConfMAC
	}
	if len(p.srcs.steer) > 0 {
		conf |= tblConfSteer
	}
	for _, f := range p.tbls.farms {
		if len(f.VirtualPorts) == 0 {
			conf |= tblConfAnyPort
		} else {
			conf |= tblConfPort
		}
	}
	if err := p.objs.XlbTblConf.Update(uint32(0), conf, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write policy flags: %w", err)
	}
	return nil
}

// bumpGen moves the policy generation on once a change of tables,
// bindings or farms' policies is in the kernel (or taken back): tracked
// flows that passed their farm's policies before are checked again at
// their next packet (tbl_check).
func (p *Plane) bumpGen() error {
	t := &p.tbls
	if t.gen == 0 || t.gen >= tblGenMax {
		return p.restartGen()
	}
	t.gen++
	return p.writeConf()
}

// restartGen starts the policy generations again at 1 with no conntrack
// entry holding one: generation 0 (the program neither trusts nor records
// passes), a wait until every program run that read the old generation has
// ended, every entry's generation cleared (xlb_tbl_clear_gen), then 1. So
// no entry keeps a generation from before, which a later one could equal.
func (p *Plane) restartGen() error {
	t := &p.tbls
	t.gen = 0
	if err := p.writeConf(); err != nil {
		return err
	}
	if err := p.waitProgramRuns(); err != nil {
		return fmt.Errorf("restart policy generations: %w", err)
	}
	if _, err := p.objs.XlbTblClearGen.Run(&ebpf.RunOptions{}); err != nil {
		return fmt.Errorf("restart policy generations: clear conntrack entries: %w", err)
	}
	if err := p.clearPolicyCache(); err != nil {
		return fmt.Errorf("restart policy generations: %w", err)
	}
	t.gen = 1
	return p.writeConf()
}

// clearPolicyCache empties every CPU's copies of farms' policies
// (xlb_tbl_pcache, bpf/xlb_tables.h: tbl_key_refs), which are stamped with
// the generation they were read under: run while the generation is 0 (the
// program neither reads nor writes them), so none stamped before a wrap is
// trusted after it.
func (p *Plane) clearPolicyCache() error {
	m := p.objs.XlbTblPcache
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("clear policy cache: %w", err)
	}
	zero := make([]xlbTblPcache, ncpu)
	for i := range m.MaxEntries() {
		if err := m.Update(i, zero, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("clear policy cache entry %d: %w", i, err)
		}
	}
	return nil
}

// waitProgramRuns returns once every run of the program that began before
// it was called has ended: the kernel waits for an RCU grace period after
// an update of an array of maps (index 0 of xlb_tbl_addr4 is never used;
// a trie is put there and taken out).
func (p *Plane) waitProgramRuns() error {
	spec := p.tbls.inner4.Copy()
	spec.Name = "xt4_wait"
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return fmt.Errorf("make trie: %w", err)
	}
	defer m.Close()
	if err := p.objs.XlbTblAddr4.Update(uint32(0), m, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("wait for program runs: %w", err)
	}
	if err := p.objs.XlbTblAddr4.Delete(uint32(0)); err != nil {
		return fmt.Errorf("wait for program runs: %w", err)
	}
	return nil
}

// TableCounters implements dataplane.TableCounterReader: the packets and
// bytes each entry of an addr table matched (entries that never matched
// are left out).
func (p *Plane) TableCounters(ctx context.Context, tb *model.Table) (dataplane.TableCounters, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := dataplane.TableCounters{}
	if hs := p.tbls.hslots[tb.Slot]; hs != nil && hasHash(tb) {
		if err := hashCounters(hs, tb, out); err != nil {
			return nil, fmt.Errorf("table %q: read counters: %w", tb.Name, err)
		}
		return out, ctx.Err()
	}
	if tb.Type != model.TableAddr {
		return out, nil
	}
	s := p.tbls.slots[tb.Slot]
	if s == nil {
		return out, nil
	}
	var k4 xlbTblKey4
	var k6 xlbTblKey6
	var v xlbTblVal
	it := s.v4.Iterate()
	for it.Next(&k4, &v) {
		if v.Packets != 0 {
			out[model.AddrKey(key4Prefix(k4))] = dataplane.EntryCounters{Packets: v.Packets, Bytes: v.Bytes}
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("table %q: read counters: %w", tb.Name, err)
	}
	it = s.v6.Iterate()
	for it.Next(&k6, &v) {
		if v.Packets != 0 {
			out[model.AddrKey(key6Prefix(k6))] = dataplane.EntryCounters{Packets: v.Packets, Bytes: v.Bytes}
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("table %q: read counters: %w", tb.Name, err)
	}
	return out, ctx.Err()
}
