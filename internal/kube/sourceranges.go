package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// loadBalancerSourceRanges, as kube-proxy: traffic to a LoadBalancer IP
// from a source outside the ranges is dropped; cluster IPs, NodePorts and
// external IPs are not filtered. In xlb the ranges are one allow-list
// table per Service (a named table with verdict allow, docs/tables.md),
// attached as a policy to the Service's lb farms. As kube-proxy, which
// proxies each family apart:
//
//   - a family the ranges do not name is not filtered (kube-proxy's proxier
//     of that family sees no ranges);
//   - when a range holds a node address, the load balancer IPs are
//     allowed too (a node reaching a VIP-like load balancer IP that is
//     local to it comes from that IP: kube-proxy's allowFromNode).

// sourceRangesSuffix ends the name of every table the proxy owns.
const sourceRangesSuffix = ".lb-source-ranges"

// SourceRangesTableName names the allow-list table of Service
// namespace/name: "<namespace>.<name>.lb-source-ranges", its head cut and
// hashed (as FarmName) when longer than a table name may be.
func SourceRangesTableName(namespace, name string) string {
	head := namespace + "." + name
	full := head + sourceRangesSuffix
	if len(full) <= model.MaxTableNameLen {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	keep := model.MaxTableNameLen - len(sourceRangesSuffix) - 9
	return head[:keep] + "-" + hex.EncodeToString(sum[:4]) + sourceRangesSuffix
}

// sourceRanges is a Service's allow list: the table and its entries.
type sourceRanges struct {
	table   model.Table
	entries []model.EntryInput
	// families names the families the ranges name (the lb farms of
	// these get the policy).
	v4, v6 bool
}

// parseSourceRanges reads spec.loadBalancerSourceRanges of a LoadBalancer
// Service; nil when it has none. A value that is not a CIDR is refused
// naming it (the API server validates the field, so only an old object
// can carry one).
func parseSourceRanges(svc *corev1.Service, node Node) (*sourceRanges, error) {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Spec.LoadBalancerSourceRanges) == 0 {
		return nil, nil
	}
	sr := &sourceRanges{table: model.NewTable(SourceRangesTableName(svc.Namespace, svc.Name), model.TableAddr)}
	sr.table.Verdict = model.ListAllow
	seen := map[netip.Prefix]bool{}
	add := func(p netip.Prefix) {
		if seen[p] {
			return
		}
		seen[p] = true
		sr.entries = append(sr.entries, model.EntryInput{Key: p.String()})
		if p.Addr().Is4() {
			sr.v4 = true
		} else {
			sr.v6 = true
		}
	}
	var fromNode bool
	for i, v := range svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(v))
		if err != nil {
			return nil, &UnsupportedError{Field: fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), Value: v, Problem: "must be a CIDR such as 192.168.0.0/16 or 2001:db8::/64"}
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked()
		add(p)
		if slices.ContainsFunc(node.Addrs, p.Contains) {
			fromNode = true
		}
	}
	if fromNode {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(ing.IP); err == nil {
				a = a.Unmap()
				add(netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	return sr, nil
}

// unmapBits is what unmapping an IPv4-mapped prefix takes off its length.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

// attach adds the allow list as a policy to the lb farms of the families
// it names.
func (sr *sourceRanges) attach(farms []model.Farm) {
	for i := range farms {
		f := &farms[i]
		if !isKind(f, KindLB) {
			continue
		}
		if (f.VirtualAddr.Is4() && sr.v4) || (f.VirtualAddr.Is6() && sr.v6) {
			f.Policies = append(f.Policies, model.PolicyRef{Name: sr.table.Name})
		}
	}
}

// isKind reports whether a farm (named by FarmName) is of kind k.
func isKind(f *model.Farm, k Kind) bool {
	return strings.HasSuffix(f.Name, "."+string(k)+"-"+strings.ReplaceAll(f.VirtualAddr.String(), ":", "-"))
}

// put puts the table and its entries into tx, unless tx holds them
// already (a sync of the Service for an endpoint change then leaves the
// table alone: no kernel or disk work).

// dropSourceRanges destroys the Service's allow list in tx if it has one
// and no longer wants it (called once its farms no longer attach it).
func dropSourceRanges(tx *engine.Txn, key string, want *sourceRanges) error {
	ns, name, _ := strings.Cut(key, "/")
	tn := SourceRangesTableName(ns, name)
	if want != nil && want.table.Name == tn {
		return nil
	}
	if _, ok := tx.Table(tn); !ok {
		return nil
	}
	return tx.DestroyTable(tn)
}

// prepareRanges puts the Service's allow list into tx. If the engine or
// the data plane refuses it (the ebpf plane keeps no named tables yet),
// the lb farms that would attach it are left out and the refusal is
// returned for the Service's Event: a load balancer IP is not served
// rather than served to every source (kube-proxy drops what the ranges do
// not admit). Only a kernel or disk failure is returned as err.
func (p *servicePlan) prepareRanges(tx *engine.Txn) (refused, err error) {
	if p.ranges == nil {
		return nil, nil
	}
	perr, err := putTable(tx, p.ranges.table, p.ranges.entries)
	if perr == nil || err != nil {
		return nil, err
	}
	strip := func(farms []model.Farm) []model.Farm {
		return slices.DeleteFunc(farms, func(f model.Farm) bool {
			return slices.Contains(f.Policies, model.PolicyRef{Name: p.ranges.table.Name})
		})
	}
	p.annotated, p.defaults = strip(p.annotated), strip(p.defaults)
	p.ranges = nil
	return fmt.Errorf("loadBalancerSourceRanges: %w; the load balancer IPs are not served", perr), nil
}

// dropStaleSourceRanges destroys the allow lists of Services not in keys
// (deleted while the proxy was down), once no farm attaches them.
func dropStaleSourceRanges(tx *engine.Txn, tables []*model.Table, keys []string) error {
	want := map[string]bool{}
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		want[SourceRangesTableName(ns, name)] = true
	}
	for _, t := range tables {
		if strings.HasSuffix(t.Name, sourceRangesSuffix) && !want[t.Name] {
			if err := tx.DestroyTable(t.Name); err != nil {
				return err
			}
		}
	}
	return nil
}
