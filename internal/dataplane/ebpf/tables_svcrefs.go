package ebpf

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// A service's value carries the ids of its farm's policy tables
// (svc_val.tbl_ids), so a packet without conntrack entry, which looks its
// service up anyway, needs no second lookup to learn them (tbl_svc_refs in
// bpf/xlb_tables.h; stlsdnat farms' packets all go that way). The ids are
// what xlb_tbl_policy answers for the key (svcRefs), and the program
// trusts them only while the value's stamp is the refs generation in
// xlb_tbl_conf. That generation moves on only when the daemon starts
// (ReconcileTables, which writes every value again); a change of farms'
// policies instead touches only the services whose answer it may change,
// those whose key or VIP's every-port key is one of the changed farms'
// policy keys (refsTouched): before xlb_tbl_policy changes their values
// lose the stamp (0, never trusted: packets look the policies up by key
// as before), and at the end of the same apply they are written again
// with the new ids under the stamp (stampServices). Every other service's
// answer stays what it was, so its value stays trusted and is not written:
// adding a farm with a policy next to 16,000 farms writes its own keys,
// not 16,000 (BenchmarkTablesRestamp). A swap or a change of a table's
// entries keeps every id, and touches no service.

// svcRefs is what tbl_farm_refs finds in xlb_tbl_policy for service key k
// (its farm tag dropped): the key's own policies, else those of its VIP's
// every-port key, else none. No allocation: the drift poll calls it for
// every service key it checks.
func (p *Plane) svcRefs(k xlbSvcKey) (ids [8]uint16, n uint16) {
	t := &p.tbls
	k.Family &= 1<<svcTagShift - 1
	if v, ok := t.vals[k]; ok {
		return v.Ids, uint16(min(v.N, uint32(len(v.Ids))))
	}
	if k.Port != 0 {
		k.Port = 0
		if v, ok := t.vals[k]; ok {
			return v.Ids, uint16(min(v.N, uint32(len(v.Ids))))
		}
	}
	return ids, 0
}

// svcValue is the value of g's service key k: g's, with the policy ids of
// the key stamped with the current refs generation.
func (p *Plane) svcValue(g *generation, k xlbSvcKey) xlbSvcVal {
	v := g.val
	v.TblIds, v.TblN = p.svcRefs(k)
	v.TblGen = uint16(p.tbls.refs)
	return v
}

// sameService reports whether service values a and b are the same but for
// their policy ids (which restampServices rewrites).
func sameService(a, b xlbSvcVal) bool {
	a.TblIds, a.TblN, a.TblGen = b.TblIds, b.TblN, b.TblGen
	return a == b
}

// restampServices writes every service's value again with its policy ids
// under the current refs generation (a key at a time: each update is
// atomic). O(service keys): at start, and after a failed change.
func (p *Plane) restampServices() error {
	for _, g := range p.farms {
		if g.val.Id == 0 {
			continue
		}
		for _, k := range g.keys {
			if err := p.objs.XlbServices.Update(k, p.svcValue(g, k), ebpf.UpdateAny); err != nil {
				return fmt.Errorf("farm %q: write service's policies: %w", g.farm, err)
			}
		}
	}
	return nil
}

// startRefs gives a plane without refs generation (ReconcileTables not
// run) its first: every service's value is written without a stamp (a
// pinned one an earlier daemon stamped is trusted no more), then the
// generation is written; restampServices stamps them at the end of the
// change.
func (p *Plane) startRefs() error {
	if err := p.restampServices(); err != nil { // t.refs 0: stamp 0
		return err
	}
	p.tbls.refs = 1
	return p.writeConf()
}

// svcRef is one service key of a generation whose policy ids a change
// may move.
type svcRef struct {
	g *generation
	k xlbSvcKey
}

