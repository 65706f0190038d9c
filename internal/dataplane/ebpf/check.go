package ebpf

import (
	"fmt"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Name is the data plane's name as users select it.
const Name = "ebpf"

func unsupported(f *model.Farm, field, value string) error {
	return dataplane.Unsupported(Name, f, field, value)
}

// Check refuses farms that use what this data plane does not implement. It
// does not touch the kernel.
func (p *Plane) Check(f *model.Farm) error { return check(f) }

func check(f *model.Farm) error {
	if f.StlsAtIngress() {
		// Natural here (tc ingress, bpf_redirect and a MAC rewrite both
		// ways, the clients' MACs in an LRU map) but not built.
		return dataplane.Refuse(f, "iface", f.Iface,
			"mode stlsdnat at ingress (forwarding frames at layer 2 from iface to oface and replies back, as nftlb does) is not built in the "+Name+" data plane; use --dataplane nft, or leave iface, oface and ether-addr unset for stlsdnat routed by the kernel")
	}
	// intra-connect off: the socket programs (socklb.go) skip the farm;
	// a backend's source-addr is its snat source (generation.go); mode
	// local passes the farm's packets to the node (xlb_lb.c).
	if err := dataplane.CheckNftlbFields(Name, f, "intra-connect", "backends.source-addr", "mode", "sessions", "new-rtlimit", "rst-rtlimit"); err != nil {
		return err
	}
	if err := checkSource(f); err != nil { // sourcetable.go
		return err
	}
	if len(f.Sessions) > 0 && f.Mode == model.ModeStlsDNAT {
		return dataplane.Refuse(f, "sessions", f.Sessions[0].Client,
			"stlsdnat farms keep no persistence on the ebpf data plane: static sessions are for snat, dnat and dsr farms")
	}
	if f.Mode == model.ModeLocal && (f.Log != 0 || f.Persistence != 0 || len(f.Sessions) > 0 || f.Check != nil && f.Check.Passive != nil) {
		return dataplane.Refuse(f, "mode", f.Mode.String(),
			"a local farm of the ebpf data plane passes its packets to the node's own sockets: it tracks, logs and persists no connections (no log, persistence or passive check)")
	}
	if f.Family == model.FamilyDual {
		// Programmed as its halves (plan.Halves), one per VIP, each
		// served by the backends of its family: no translation between
		// families is needed.
		if !plan.IsDual(f) {
			return dataplane.Refuse(f, "family", f.Family.String(),
				"the "+Name+" data plane serves a dual farm with an IPv4 and an IPv6 virtual-addr (e.g. \"10.0.0.1,fd00::1\"), each by the backends of its family: it does not translate between families")
		}
		for _, h := range plan.Halves(f) {
			if err := check(h); err != nil {
				return err
			}
		}
		return nil
	}
	if f.Family != model.FamilyIPv4 && f.Family != model.FamilyIPv6 {
		return unsupported(f, "family", f.Family.String())
	}
	if f.IsMarkFarm() {
		// tcx ingress runs before netfilter (ingress, prerouting), where
		// the user's rules set the marks such farms are chosen by.
		return dataplane.Refuse(f, "mark", fmt.Sprint(f.Mark),
			"a firewall-mark farm is chosen by the mark the host's netfilter rules set, and the ebpf data plane sees each packet at tcx ingress, before netfilter has marked it: use the nft data plane, or a virtual-addr")
	}
	if f.Mark != 0 {
		// The nft plane refuses a farm mark beside a virtual-addr too.
		return unsupported(f, "mark", fmt.Sprint(f.Mark))
	}
	v6 := f.Family == model.FamilyIPv6
	if f.VirtualAddr.Is6() != v6 {
		return unsupported(f, "virtual-addr", f.VirtualAddr.String())
	}
	if f.Protocol != model.ProtoTCP && f.Protocol != model.ProtoUDP {
		return unsupported(f, "protocol", f.Protocol.String())
	}
	switch f.Mode {
	case model.ModeSNAT, model.ModeDNAT, model.ModeDSR, model.ModeLocal:
	case model.ModeStlsDNAT:
		// Without conntrack every packet is scheduled: only a hash keeps a
		// TCP connection on one backend.
		if f.Protocol == model.ProtoTCP && (f.Scheduler == model.SchedRR || f.Scheduler == model.SchedWeight) {
			return dataplane.Refuse(f, "scheduler", f.Scheduler.String(),
				"stlsdnat schedules every packet: with tcp use hash, symhash or maglev so a connection stays on one backend")
		}
	default:
		return unsupported(f, "mode", f.Mode.String())
	}
	switch f.Scheduler {
	case model.SchedRR, model.SchedWeight:
	case model.SchedMaglev:
	case model.SchedLC, model.SchedWLC:
		if err := checkLC(f); err != nil {
			return err
		}
	case model.SchedHash:
		// srcmac: the program hashes the flow's IP tuple only (a source
		// MAC is the last hop's, different on every node; see plan.HashTable).
		if f.SchedParam&model.KeySrcMAC != 0 {
			return unsupported(f, "sched-param", f.SchedParam.String())
		}
	case model.SchedSymhash:
		// Address and port pairs, the same both ways.
		if f.SchedParam&model.KeySrcMAC != 0 {
			return unsupported(f, "sched-param", f.SchedParam.String())
		}
	default:
		return unsupported(f, "scheduler", f.Scheduler.String())
	}
	if f.Persistence&^(model.KeySrcIP|model.KeySrcPort) != 0 {
		return unsupported(f, "persistence", f.Persistence.String())
	}
	if f.Helper != model.HelperNone {
		return dataplane.Refuse(f, "helper", f.Helper.String(),
			"is not possible with the ebpf data plane: conntrack helpers are part of "+
				"netfilter's connection tracking, which this data plane bypasses; use the nft data plane")
	}
	if f.Log != 0 && f.Mode == model.ModeStlsDNAT {
		// The connection log is a record per new connection.
		return dataplane.Refuse(f, "log", f.Log.String(),
			"stlsdnat keeps no connections to log with the ebpf data plane: use dnat, or log none")
	}
	for _, l := range []struct {
		field string
		v     uint32
	}{{"new-rtlimit", f.NewRTLimit}, {"rst-rtlimit", f.RstRTLimit}} {
		if l.v != 0 && (f.Mode == model.ModeStlsDNAT || f.Mode == model.ModeLocal) {
			// The per-client limits count the flows the program starts
			// and their resets (bpf/xlb_climit.h); it keeps none of these
			// modes'.
			return dataplane.Refuse(f, l.field, fmt.Sprint(l.v),
				"is not built for mode "+f.Mode.String()+" with the ebpf data plane (it tracks no flows of it): use dnat, snat or dsr, or the nft data plane")
		}
	}
	for _, l := range []struct {
		field string
		v     uint32
	}{
		{"est-connlimit", f.EstConnLimit},
	} {
		if l.v != 0 {
			return unsupported(f, l.field, fmt.Sprint(l.v))
		}
	}
	if f.TCPStrict {
		return unsupported(f, "tcp-strict", "on")
	}
	if err := checkPolicies(f); err != nil {
		return err
	}
	// nftlb's dsr overrides: this plane finds next hops with
	// bpf_fib_lookup and has no place to take them from the farm.
	for _, x := range []struct{ field, value string }{{"iface", f.Iface}, {"oface", f.Oface}, {"ether-addr", f.EtherAddr.String()}} {
		if x.value != "" {
			return unsupported(f, x.field, x.value)
		}
	}
	if f.SourceAddr.IsValid() && f.SourceAddr.Is6() != v6 {
		return unsupported(f, "source-addr", f.SourceAddr.String())
	}
	ports := 0
	for _, r := range f.VirtualPorts {
		ports += int(r.Last) - int(r.First) + 1
	}
	if ports > maxPortsPerFarm {
		return dataplane.Refuse(f, "virtual-ports", fmt.Sprint(ports, " ports"),
			fmt.Sprintf("the ebpf data plane takes at most %d ports per farm (leave it empty for every port)", maxPortsPerFarm))
	}
	for _, b := range f.Backends {
		if b.Addr.Is6() != v6 {
			return dataplane.RefuseBackend(f, b.Name, "ip-addr", b.Addr.String(),
				"must be of the farm's family with the ebpf data plane (no translation between IPv4 and IPv6)")
		}
		if f.Mode == model.ModeDSR && b.Port != 0 &&
			(len(f.VirtualPorts) != 1 || f.VirtualPorts[0].First != f.VirtualPorts[0].Last || f.VirtualPorts[0].First != b.Port) {
			return dataplane.RefuseBackend(f, b.Name, "port", fmt.Sprint(b.Port),
				"dsr keeps the packet's destination port: leave it 0, or make it the farm's one virtual port")
		}
		if f.Mode == model.ModeStlsDNAT && b.Port != 0 &&
			(len(f.VirtualPorts) != 1 || f.VirtualPorts[0].First != f.VirtualPorts[0].Last) {
			return dataplane.RefuseBackend(f, b.Name, "port", fmt.Sprint(b.Port),
				"stlsdnat maps replies back statelessly: a backend port needs a farm with one virtual port (or leave it 0)")
		}
		if b.SourceAddr.IsValid() && (f.Mode != model.ModeSNAT || b.SourceAddr.Is6() != v6) {
			return dataplane.RefuseBackend(f, b.Name, "source-addr", b.SourceAddr.String(),
				"a backend's source-addr applies to snat farms only (nftlb ignores it in other modes), and must be of the farm's family")
		}
		if b.Mark != 0 && f.Mode == model.ModeStlsDNAT {
			// A flow's mark is kept in its conntrack entry (as the
			// nft plane's ct mark), and stlsdnat keeps none.
			return dataplane.RefuseBackend(f, b.Name, "mark", fmt.Sprint(b.Mark),
				"needs a mode that tracks connections (snat, dnat, dsr) on the ebpf data plane: stlsdnat keeps no flow to mark")
		}
		if !b.EtherAddr.IsZero() {
			return dataplane.RefuseBackend(f, b.Name, "ether-addr", b.EtherAddr.String(),
				"is not implemented by the ebpf data plane (it finds backend MACs with bpf_fib_lookup)")
		}
		if b.EstConnLimit != 0 {
			return dataplane.RefuseBackend(f, b.Name, "est-connlimit", fmt.Sprint(b.EstConnLimit),
				"is not implemented by the ebpf data plane yet")
		}
	}
	if len(f.Backends) > maxBackendsPerFarm {
		return unsupported(f, "backends", fmt.Sprint(len(f.Backends)))
	}
	return nil
}

// maxBackendsPerFarm: every backend needs at least one slot of the
// weighted slot table.
const maxBackendsPerFarm = plan.MaxWeightedSlots

// checkLC refuses an lc or wlc farm the program cannot schedule: the
// program counts active TCP connections only (a UDP flow has no close to
// count down on; docs/dataplane-ebpf.md), stlsdnat keeps no connections,
// and lc_pick (bpf/xlb_lc.h) looks at XLB_LC_MAX_BACKENDS backends at most.
func checkLC(f *model.Farm) error {
	s := f.Scheduler.String()
	if f.Protocol != model.ProtoTCP {
		return dataplane.Refuse(f, "scheduler", s,
			"counts active TCP connections per backend; protocol "+f.Protocol.String()+" has none to count on the ebpf data plane: use protocol tcp, or rr, weight, hash, symhash or maglev")
	}
	if f.Mode == model.ModeStlsDNAT {
		return dataplane.Refuse(f, "scheduler", s,
			"stlsdnat keeps no connections to count: use dnat, snat or dsr, or a hash scheduler")
	}
	if len(f.Backends) > int(lcMaxBackends) {
		return dataplane.Refuse(f, "scheduler", s,
			fmt.Sprintf("the ebpf data plane's %s looks at each backend on every new connection and takes at most %d backends (XLB_LC_MAX_BACKENDS); this farm has %d: use weight or maglev, or split the farm",
				s, lcMaxBackends, len(f.Backends)))
	}
	return nil
}
