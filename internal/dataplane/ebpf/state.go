package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
)

// A generation is one immutable version of a farm in the maps: its service
// keys all point at one svc_val whose id names its slots and, through them,
// its backend entries. A change writes a whole new generation under a fresh
// id, then flips the service keys to it (each key flip is one atomic map
// update), then frees the old generation one change later, so a packet
// always sees the old or the new farm, never a mix.
type generation struct {
	farm  string
	keys  []xlbSvcKey
	val   xlbSvcVal    // val.Id is the generation id once written
	bes   []xlbBackend // distinct active backends
	slots []int        // slot -> index into bes
	ids   []uint32     // backend ids, parallel to bes, once written
	// stlsdnat: reply mappings (backend -> VIP), parallel slices.
	stlKeys []xlbStlKey
	stlVals []xlbStlVal
}

func (g *generation) hasStl(k xlbStlKey) bool {
	for _, x := range g.stlKeys {
		if x == k {
			return true
		}
	}
	return false
}

// svcIDs allocates generation ids (indexes of xlb_rr, 1..maxSvcIDs-1).
type svcIDs struct {
	used map[uint32]bool
	next uint32
}

func (a *svcIDs) init() { a.used = map[uint32]bool{}; a.next = 1 }

func (a *svcIDs) allocSvc() (uint32, error) {
	for range maxSvcIDs {
		id := a.next
		a.next++
		if a.next >= maxSvcIDs {
			a.next = 1
		}
		if !a.used[id] {
			a.used[id] = true
			return id, nil
		}
	}
	return 0, errors.New("out of service generation ids")
}

// backendIDs allocates backend ids (keys of xlb_backends, never 0).
type backendIDs struct {
	usedBE map[uint32]bool
	nextBE uint32
}

func (a *backendIDs) init() { a.usedBE = map[uint32]bool{}; a.nextBE = 1 }

func (a *backendIDs) allocBackend() (uint32, error) {
	if len(a.usedBE) >= maxBackends {
		return 0, errors.New("out of backend ids")
	}
	for {
		id := a.nextBE
		a.nextBE++
		if a.nextBE == 0 || a.nextBE > 1<<30 {
			a.nextBE = 1
		}
		if !a.usedBE[id] {
			a.usedBE[id] = true
			return id, nil
		}
	}
}