// refsTouched lists the service keys whose policy ids may differ once the
// policy keys pks are written or removed: those svcRefs answers from one
// of pks, the key itself (its farm tag dropped) or its VIP's every-port
// key. Only the services of pks' VIPs are looked at (svcIndex), not every
// farm's: a walk of 16,000 farms' keys was most of attaching a policy
// (BenchmarkTablesRestamp).
func (p *Plane) refsTouched(pks map[xlbSvcKey]bool) []svcRef {
	if len(pks) == 0 {
		return nil
	}
	vips := make(map[xlbSvcKey]bool, len(pks))
	for pk := range pks {
		vips[vipKey(pk)] = true
	}
	var out []svcRef
	for vip := range vips {
		for _, r := range p.svcIdx[vip] {
			if r.g.val.Id == 0 {
				continue
			}
			u := r.k
			u.Family &= 1<<svcTagShift - 1
			hit := pks[u]
			if !hit && u.Port != 0 {
				u.Port = 0
				hit = pks[u]
			}
			if hit {
				out = append(out, r)
			}
		}
	}
	return out
}

// svcIndex holds the service keys of the plane's farms (p.farms, through
// setFarm and dropFarm) by VIP: the key with its farm tag dropped and port
// 0, the every-port policy key of the VIP.
type svcIndex map[xlbSvcKey][]svcRef

// vipKey is k's VIP's every-port key, its farm tag dropped.
func vipKey(k xlbSvcKey) xlbSvcKey {
	k.Family &= 1<<svcTagShift - 1
	k.Port = 0
	return k
}

func (x svcIndex) add(g *generation) {
	for _, k := range g.keys {
		v := vipKey(k)
		x[v] = append(x[v], svcRef{g, k})
	}
}

func (x svcIndex) remove(g *generation) {
	for _, k := range g.keys {
		v := vipKey(k)
		refs := slices.DeleteFunc(x[v], func(r svcRef) bool { return r.g == g })
		if len(refs) == 0 {
			delete(x, v)
		} else {
			x[v] = refs
		}
	}
}

// setFarm makes g farm name's applied generation, in p.farms and its index.
func (p *Plane) setFarm(name string, g *generation) {
	p.dropFarm(name)
	p.farms[name] = g
	p.svcIdx.add(g)
}

// dropFarm takes farm name out of p.farms and its index.
func (p *Plane) dropFarm(name string) {
	if g, ok := p.farms[name]; ok {
		p.svcIdx.remove(g)
		delete(p.farms, name)
	}
}

// unstampServices writes the values of services svcs without their stamp
// (tbl_gen 0, never trusted), before their farms' policies change: their
// packets look the policies up by key until stampServices.
func (p *Plane) unstampServices(svcs []svcRef) error {
	for _, s := range svcs {
		v := s.g.val
		v.TblIds, v.TblN, v.TblGen = [8]uint16{}, 0, 0
		if err := p.objs.XlbServices.Update(s.k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("farm %q: clear service's policies: %w", s.g.farm, err)
		}
	}
	return nil
}

// stampServices writes the values of services svcs with their policy ids
// as xlb_tbl_policy now answers them, under the refs generation.
func (p *Plane) stampServices(svcs []svcRef) error {
	for _, s := range svcs {
		if err := p.objs.XlbServices.Update(s.k, p.svcValue(s.g, s.k), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("farm %q: write service's policies: %w", s.g.farm, err)
		}
	}
	return nil
}

// refsMoved reports whether change d (its tables as they will be: tables)
// changes what xlb_tbl_policy answers for some key: a farm's policy keys or
// ids, or the order of a farm's tables. A farm changed in other ways (its
// backends) moves nothing, and no service is written again for it.
func (p *Plane) refsMoved(d plan.TableDiff, tables map[string]*model.Table) bool {
	for _, c := range d.Tables {
		if c.Old != nil && c.New != nil && c.Old.Priority != c.New.Priority {
			return true
		}
	}
	keys := func(f *model.Farm) []xlbSvcKey {
		if f == nil || len(f.Policies) == 0 {
			return nil
		}
		return policyKeys(f)
	}
	for _, c := range d.Farms {
		ko, kn := keys(c.Old), keys(c.New)
		if !slices.Equal(ko, kn) {
			return true
		}
		if len(kn) > 0 && policyValue(c.Old, p.tbls.tables) != policyValue(c.New, tables) {
			return true
		}
	}
	return false
}
