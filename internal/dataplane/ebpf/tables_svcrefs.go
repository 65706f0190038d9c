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
// xlb_tbl_conf: before any farm's policies change the generation moves on
// (moveRefs), so packets look the policies up by key as before until every
// service's value is written again with the new ids (restampServices). A
// swap or a change of a table's entries keeps every id, and touches no
// service.

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

// moveRefs moves the refs generation on and writes it, so no service's
// policy ids are trusted until restampServices: called before a change of
// farms' policies.
func (p *Plane) moveRefs() error {
	t := &p.tbls
	t.refs = t.refs%tblRefsMax + 1
	return p.writeConf()
}

// restampServices writes every service's value again with its policy ids
// under the current refs generation (a key at a time: each update is
// atomic). O(service keys), only when farms' policies changed.
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