// ne32 returns the uint32 whose memory holds a's 4 bytes (network order).
func ne32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// addrWords returns an address as a key's 4 x 32 bits (memory in network
// order): an IPv4 address in word 0, the rest zero.
func addrWords(a netip.Addr) [4]uint32 {
	if a.Is4() {
		return [4]uint32{ne32(a)}
	}
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func familyOf(a netip.Addr) uint8 {
	if a.Is4() {
		return afInet
	}
	return afInet6
}

// ne16 returns the uint16 whose memory holds v in network order.
func ne16(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// plan computes a farm's generation without ids; nil if the farm serves no
// service key (state down or off).
func (p *Plane) plan(f *model.Farm) (*generation, error) {
	if f.State != model.StateUp {
		return nil, nil
	}
	g := &generation{farm: f.Name}
	proto := f.Protocol.Number()
	vip, fam := addrWords(f.VirtualAddr), familyOf(f.VirtualAddr)
	addKey := func(port uint16) {
		g.keys = append(g.keys, xlbSvcKey{Addr: vip, Port: ne16(port), Proto: proto, Family: fam})
	}
	if len(f.VirtualPorts) == 0 {
		addKey(0)
	}
	for _, r := range f.VirtualPorts {
		for port := uint32(r.First); port <= uint32(r.Last); port++ {
			addKey(uint16(port))
		}
	}
	switch f.Mode {
	case model.ModeSNAT:
		g.val.Mode = modeSNAT
	case model.ModeDSR:
		g.val.Mode = modeDSR
	case model.ModeStlsDNAT:
		g.val.Mode = modeSTL
		// Replies of every backend (active or not: in-flight packets)
		// leave as the VIP; a backend port maps back to the farm's one
		// virtual port (check makes sure there is one), port 0 keeps it.
		seen := map[xlbStlKey]bool{}
		for _, b := range f.Backends {
			k := xlbStlKey{Addr: addrWords(b.Addr), Port: ne16(b.Port), Proto: proto, Family: familyOf(b.Addr)}
			if seen[k] {
				continue
			}
			seen[k] = true
			v := xlbStlVal{Addr: vip}
			if b.Port != 0 {
				v.Port = ne16(f.VirtualPorts[0].First)
			}
			g.stlKeys = append(g.stlKeys, k)
			g.stlVals = append(g.stlVals, v)
		}
	default:
		g.val.Mode = modeDNAT
	}
	switch f.Scheduler {
	case model.SchedWeight:
		g.val.Sched = schedWeight
	case model.SchedHash, model.SchedMaglev:
		g.val.Sched = schedHash
		if f.Scheduler == model.SchedMaglev {
			g.val.Sched = schedMaglev
		}
		g.val.HashKeys = hashSrcIP
		if f.SchedParam != 0 {
			g.val.HashKeys = hashKeys(f.SchedParam)
		}
	case model.SchedSymhash:
		// Symmetric: any address key hashes both addresses, any port
		// key both ports.
		g.val.Sched = schedSymhash
		if f.SchedParam&(model.KeySrcIP|model.KeyDstIP) != 0 {
			g.val.HashKeys |= hashSrcIP
		}
		if f.SchedParam&(model.KeySrcPort|model.KeyDstPort) != 0 {
			g.val.HashKeys |= hashSrcPort
		}
	default:
		g.val.Sched = schedRR
	}
	if f.Persistence != 0 {
		g.val.Persist = hashKeys(f.Persistence)
		g.val.PersistTtl = f.PersistTTL
	}
	active := f.ActiveBackends()
	weights := make([]uint32, len(active))
	for i, b := range active {
		be := xlbBackend{Addr: addrWords(b.Addr), Port: ne16(b.Port), Family: familyOf(b.Addr)}
		if f.Mode == model.ModeSNAT {
			src := f.SourceAddr
			if !src.IsValid() {
				var err error
				if src, err = p.sourceFor(b.Addr); err != nil {
					return nil, fmt.Errorf("farm %q backend %q: %w", f.Name, b.Name, err)
				}
			}
			be.Snat = addrWords(src)
		}
		g.bes = append(g.bes, be)
		weights[i] = b.Weight
	}
	if f.Scheduler == model.SchedRR {
		for i := range weights {
			weights[i] = 1
		}
	}
	if f.Scheduler == model.SchedMaglev {
		names := make([]string, len(active))
		for i, b := range active {
			names[i] = netip.AddrPortFrom(b.Addr, b.Port).String()
		}
		g.slots = maglevTable(names, weights, maglevSize(len(active)))
	} else {
		g.slots = weightedSlots(weights, maxSlotsPerService)
	}
	g.val.Slots = uint32(len(g.slots))
	return g, nil
}

func hashKeys(k model.HashKey) uint8 {
	var out uint8
	if k&model.KeySrcIP != 0 {
		out |= hashSrcIP
	}
	if k&model.KeySrcPort != 0 {
		out |= hashSrcPort
	}
	return out
}

// indexKey is g's be_index key of backend i.
func (g *generation) indexKey(i int) xlbBeIndexKey {
	return xlbBeIndexKey{Svc: g.val.Id, Addr: g.bes[i].Addr, Port: g.bes[i].Port}
}

// writeStateless writes g's stlsdnat reply mappings, refusing a backend
// that another farm's mapping holds.
func (p *Plane) writeStateless(g *generation) error {
	for i, k := range g.stlKeys {
		if o, ok := p.stlOwner[k]; ok && o != g.farm && p.farms[o] != nil && p.farms[o].hasStl(k) {
			return &model.FieldError{Object: fmt.Sprintf("farm %q", g.farm), Field: "backends",
				Value:   fmt.Sprintf("%s port %d", wordsAddr(k.Addr, k.Family), be16(k.Port)),
				Problem: fmt.Sprintf("already serves stlsdnat farm %q: its replies could not be told apart", o)}
		}
		if err := p.objs.XlbStateless.Update(k, g.stlVals[i], ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write stlsdnat mapping: %w", err)
		}
		p.stlOwner[k] = g.farm
	}
	return nil
}

// freeStateless removes g's stlsdnat mappings that no current generation
// of its farm holds (another farm's are left alone).
func (p *Plane) freeStateless(g *generation) {
	cur := p.farms[g.farm]
	for _, k := range g.stlKeys {
		if p.stlOwner[k] != g.farm || (cur != nil && cur.hasStl(k)) {
			continue
		}
		_ = p.objs.XlbStateless.Delete(k)
		delete(p.stlOwner, k)
	}
}

// wordsAddr is addrWords reversed.
func wordsAddr(w [4]uint32, family uint8) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	if family == afInet {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

func be16(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

// writeIndex writes g's backend index (address -> id), used by persistence.
func (p *Plane) writeIndex(g *generation) error {
	if len(g.ids) == 0 {
		return nil
	}
	keys := make([]xlbBeIndexKey, len(g.ids))
	for i := range g.ids {
		keys[i] = g.indexKey(i)
	}
	if _, err := p.objs.XlbBeIndex.BatchUpdate(keys, g.ids, nil); err != nil {
		return fmt.Errorf("write backend index: %w", err)
	}
	return nil
}

// sourceFor returns the address the LB's namespace uses towards dst (the
// snat source when the farm sets no source-addr).
func (p *Plane) sourceFor(dst netip.Addr) (netip.Addr, error) {
	routes, err := p.nl.RouteGet(dst.AsSlice())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("route to %s: %w", dst, err)
	}
	for _, r := range routes {
		if a, ok := netip.AddrFromSlice(r.Src); ok && a.Unmap().Is4() == dst.Is4() {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no source address towards %s", dst)
}

// weightedSlots returns, for each slot, the index of its backend: backend i
// holds weights[i]/gcd slots, scaled down to at most max in total (each
// backend keeping at least one).
func weightedSlots(weights []uint32, max int) []int {
	if len(weights) == 0 {
		return nil
	}
	g := uint32(0)
	for _, w := range weights {
		g = gcd(g, w)
	}
	total := 0
	for _, w := range weights {
		total += int(w / g)
	}
	var out []int
	for i, w := range weights {
		n := int(w / g)
		if total > max {
			n = n * max / total
		}
		n = max1(n)
		for range n {
			out = append(out, i)
		}
	}
	return out
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

func gcd(a, b uint32) uint32 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// write allocates ids for g and writes its backends, slots and round-robin
// counter. Nothing points at them yet.
func (p *Plane) write(g *generation) error {
	id, err := p.allocSvc()
	if err != nil {
		return err
	}
	g.val.Id = id
	g.ids = make([]uint32, len(g.bes))
	for i := range g.bes {
		if g.ids[i], err = p.allocBackend(); err != nil {
			p.free(g)
			return err
		}
	}
	if len(g.ids) > 0 {
		if _, err := p.objs.XlbBackends.BatchUpdate(g.ids, g.bes, nil); err != nil {
			p.free(g)
			return fmt.Errorf("write backends: %w", err)
		}
	}
	if err := p.writeIndex(g); err != nil {
		p.free(g)
		return err
	}
	if err := p.writeStateless(g); err != nil {
		p.free(g)
		return err
	}
	if len(g.slots) > 0 {
		keys := make([]xlbSlotKey, len(g.slots))
		vals := make([]uint32, len(g.slots))
		for i, b := range g.slots {
			keys[i] = xlbSlotKey{Svc: id, Idx: uint32(i)}
			vals[i] = g.ids[b]
		}
		if _, err := p.objs.XlbSlots.BatchUpdate(keys, vals, nil); err != nil {
			p.free(g)
			return fmt.Errorf("write slots: %w", err)
		}
	}
	if err := p.objs.XlbRr.Update(id, uint32(0), ebpf.UpdateAny); err != nil {
		p.free(g)
		return fmt.Errorf("reset round-robin counter: %w", err)
	}
	return nil
}

// free deletes g's slots and backends and releases its ids. g must no
// longer be referenced by any service key.
func (p *Plane) free(g *generation) {
	p.freeStateless(g)
	if g.val.Id != 0 {
		for i := range g.slots {
			_ = p.objs.XlbSlots.Delete(xlbSlotKey{Svc: g.val.Id, Idx: uint32(i)})
		}
		delete(p.used, g.val.Id)
	}
	for i, id := range g.ids {
		if id != 0 {
			if g.val.Id != 0 {
				_ = p.objs.XlbBeIndex.Delete(g.indexKey(i))
			}
			_ = p.objs.XlbBackends.Delete(id)
			delete(p.usedBE, id)
		}
	}
}

// flip points the service keys from old to cur (either may be nil). Keys of
// old that cur lacks are deleted, unless another farm's generation owns
// them by now. On error the keys are put back as they were.
func (p *Plane) flip(old, cur *generation) error {
	var done []xlbSvcKey
	undo := func() {
		for _, k := range done {
			if old != nil && old.hasKey(k) {
				_ = p.objs.XlbServices.Update(k, old.val, ebpf.UpdateAny)
			} else {
				_ = p.objs.XlbServices.Delete(k)
			}
		}
	}
	if cur != nil {
		for _, k := range cur.keys {
			if err := p.objs.XlbServices.Update(k, cur.val, ebpf.UpdateAny); err != nil {
				undo()
				return fmt.Errorf("write service: %w", err)
			}
			done = append(done, k)
		}
	}
	if old != nil {
		for _, k := range old.keys {
			if cur != nil && cur.hasKey(k) {
				continue
			}
			var v xlbSvcVal
			if err := p.objs.XlbServices.Lookup(k, &v); err != nil || v.Id != old.val.Id {
				continue
			}
			if err := p.objs.XlbServices.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				undo()
				return fmt.Errorf("delete service: %w", err)
			}
		}
	}
	return nil
}

func (g *generation) hasKey(k xlbSvcKey) bool {
	for _, x := range g.keys {
		if x == k {
			return true
		}
	}
	return false
}

func (p *Plane) freePending() {
	for _, g := range p.pending {
		p.free(g)
	}
	p.pending = nil
}

// Apply applies the diff: for each changed farm a new generation is
// written, then its service keys flip to it. If any step fails, the farms
// already changed by this diff are flipped back, so either all of the diff
// takes effect or none of it does.
func (p *Plane) Apply(ctx context.Context, d dataplane.Diff) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freePending()
	type step struct {
		oldName    string
		old, cur   *generation
		newName    string
		hadOldName bool
	}
	var steps []step
	rollback := func() {
		for i := len(steps) - 1; i >= 0; i-- {
			s := steps[i]
			if err := p.flip(s.cur, s.old); err != nil {
				p.log.Error("roll back ebpf service flip", "farm", s.newName, "err", err)
			}
			if s.newName != "" {
				delete(p.farms, s.newName)
			}
			if s.old != nil {
				p.farms[s.oldName] = s.old
			}
			if s.cur != nil {
				p.pending = append(p.pending, s.cur)
			}
		}
	}
	for _, c := range d.Changes {
		if err := ctx.Err(); err != nil {
			rollback()
			return err
		}
		var s step
		if c.Old != nil {
			s.oldName = c.Old.Name
			s.old = p.farms[c.Old.Name]
		}
		if c.New != nil {
			s.newName = c.New.Name
			g, err := p.plan(c.New)
			if err != nil {
				rollback()
				return err
			}
			if g != nil {
				if err := p.write(g); err != nil {
					rollback()
					return fmt.Errorf("farm %q: %w", c.New.Name, err)
				}
			}
			s.cur = g
		}
		if err := p.flip(s.old, s.cur); err != nil {
			if s.cur != nil {
				p.free(s.cur)
			}
			rollback()
			return fmt.Errorf("farm %q: %w", s.newName+s.oldName, err)
		}
		if s.oldName != "" {
			delete(p.farms, s.oldName)
		}
		if s.cur != nil {
			p.farms[s.newName] = s.cur
		}
		steps = append(steps, s)
	}
	for _, s := range steps {
		if s.old != nil {
			p.pending = append(p.pending, s.old)
		}
	}
	return nil
}

// Reconcile makes the maps hold exactly the given farms. A farm whose
// entries already match (a restarted daemon adopting pinned maps) is kept
// as it is, round-robin position included; any other is written as a new
// generation and flipped to. Service keys of no farm are deleted, then
// slots and backends no service references.
func (p *Plane) Reconcile(ctx context.Context, farms []*model.Farm) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freePending()

	svcs := map[xlbSvcKey]xlbSvcVal{}
	{
		var k xlbSvcKey
		var v xlbSvcVal
		it := p.objs.XlbServices.Iterate()
		for it.Next(&k, &v) {
			svcs[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read services: %w", err)
		}
	}
	slots := map[xlbSlotKey]uint32{}
	{
		var k xlbSlotKey
		var v uint32
		it := p.objs.XlbSlots.Iterate()
		for it.Next(&k, &v) {
			slots[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read slots: %w", err)
		}
	}
	bes := map[uint32]xlbBackend{}
	{
		var k uint32
		var v xlbBackend
		it := p.objs.XlbBackends.Iterate()
		for it.Next(&k, &v) {
			bes[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read backends: %w", err)
		}
	}

	// Everything in the maps counts as used until the sweep below.
	p.svcIDs.init()
	p.backendIDs.init()
	for _, v := range svcs {
		p.used[v.Id] = true
	}
	for k := range slots {
		p.used[k.Svc] = true
	}
	for id := range bes {
		p.usedBE[id] = true
	}

	p.farms = map[string]*generation{}
	p.stlOwner = map[xlbStlKey]string{}
	adopted := map[uint32]bool{}
	for _, f := range farms {
		if err := ctx.Err(); err != nil {
			return err
		}
		g, err := p.plan(f)
		if err != nil {
			return err
		}
		if g == nil {
			continue
		}
		if adopt(g, svcs, slots, bes) && !adopted[g.val.Id] {
			adopted[g.val.Id] = true
			p.farms[f.Name] = g
			// The index and the stlsdnat mappings may predate this
			// version: write them again.
			if err := p.writeIndex(g); err != nil {
				return fmt.Errorf("farm %q: %w", f.Name, err)
			}
			if err := p.writeStateless(g); err != nil {
				return fmt.Errorf("farm %q: %w", f.Name, err)
			}
			continue
		}
		if err := p.write(g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
		if err := p.flip(nil, g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
		p.farms[f.Name] = g
	}

	// Sweep: service keys, slots and backends that no farm owns.
	owned := map[xlbSvcKey]bool{}
	liveSvc := map[uint32]bool{}
	liveBE := map[uint32]bool{}
	for _, g := range p.farms {
		for _, k := range g.keys {
			owned[k] = true
		}
		liveSvc[g.val.Id] = true
		for _, id := range g.ids {
			liveBE[id] = true
		}
	}
	for k := range svcs {
		if !owned[k] {
			if err := p.objs.XlbServices.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete stray service: %w", err)
			}
		}
	}
	for k := range slots {
		if !liveSvc[k.Svc] {
			_ = p.objs.XlbSlots.Delete(k)
		}
	}
	for id := range bes {
		if !liveBE[id] {
			_ = p.objs.XlbBackends.Delete(id)
		}
	}
	{
		var k xlbStlKey
		var v xlbStlVal
		var stale []xlbStlKey
		it := p.objs.XlbStateless.Iterate()
		for it.Next(&k, &v) {
			if _, ok := p.stlOwner[k]; !ok {
				stale = append(stale, k)
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read stlsdnat mappings: %w", err)
		}
		for _, k := range stale {
			_ = p.objs.XlbStateless.Delete(k)
		}
	}
	{
		var k xlbBeIndexKey
		var v uint32
		var stale []xlbBeIndexKey
		it := p.objs.XlbBeIndex.Iterate()
		for it.Next(&k, &v) {
			if !liveSvc[k.Svc] || !liveBE[v] {
				stale = append(stale, k)
			}
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read backend index: %w", err)
		}
		for _, k := range stale {
			_ = p.objs.XlbBeIndex.Delete(k)
		}
	}
	p.svcIDs.init()
	p.backendIDs.init()
	for id := range liveSvc {
		p.used[id] = true
	}
	for id := range liveBE {
		p.usedBE[id] = true
	}
	return nil
}

// adopt reports whether the maps already hold generation g (same keys, same
// service value, same slots and backends); if so it fills in g's ids.
func adopt(g *generation, svcs map[xlbSvcKey]xlbSvcVal, slots map[xlbSlotKey]uint32, bes map[uint32]xlbBackend) bool {
	var id uint32
	for i, k := range g.keys {
		v, ok := svcs[k]
		if !ok {
			return false
		}
		if i == 0 {
			id = v.Id
		}
		want := g.val
		want.Id = id
		if v != want {
			return false
		}
	}
	ids := make([]uint32, len(g.bes))
	for i, b := range g.slots {
		bid, ok := slots[xlbSlotKey{Svc: id, Idx: uint32(i)}]
		if !ok {
			return false
		}
		if be, ok := bes[bid]; !ok || be != g.bes[b] {
			return false
		}
		if ids[b] != 0 && ids[b] != bid {
			return false
		}
		ids[b] = bid
	}
	if _, extra := slots[xlbSlotKey{Svc: id, Idx: uint32(len(g.slots))}]; extra {
		return false
	}
	g.val.Id = id
	g.ids = ids
	return true
}
