package ebpf

// Farm ids: a number of each farm's own, kept while the farm is (across
// its generations, restarts and program upgrades), that its generations'
// xlb_svc_flags values carry in their bits 16-31 (XLB_SVC_FARM_SHIFT). The
// per-client rate state of new-rtlimit and rst-rtlimit (bpf/xlb_climit.h)
// is keyed by it, so a change of the farm does not give every client a
// fresh burst, as the nft plane's per-farm sets keep theirs. Generation
// ids could not serve: each change of a farm takes a new one.

const (
	farmIDShift = uint32(xlbXlbSvcFlagXLB_SVC_FARM_SHIFT)
	maxFarmIDs  = 1 << (32 - farmIDShift) // ids 1 .. maxFarmIDs-1
)

// farmIDs allocates farm ids in turn, so a freed one comes back only after
// every other (a flow of a deleted farm's last generation never meets a
// new farm's id at once).
type farmIDs struct {
	byName map[string]uint32
	used   map[uint32]bool
	next   uint32
}

func (a *farmIDs) initFarmIDs() {
	a.byName, a.used, a.next = map[string]uint32{}, map[uint32]bool{}, 1
}

// farmID returns the farm's id, allocating one for a farm that has none;
// 0 when all are taken (its clients' limits are then keyed by generation,
// as before farm ids).
func (a *farmIDs) farmID(name string) uint32 {
	if id, ok := a.byName[name]; ok {
		return id
	}
	for range maxFarmIDs {
		id := a.next
		a.next++
		if a.next >= maxFarmIDs {
			a.next = 1
		}
		if !a.used[id] {
			a.used[id] = true
			a.byName[name] = id
			return id
		}
	}
	return 0
}

// freeFarmID releases a deleted farm's id.
func (a *farmIDs) freeFarmID(name string) {
	if id, ok := a.byName[name]; ok {
		delete(a.used, id)
		delete(a.byName, name)
	}
}

// recoverFarmIDs reads the farm ids the maps' generations carry (a
// restart): they are reserved until bindFarmID gives them back to their
// farms, and released by dropUnbound.
func (p *Plane) recoverFarmIDs() map[uint32]uint32 {
	byGen := map[uint32]uint32{}
	var gen, fl uint32
	it := p.objs.XlbSvcFlags.Iterate()
	for it.Next(&gen, &fl) {
		if id := fl >> farmIDShift; id != 0 {
			byGen[gen] = id
			p.farmIDs.used[id] = true
		}
	}
	return byGen
}

// bindFarmID gives farm name the id its generation gen carried, if any.
func (p *Plane) bindFarmID(name string, gen uint32, byGen map[uint32]uint32) {
	if id, ok := byGen[gen]; ok && gen != 0 {
		if _, has := p.farmIDs.byName[name]; !has {
			p.farmIDs.byName[name] = id
		}
	}
}

// dropUnbound releases the recovered ids no farm took back, and goes on
// allocating after the highest id in use (as if the plane had not
// restarted: a farm deleted just before it does not give its id at once).
func (p *Plane) dropUnbound() {
	bound := map[uint32]bool{}
	for _, id := range p.farmIDs.byName {
		bound[id] = true
		if id >= p.farmIDs.next {
			p.farmIDs.next = (id + 1) % maxFarmIDs
			if p.farmIDs.next == 0 {
				p.farmIDs.next = 1
			}
		}
	}
	for id := range p.farmIDs.used {
		if !bound[id] {
			delete(p.farmIDs.used, id)
		}
	}
}
