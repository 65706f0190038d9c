package kube

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// kube-proxy's clusterCIDR (its LocalTrafficDetector): traffic from the
// Pods' addresses is told apart from the rest. Built: a Service with
// externalTrafficPolicy Local sends Pods reaching its external addresses
// (NodePorts, external and load balancer IPs) to every endpoint,
// unmasqueraded ("short-circuit pod traffic"), as if they had gone out to
// the load balancer and back; other clients get the node's local
// endpoints. In xlb that is a farm chosen by source table
// (docs/tables.md): next to the address's farm, a farm of kind
// "<kind>-pods" whose source-table is the cluster CIDR table, in dnat.
//
// Not built: kube-proxy's masquerade of clients outside the cluster CIDR
// to cluster IPs. It would be a default farm in snat beside a Pods' farm
// in dnat, and the nft plane applies the default farm's snat (keyed by
// VIP, protocol and port at postrouting) to every farm of the key, so the
// Pods would be masqueraded too (seen in TestKubeProxyScenarios). The
// node's own connections are not steered by source on either plane
// (docs/kube-proxy.md notes 7 and 8).

// ClusterCIDRTableName is the table of the cluster CIDRs.
const ClusterCIDRTableName = "xlb-kube.cluster-cidr"

// podsKindSuffix ends the kind part of a Pods' farm's name.
const podsKindSuffix = "-pods"

// podsFarm is the farm serving clients in the cluster CIDR at f's address:
// f's settings, mode dnat, the given backends. Not made for what farms
// chosen by source table cannot be (modes dsr and stlsdnat, a firewall
// mark, annotations' settings the engine refuses on them are found when
// it is put).
func podsFarm(svc *corev1.Service, sp *corev1.ServicePort, sa ServiceAddr, f *model.Farm, bes []model.Backend) (model.Farm, bool) {
	if f.Mode != model.ModeSNAT && f.Mode != model.ModeDNAT {
		return model.Farm{}, false
	}
	pf := f.Clone()
	pf.Name = FarmName(svc.Namespace, svc.Name, portID(sp), sa.Kind+podsKindSuffix, sa.Addr)
	pf.Mode = model.ModeDNAT
	pf.Backends = slices.Clone(bes)
	pf.SourceTable = ClusterCIDRTableName
	pf.Policies = nil
	return pf, true
}

// isPodsFarm reports whether f is a Pods' farm.
func isPodsFarm(f *model.Farm) bool { return f.SourceTable == ClusterCIDRTableName }

// dropPodsFarmsBesidePolicies removes the Pods' farms whose address's farm
// has policies (loadBalancerSourceRanges): farms sharing an address by
// source table may not have any, and the policy matters more. The Pods'
// traffic then takes the address's farm, as without a cluster CIDR.
func dropPodsFarmsBesidePolicies(farms []model.Farm) []model.Farm {
	withPolicies := map[string]bool{}
	for i := range farms {
		if len(farms[i].Policies) > 0 {
			withPolicies[farmKey(&farms[i])] = true
		}
	}
	if len(withPolicies) == 0 {
		return farms
	}
	return removePodsFarms(farms, func(k string) bool { return withPolicies[k] })
}

// withoutPodsFarms takes every Pods' farm out.
func withoutPodsFarms(farms []model.Farm) []model.Farm {
	return removePodsFarms(farms, func(string) bool { return true })
}

// removePodsFarms takes out the Pods' farms whose key drop says.
func removePodsFarms(farms []model.Farm, drop func(key string) bool) []model.Farm {
	if farms == nil {
		return nil
	}
	return slices.DeleteFunc(farms, func(f model.Farm) bool { return isPodsFarm(&f) && drop(farmKey(&f)) })
}

// farmKey is a farm's address, protocol and ports: what the farms chosen
// by source table share.
func farmKey(f *model.Farm) string {
	var b strings.Builder
	b.WriteString(f.VirtualAddr.String())
	b.WriteByte('/')
	b.WriteString(f.Protocol.String())
	for _, p := range f.VirtualPorts {
		b.WriteByte('/')
		b.WriteString(p.String())
	}
	return b.String()
}

// clusterCIDRTable is the source table and its entries.
func clusterCIDRTable(node Node) (model.Table, []model.EntryInput) {
	t := model.NewTable(ClusterCIDRTableName, model.TableAddr)
	var entries []model.EntryInput
	for _, p := range node.ClusterCIDRs {
		entries = append(entries, model.EntryInput{Key: p.String()})
	}
	return t, entries
}

// prepareClusterCIDR puts the cluster CIDR table into tx when one of the
// plan's farms chooses its clients by it and tx does not hold it as it
// should be. If the engine or the plane refuses it, the Pods' farms are
// left out (their clients take the address's farm, as without a cluster
// CIDR); only a kernel or disk failure is an error.
func (p *servicePlan) prepareClusterCIDR(tx *engine.Txn, node Node) error {
	uses := func(farms []model.Farm) bool {
		return slices.ContainsFunc(farms, func(f model.Farm) bool { return isPodsFarm(&f) })
	}
	if !uses(p.defaults) && !uses(p.annotated) {
		return nil
	}
	t, entries := clusterCIDRTable(node)
	refused, err := putTable(tx, t, entries)
	if refused == nil || err != nil {
		return err
	}
	p.defaults, p.annotated = withoutPodsFarms(p.defaults), withoutPodsFarms(p.annotated)
	return nil
}
