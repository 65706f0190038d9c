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
//
// A backend keeps its id (and entry) across the generations of its farm as
// long as the farm lists it (ids are reference-counted), so tracked flows
// know what became of their backend: while it is down or off its entry is
// flagged gone (beFlagGone) and the program expires their flows
// (expire_nodest_conn); drained or standby backends keep theirs. A backend
// removed from the farm (or a farm going down) leaves its tracked flows
// alone, as the nft plane does.
type generation struct {
	farm  string
	keys  []xlbSvcKey
	val   xlbSvcVal    // val.Id is the generation id once written
	bes   []xlbBackend // distinct backends: the active ones first
	names []string     // backend names, parallel to bes (the first of duplicates)
	slots []int        // slot -> index into bes
	ids   []uint32     // backend ids, parallel to bes, once written
	// active: bes[:active] take new flows (slots, persistence); the
	// others take none: up ones (weight 0, a higher priority level)
	// keep their tracked flows, down or off ones (Flags beFlagGone)
	// expire them.
	active int
	// stlsdnat: reply mappings (backend -> VIP), parallel slices.
	stlKeys []xlbStlKey
	stlVals []xlbStlVal
	// log: the farm logs new connections (xlb_svc_flags), with this
	// prefix.
	log       bool
	logPrefix string
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

// backendIDs allocates backend ids (keys of xlb_backends, never 0). An id
// is shared by the generations of a farm that hold the same backend: usedBE
// counts them.
type backendIDs struct {
	usedBE map[uint32]int
	nextBE uint32
}

func (a *backendIDs) init() { a.usedBE = map[uint32]int{}; a.nextBE = 1 }

// unrefBackend drops one reference to id; true when it was the last.
func (a *backendIDs) unrefBackend(id uint32) bool {
	a.usedBE[id]--
	if a.usedBE[id] > 0 {
		return false
	}
	delete(a.usedBE, id)
	return true
}

func (a *backendIDs) allocBackend() (uint32, error) {
	if len(a.usedBE) >= maxBackends-1 { // ids 1 .. maxBackends-1
		return 0, errors.New("out of backend ids")
	}
	for {
		id := a.nextBE
		a.nextBE++
		if a.nextBE >= maxBackends { // ids index xlb_be_flags
			a.nextBE = 1
		}
		if a.usedBE[id] == 0 {
			a.usedBE[id] = 1
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
	g := &generation{farm: f.Name, log: f.Log != 0, logPrefix: f.LogPrefix}
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
		// hash defaults to srcip (nftlb); maglev takes no sched-param in
		// the model and hashes the flow, as the nft plane does (client
		// address and port; the VIP and port are the service's).
		g.val.HashKeys = hashSrcIP
		if f.Scheduler == model.SchedMaglev {
			g.val.HashKeys = hashSrcIP | hashSrcPort
		}
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
	entry := func(b model.Backend) (xlbBackend, error) {
		be := xlbBackend{Addr: addrWords(b.Addr), Port: ne16(b.Port), Family: familyOf(b.Addr)}
		if f.Mode == model.ModeSNAT {
			src := f.SourceAddr
			if !src.IsValid() {
				var err error
				if src, err = p.sourceFor(b.Addr); err != nil {
					// The request's value, not the kernel, is at fault:
					// a *model.FieldError, so the API answers 400.
					return be, &model.FieldError{Object: fmt.Sprintf("farm %q backend %q", f.Name, b.Name), Field: "ip-addr", Value: b.Addr.String(),
						Problem: fmt.Sprintf("mode snat needs a route to the backend to pick the source address, and there is none (%v); add a route or set the farm's source-addr", err)}
				}
			}
			be.Snat = addrWords(src)
		}
		return be, nil
	}
	weights := make([]uint32, len(active))
	isActive := map[string]bool{}
	for i, b := range active {
		be, err := entry(b)
		if err != nil {
			return nil, err
		}
		g.bes = append(g.bes, be)
		g.names = append(g.names, b.Name)
		weights[i] = b.Weight
		isActive[b.Name] = true
	}
	g.active = len(g.bes)
	// The rest, up ones first (a backend listed twice counts as up).
	for _, up := range []bool{true, false} {
		for _, b := range f.Backends {
			if isActive[b.Name] || (b.State == model.StateUp) != up {
				continue
			}
			be, err := entry(b)
			if err != nil {
				return nil, err
			}
			if !up {
				be.Flags = beFlagGone
			}
			dup := false
			for _, x := range g.bes {
				dup = dup || sameBackend(x, be)
			}
			if !dup {
				g.bes = append(g.bes, be)
				g.names = append(g.names, b.Name)
			}
		}
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
	if g.active == 0 {
		return nil
	}
	keys := make([]xlbBeIndexKey, g.active)
	for i := range keys {
		keys[i] = g.indexKey(i)
	}
	if _, err := p.objs.XlbBeIndex.BatchUpdate(keys, g.ids[:g.active], nil); err != nil {
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
//
// reuse (may be nil) returns the id of an existing entry to share for a
// backend, 0 for none.
func (p *Plane) write(g *generation, reuse func(xlbBackend) uint32) error {
	id, err := p.allocSvc()
	if err != nil {
		return err
	}
	g.val.Id = id
	g.ids = make([]uint32, len(g.bes))
	var newIDs []uint32
	var newBes []xlbBackend
	for i := range g.bes {
		if reuse != nil {
			if bid := reuse(g.bes[i]); bid != 0 {
				// Shared: its flags follow once g is in place
				// (syncFlags).
				p.usedBE[bid]++
				g.ids[i] = bid
				continue
			}
		}
		if g.ids[i], err = p.allocBackend(); err != nil {
			p.free(g)
			return err
		}
		newIDs = append(newIDs, g.ids[i])
		newBes = append(newBes, g.bes[i])
	}
	p.bySvc[id] = g
	if err := p.setSvcFlags(g); err != nil {
		p.free(g)
		return err
	}
	if len(newIDs) > 0 {
		if _, err := p.objs.XlbBackends.BatchUpdate(newIDs, newBes, nil); err != nil {
			p.free(g)
			return fmt.Errorf("write backends: %w", err)
		}
		for i, id := range newIDs {
			if err := p.newBackendStats(id); err != nil {
				p.free(g)
				return err
			}
			if err := p.setFlags(id, newBes[i].Flags); err != nil {
				p.free(g)
				return err
			}
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
		if p.bySvc[g.val.Id] == g {
			delete(p.bySvc, g.val.Id)
		}
	}
	for i, id := range g.ids {
		if id != 0 {
			if g.val.Id != 0 {
				_ = p.objs.XlbBeIndex.Delete(g.indexKey(i))
			}
			if p.unrefBackend(id) {
				_ = p.objs.XlbBackends.Delete(id)
				p.dropBackendStats(g.farm, id)
				_ = p.setFlags(id, 0)
			}
		}
	}
}

// sameBackend reports whether a and b are the same backend entry but for
// its flags.
func sameBackend(a, b xlbBackend) bool {
	a.Flags, b.Flags = 0, 0
	return a == b
}

// reuseFrom shares the ids of old's backends with its successor.
func reuseFrom(old *generation) func(xlbBackend) uint32 {
	if old == nil {
		return nil
	}
	return func(be xlbBackend) uint32 {
		for i, x := range old.bes {
			if sameBackend(x, be) && i < len(old.ids) {
				return old.ids[i]
			}
		}
		return 0
	}
}

// setFlags writes a backend id's flags to xlb_be_flags, with its counter
// slot (ids beyond the array, from an older daemon, have neither).
func (p *Plane) setFlags(id uint32, flags uint8) error {
	if id >= maxBackends {
		return nil
	}
	v := uint32(flags) | p.statSlot[id]<<beSlotShift
	if err := p.objs.XlbBeFlags.Update(id, v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write backend flags: %w", err)
	}
	return nil
}

// syncFlags writes the flags of g's backends (a shared backend that went
// down or came back up), once g is the farm's current generation: the
// program then expires, or keeps, their tracked flows.
func (p *Plane) syncFlags(g *generation) {
	for i, id := range g.ids {
		if id == 0 {
			continue
		}
		var be xlbBackend
		if p.objs.XlbBackends.Lookup(id, &be) == nil && be.Flags != g.bes[i].Flags {
			if err := p.objs.XlbBackends.Update(id, g.bes[i], ebpf.UpdateExist); err != nil {
				p.log.Error("write ebpf backend", "farm", g.farm, "err", err)
			}
		}
		if err := p.setFlags(id, g.bes[i].Flags); err != nil {
			p.log.Error("write ebpf backend flags", "farm", g.farm, "err", err)
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
				if err := p.write(g, reuseFrom(s.old)); err != nil {
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
		if s.cur != nil {
			p.syncFlags(s.cur)
		}
		if s.old != nil {
			p.pending = append(p.pending, s.old)
		}
		if s.oldName != "" && s.oldName != s.newName {
			delete(p.carry, s.oldName) // deleted (or renamed): its counts go
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

	// Counter slots of the backends in the maps (a restarted daemon's).
	if err := p.adoptStatSlots(bes); err != nil {
		return err
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
		p.usedBE[id] = 1
	}
	// A farm written anew shares the entries of its backends that are
	// already in the maps (and not gone), so their tracked flows continue.
	byEntry := map[xlbBackend][]uint32{}
	for id, be := range bes {
		be.Flags = 0
		byEntry[be] = append(byEntry[be], id)
	}
	// The backends a service generation's slots name: a farm's own
	// entries are preferred over another farm's identical ones.
	slotIDs := map[uint32]map[uint32]bool{}
	for k, id := range slots {
		if slotIDs[k.Svc] == nil {
			slotIDs[k.Svc] = map[uint32]bool{}
		}
		slotIDs[k.Svc][id] = true
	}
	taken := map[uint32]bool{}
	reuseFor := func(g *generation) func(xlbBackend) uint32 {
		own := slotIDs[svcs[g.keys[0]].Id]
		return func(be xlbBackend) uint32 {
			be.Flags = 0
			for _, pass := range []bool{true, false} {
				for _, id := range byEntry[be] {
					if !taken[id] && own[id] == pass {
						taken[id] = true
						return id
					}
				}
			}
			return 0
		}
	}

	p.farms = map[string]*generation{}
	p.bySvc = map[uint32]*generation{}
	p.stlOwner = map[xlbStlKey]string{}
	adopted := map[uint32]bool{}
	// Farms already in the maps are adopted first, so that a farm
	// written anew cannot share an entry an adopted farm holds.
	var rewrite []*generation
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
		if !adopt(g, svcs, slots, bes) || adopted[g.val.Id] {
			rewrite = append(rewrite, g)
			continue
		}
		adopted[g.val.Id] = true
		for _, id := range g.ids {
			taken[id] = true
		}
		p.farms[f.Name] = g
		p.bySvc[g.val.Id] = g
		if err := p.setSvcFlags(g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
		// The index and the stlsdnat mappings may predate this
		// version: write them again.
		if err := p.writeIndex(g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
		if err := p.writeStateless(g); err != nil {
			return fmt.Errorf("farm %q: %w", f.Name, err)
		}
	}
	for _, g := range rewrite {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.write(g, reuseFor(g)); err != nil {
			return fmt.Errorf("farm %q: %w", g.farm, err)
		}
		if err := p.flip(nil, g); err != nil {
			return fmt.Errorf("farm %q: %w", g.farm, err)
		}
		p.syncFlags(g)
		p.farms[g.farm] = g
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
	if err := p.syncBackendStats(liveBE); err != nil {
		return err
	}
	known := map[string]bool{}
	for _, f := range farms {
		known[f.Name] = true
	}
	for name := range p.carry {
		if !known[name] {
			delete(p.carry, name)
		}
	}
	p.svcIDs.init()
	p.backendIDs.init()
	for id := range liveSvc {
		p.used[id] = true
	}
	for _, g := range p.farms {
		for _, id := range g.ids {
			p.usedBE[id]++
		}
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
	for _, bid := range ids {
		if bid == 0 { // a backend without slots (drained, down): written anew
			return false
		}
	}
	g.val.Id = id
	g.ids = ids
	return true
}
