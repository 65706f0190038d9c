package ebpf

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Farms chosen by source table (model.Farm.SourceTable) share a service
// key (VIP, protocol, port) with each other and with at most one farm
// without a source table. Each such farm has a tag (1-31), stable while it
// stays, that its generation's keys carry in svc_key.family's bits 3-7, so
// its services sit in xlb_services beside the default farm's. xlb_tbl_steer
// maps the untagged key to the farms' (table id, tag) in plan.SourceOrder;
// the program tries their tables for a new flow's client (svc_lookup in
// bpf/xlb_tables.h) and looks the service up with the first match's tag.
// A flow keeps its service in conntrack; a table's change steers the next
// new flows at once (the tables are looked up live, a swap rebinds ids).

const (
	svcTagShift  = uint8(xlbXlbTblSizeXLB_TBL_SIZE_SVC_TAG_SHIFT)
	maxSvcTag    = 31
	maxSources   = int(xlbXlbTblSizeXLB_TBL_SIZE_SOURCE_FARMS)
	tblConfSteer = uint32(xlbXlbTblConfFlagXLB_TBL_CONF_STEER)
)

// sourceState is what the plane has applied of farms chosen by source
// table.
type sourceState struct {
	farms map[string]*model.Farm    // by name
	tags  map[string]uint8          // farm -> its keys' tag
	steer map[xlbSvcKey]xlbTblSteer // xlb_tbl_steer as written
}

func (s *sourceState) reset() {
	s.farms = map[string]*model.Farm{}
	s.tags = map[string]uint8{}
	s.steer = map[xlbSvcKey]xlbTblSteer{}
}

// checkSource refuses what this plane does not do with a source table.
func checkSource(f *model.Farm) error {
	if f.SourceTable == "" {
		return nil
	}
	if f.Mode != model.ModeSNAT && f.Mode != model.ModeDNAT {
		return dataplane.Refuse(f, "source-table", f.SourceTable,
			"the ebpf data plane chooses farms by source table in modes snat and dnat (mode "+f.Mode.String()+" is not)")
	}
	if f.Family == model.FamilyDual {
		return dataplane.Refuse(f, "source-table", f.SourceTable,
			"the ebpf data plane chooses farms of family ipv4 or ipv6 by source table, not dual ones: make one farm per family")
	}
	return nil
}

// tagKeys puts the farm's tag into its service keys (generation.plan).
func (p *Plane) tagKeys(f *model.Farm, keys []xlbSvcKey) {
	tag := p.srcs.tags[f.Name]
	if f.SourceTable == "" || tag == 0 {
		return
	}
	for i := range keys {
		keys[i].Family |= tag << svcTagShift
	}
}

// applySources brings the tags and xlb_tbl_steer to the farms chosen by
// source table after changes (with the tables as they will be). It runs
// before the farms' generations are written (ApplyTables comes before
// Apply), so a new farm's keys carry its tag. It returns what takes it
// back.
func (p *Plane) applySources(changes []plan.FarmChange, tables map[string]*model.Table) (func(), error) {
	s := &p.srcs
	farms, tags := maps.Clone(s.farms), maps.Clone(s.tags)
	for _, c := range changes {
		if c.Old != nil && c.Old.SourceTable != "" {
			delete(farms, c.Old.Name)
		}
		if c.New != nil && c.New.SourceTable != "" {
			farms[c.New.Name] = c.New
		}
	}
	for name := range tags {
		if farms[name] == nil {
			delete(tags, name)
		}
	}
	// Farms by untagged key.
	byKey := map[xlbSvcKey][]*model.Farm{}
	for _, f := range farms {
		for _, k := range policyKeys(f) {
			byKey[k] = append(byKey[k], f)
		}
	}
	// A tag for each farm without one: free on every key it serves.
	for _, name := range sortedNames(farms) {
		if tags[name] != 0 {
			continue
		}
		used := map[uint8]bool{}
		for _, k := range policyKeys(farms[name]) {
			for _, o := range byKey[k] {
				used[tags[o.Name]] = true
			}
		}
		for tag := uint8(1); tag <= maxSvcTag; tag++ {
			if !used[tag] {
				tags[name] = tag
				break
			}
		}
		if tags[name] == 0 {
			return nil, dataplane.Refuse(farms[name], "source-table", farms[name].SourceTable,
				fmt.Sprintf("the ebpf data plane chooses among at most %d farms by source table on one address, protocol and port", maxSources))
		}
	}
	steer := map[xlbSvcKey]xlbTblSteer{}
	for k, fs := range byKey {
		order := plan.SourceOrder(fs, tables)
		if len(order) > maxSources {
			return nil, dataplane.Refuse(order[maxSources], "source-table", order[maxSources].SourceTable,
				fmt.Sprintf("the ebpf data plane chooses among at most %d farms by source table on one address, protocol and port", maxSources))
		}
		var v xlbTblSteer
		for i, f := range order {
			v.Ids[i], v.Tags[i] = tables[f.SourceTable].ID, tags[f.Name]
			v.N++
		}
		steer[k] = v
	}
	old := s.steer
	if err := p.writeSteer(old, steer); err != nil {
		_ = p.writeSteer(steer, old)
		return nil, err
	}
	oldFarms, oldTags := s.farms, s.tags
	s.farms, s.tags, s.steer = farms, tags, steer
	return func() {
		_ = p.writeSteer(steer, old)
		s.farms, s.tags, s.steer = oldFarms, oldTags, old
	}, nil
}

// writeSteer changes xlb_tbl_steer from what holds (as written) to want.
func (p *Plane) writeSteer(have, want map[xlbSvcKey]xlbTblSteer) error {
	for k, v := range want {
		if hv, ok := have[k]; ok && hv == v {
			continue
		}
		if err := p.objs.XlbTblSteer.Update(k, v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write source tables of %s port %d: %w", wordsAddr(k.Addr, k.Family), be16(k.Port), err)
		}
	}
	for k := range have {
		if _, ok := want[k]; ok {
			continue
		}
		if err := p.objs.XlbTblSteer.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove source tables of %s port %d: %w", wordsAddr(k.Addr, k.Family), be16(k.Port), err)
		}
	}
	return nil
}

// reconcileSources makes xlb_tbl_steer hold exactly the steering of these
// farms (ReconcileTables: at start, and on repair). Farms the plane knows
// keep their tags (their services are in xlb_services under them); a
// started plane gives them anew, and Reconcile rewrites the services.
func (p *Plane) reconcileSources(farms []*model.Farm, tables map[string]*model.Table) error {
	tags := p.srcs.tags
	p.srcs.reset()
	p.srcs.tags = tags
	have := map[xlbSvcKey]xlbTblSteer{}
	var k xlbSvcKey
	var v xlbTblSteer
	it := p.objs.XlbTblSteer.Iterate()
	for it.Next(&k, &v) {
		have[k] = v
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read source tables: %w", err)
	}
	var changes []plan.FarmChange
	for _, f := range farms {
		if f.SourceTable != "" {
			changes = append(changes, plan.FarmChange{New: f})
		}
	}
	p.srcs.steer = have
	_, err := p.applySources(changes, tables)
	return err
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
