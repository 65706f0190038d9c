package kube

import (
	"slices"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// A Service whose traffic policy is Local and whose usable endpoints are
// all on other nodes: kube-proxy drops new connections to it here (the
// Service has endpoints, just none on this node: a client retries, a
// cloud load balancer's health check moves it away), while a Service
// without any usable endpoint is rejected (ICMP unreachable, TCP reset),
// which is what a farm without backends does. The drop is an allow list
// that admits nobody, attached as a policy to such farms: both planes
// check a farm's policies before anything else (docs/tables.md), so no
// data plane needs a "drop" state of its own. One table serves every
// such farm; it holds no entries and is never destroyed (an empty table
// costs nothing and the next Service may need it).

// DropAllTableName is that allow list's name.
const DropAllTableName = "xlb-kube.no-local-endpoints"

// attachDropAll gives a farm the drop, on the modes whose policies both
// planes enforce (an annotation's dsr or stlsdnat farm keeps refusing).
func attachDropAll(f *model.Farm) {
	if f.Mode != model.ModeSNAT && f.Mode != model.ModeDNAT {
		return
	}
	f.Policies = append(f.Policies, model.PolicyRef{Name: DropAllTableName})
}

// dropAllTable is the allow list itself.
func dropAllTable() model.Table {
	t := model.NewTable(DropAllTableName, model.TableAddr)
	t.Verdict = model.ListAllow
	return t
}

// prepareDropAll puts the table into tx when one of the plan's farms
// attaches it and tx does not hold it. If the engine or the plane refuses
// it, the farms lose the policy and reject new connections as before (a
// plane without named tables); only a kernel or disk failure is an error.
func (p *servicePlan) prepareDropAll(tx *engine.Txn) error {
	uses := func(farms []model.Farm) bool {
		return slices.ContainsFunc(farms, func(f model.Farm) bool {
			return slices.Contains(f.Policies, model.PolicyRef{Name: DropAllTableName})
		})
	}
	if !uses(p.defaults) && !uses(p.annotated) {
		return nil
	}
	refused, err := putTable(tx, dropAllTable(), nil)
	if refused == nil || err != nil {
		return err
	}
	strip := func(farms []model.Farm) {
		for i := range farms {
			farms[i].Policies = slices.DeleteFunc(farms[i].Policies, func(r model.PolicyRef) bool { return r.Name == DropAllTableName })
		}
	}
	strip(p.defaults)
	strip(p.annotated)
	return nil
}
