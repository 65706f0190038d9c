package nft

import (
	"fmt"
	"net/netip"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// implementedNftlbFields are the nftlb 1.0 fields beyond the core model
// that this plane implements (model.Farm.NftlbFieldInUse): rate units,
// limits-ttl, the limits' verdict and log prefixes and log-rtlimit
// (clientlimits.go, verdict.go), queue (queue.go), backend source-addr
// (backendsnat.go), mode local (local.go), static sessions
// (staticsessions.go), intra-connect off (intraconnect.go), further
// addresses (checkAddresses), stlsdnat at ingress (stlsingress.go).
var implementedNftlbFields = []string{"new-rtlimit", "rst-rtlimit", "log-rtlimit", "limits-ttl",
	"new-rtlimit-log-prefix", "rst-rtlimit-log-prefix", "est-connlimit-log-prefix", "tcp-strict-log-prefix",
	"verdict", "backends.est-connlimit-log-prefix", "queue", "backends.source-addr", "mode", "sessions", "intra-connect",
	"addresses", "iface"}

// check refuses every farm field value this data plane does not implement.
func check(f *model.Farm) error {
	no := func(field, value string) error { return dataplane.Unsupported(PlaneName, f, field, value) }
	if err := dataplane.CheckNftlbFields(PlaneName, f, implementedNftlbFields...); err != nil {
		return err
	}
	if err := checkAddresses(f); err != nil {
		return err
	}
	if f.IntraConnectOff && f.IsMarkFarm() {
		return dataplane.Refuse(f, "intra-connect", "off",
			"a firewall-mark farm takes the packets your own rules mark: leave the LB host's own packets unmarked instead")
	}
	if f.Verdict != model.DefaultVerdict && len(f.Policies) > 0 {
		return dataplane.Refuse(f, "verdict", f.Verdict.String(),
			"the "+PlaneName+" data plane applies a farm's verdict to its limits and tcp-strict, not yet to its policies (each policy's type decides); use the default \"log drop accept\" on farms with policies")
	}
	if f.Check != nil && f.Check.Passive != nil && f.IsMarkFarm() {
		// Passive checks find a farm's connections by their VIP and port
		// in conntrack's events (passive.go).
		return dataplane.Refuse(f, "check.passive", "{...}",
			"passive checks on the "+PlaneName+" plane watch farms by their virtual address: not firewall-mark farms; use active checks, or the ebpf data plane")
	}
	if f.Scheduler == model.SchedLC || f.Scheduler == model.SchedWLC {
		// nftables picks a map element by a number (numgen, jhash) and
		// cannot read a count of open connections per backend at that
		// point: ct count is a limit per element, not a value to sort
		// by. The eBPF program keeps such a count in its data path.
		return dataplane.Refuse(f, "scheduler", f.Scheduler.String(),
			"least-connection scheduling needs the ebpf data plane (--dataplane ebpf), which counts active connections per backend; the "+PlaneName+" data plane has rr, weight, hash, symhash and maglev")
	}
	switch {
	case !f.VirtualAddr.IsValid() && !f.IsMarkFarm():
		return no("virtual-addr", "")
	case f.IsMarkFarm() && (f.Family == model.FamilyDual || f.Helper != model.HelperNone || f.TCPStrict || f.RstRTLimit != 0 || f.Log != 0):
		return dataplane.Refuse(f, "mark", fmt.Sprint(f.Mark),
			"firewall-mark farms in the "+PlaneName+" data plane do not take family dual, helper, tcp-strict, rst-rtlimit or log yet")
	case f.Family == model.FamilyDual:
		return checkDual(f)
	case f.Mode == model.ModeLocal && (f.IsMarkFarm() || f.Log != 0):
		return dataplane.Refuse(f, "mode", f.Mode.String(),
			"local farms in the "+PlaneName+" data plane are VIP farms without log (a packet for a local socket never reaches the postrouting hook where farms log)")
	case f.Queue >= 0 && (f.IsMarkFarm() || f.Mode == model.ModeDSR || f.Mode == model.ModeStlsDNAT):
		return dataplane.Refuse(f, "queue", fmt.Sprint(f.Queue),
			"the "+PlaneName+" data plane queues the new connections of snat and dnat VIP farms (firewall-mark, dsr and stlsdnat farms are forwarded before or without its filter chain)")
	case len(f.Sessions) > 0 && (f.Mode == model.ModeLocal || f.Mode == model.ModeDSR || f.Mode == model.ModeStlsDNAT):
		return dataplane.Refuse(f, "sessions", f.Sessions[0].Client,
			"the "+PlaneName+" data plane keeps static sessions in snat and dnat farms (mode "+f.Mode.String()+" has no persistence here)")
	case f.Mode == model.ModeStlsDNAT && f.IsMarkFarm():
		return dataplane.Refuse(f, "mode", f.Mode.String(),
			"the "+PlaneName+" data plane does stlsdnat for VIP farms only (a firewall mark is set after the raw hook)")
	case f.Mode == model.ModeStlsDNAT && f.Scheduler != model.SchedHash && f.Scheduler != model.SchedSymhash && f.Scheduler != model.SchedMaglev:
		return dataplane.Refuse(f, "scheduler", f.Scheduler.String(),
			"mode stlsdnat picks a backend for every packet, so it needs a scheduler that hashes the flow: hash, symhash or maglev")
	case f.Mode == model.ModeStlsDNAT && (f.Protocol != model.ProtoTCP && f.Protocol != model.ProtoUDP):
		return dataplane.Refuse(f, "protocol", f.Protocol.String(),
			"mode stlsdnat rewrites ports and checksums of tcp or udp only")
	case f.Mode == model.ModeStlsDNAT && (f.NewRTLimit != 0 || f.RstRTLimit != 0 || f.Log != 0 || len(f.Backends) > 0 && stlsPortProblem(f)):
		return dataplane.Refuse(f, "mode", f.Mode.String(),
			"stlsdnat farms in the "+PlaneName+" data plane take no new-rtlimit, rst-rtlimit, log, backend marks or backend est-connlimit; all backends need the same port, and a port needs a single virtual port")
	case f.Persistence != 0 && persistKeySize(f) > maxKeySize:
		return dataplane.Refuse(f, "persistence", f.Persistence.String(),
			fmt.Sprintf("key is %d bytes, the %s data plane holds at most %d (e.g. srcip-srcport, srcip-dstport)", persistKeySize(f), PlaneName, maxKeySize))
	case f.Mark != 0 && !f.IsMarkFarm():
		return no("mark", fmt.Sprint(f.Mark))
	case len(f.Policies) > 0:
		if err := CheckPolicies(f); err != nil { // tables.go
			return err
		}
	}
	if f.Mode == model.ModeDSR {
		if err := dsrCheck(f); err != nil {
			return err
		}
	}
	var zeroPort, port bool
	marks := map[uint32]string{}
	for i := range f.Backends {
		b := &f.Backends[i]
		if b.Mark != 0 && marks[b.Mark] == "" {
			marks[b.Mark] = netip.AddrPortFrom(b.Addr, b.Port).String()
		}
		bno := func(field, value string) error {
			return dataplane.RefuseBackend(f, b.Name, field, value,
				"is not implemented by the "+PlaneName+" data plane yet")
		}
		switch {
		case b.Mark != 0 && marks[b.Mark] != "" && marks[b.Mark] != netip.AddrPortFrom(b.Addr, b.Port).String():
			return dataplane.RefuseBackend(f, b.Name, "mark", fmt.Sprint(b.Mark),
				"is already the mark of another backend of this farm; in the "+PlaneName+" data plane a backend mark names the backend, so marks must be unique per farm")
		case b.SourceAddr.IsValid() && (f.Mode != model.ModeSNAT || f.IsMarkFarm()):
			return dataplane.RefuseBackend(f, b.Name, "source-addr", b.SourceAddr.String(),
				"a backend's source-addr applies to snat VIP farms only (nftlb ignores it in other modes)")
		case b.SourceAddr.IsValid() && b.SourceAddr.Is4() != b.Addr.Is4():
			return dataplane.RefuseBackend(f, b.Name, "source-addr", b.SourceAddr.String(),
				"is not of the backend's family ("+b.Addr.String()+"): nftables cannot translate between families")
		case b.EstConnLimit != 0 && f.Persistence != 0:
			return bno("est-connlimit", fmt.Sprint(b.EstConnLimit)+" with persistence")
		}
		zeroPort = zeroPort || b.Port == 0
		port = port || b.Port != 0
	}
	if zeroPort && port && !f.SinglePort() {
		return dataplane.Refuse(f, "backends.port", "0",
			"backends with port 0 (keep the client's port) and backends with a port cannot be mixed in a farm with several virtual ports or addresses in the "+PlaneName+" data plane")
	}
	return nil
}

// stlsPortProblem: the backends of a stateless farm share one port (the
// rewrite is a constant), and a farm whose backends change the port has
// one virtual port (the reverse rewrite needs to know it); no marks.
func stlsPortProblem(f *model.Farm) bool {
	single := len(f.VirtualPorts) == 1 && f.VirtualPorts[0].First == f.VirtualPorts[0].Last
	for _, b := range f.Backends {
		if b.Port != 0 && !single || b.Mark != 0 || b.EstConnLimit != 0 || b.Port != f.Backends[0].Port {
			return true
		}
	}
	return false
}

// Family dual: the plane programs a dual farm as its two halves
// (plan.Halves), one per VIP, so a dual farm has two chains, two backend
// maps and (with persistence) two session maps; its log lines name the
// half.

// checkDual refuses a dual farm the plane cannot serve and checks each half.
func checkDual(f *model.Farm) error {
	if !f.VirtualAddr2.IsValid() {
		return dataplane.Refuse(f, "family", f.Family.String(),
			"the "+PlaneName+" data plane serves a dual farm with an IPv4 and an IPv6 virtual-addr (e.g. \"10.0.0.1,fd00::1\"), each by the backends of its family: nftables cannot translate between families")
	}
	for _, h := range plan.Halves(f) {
		if err := check(h); err != nil {
			return err
		}
	}
	return nil
}

// checkAddresses refuses further addresses (nftlb's "addresses" beyond a
// farm's own) the plane cannot serve. It serves them as nftlb does: every
// address's keys go to the farm's one chain (svcElems), so scheduling,
// persistence and limits are the farm's whatever address a client used.
func checkAddresses(f *model.Farm) error {
	if len(f.Addresses) == 0 {
		return nil
	}
	a := f.Addresses[0]
	refuse := func(why string) error { return dataplane.Refuse(f, "addresses", a.Name, why) }
	switch {
	case f.IsMarkFarm() || !f.VirtualAddr.IsValid():
		return refuse("further addresses need the farm's own address first (a virtual-addr)")
	case f.Family == model.FamilyDual:
		return refuse("a family dual farm has its two VIPs as its one address; further addresses are for farms of one family")
	case f.Mode != model.ModeSNAT && f.Mode != model.ModeDNAT && f.Mode != model.ModeLocal:
		return refuse("the " + PlaneName + " data plane serves further addresses in modes snat, dnat and local (dsr and stlsdnat forward by the farm's one address at ingress and rewrite replies back to it)")
	}
	for _, a := range f.Addresses {
		refuse := func(field, value, why string) error {
			return dataplane.Refuse(f, "addresses."+field, value, fmt.Sprintf("address %q: %s", a.Name, why))
		}
		switch {
		case !a.Addr.IsValid():
			return refuse("ip-addr", "", "needs an ip-addr to be served")
		case a.Addr2.IsValid() || a.Addr.Is6() != f.VirtualAddr.Is6():
			return refuse("ip-addr", a.Addr.String(), "must be of the farm's family "+f.Family.String()+": its backends serve every address, and nftables cannot translate between families")
		case f.Helper != model.HelperNone && a.Protocol != f.Protocol:
			return refuse("protocol", a.Protocol.String(), "must be the farm's protocol "+f.Protocol.String()+": its helper "+f.Helper.String()+" is for that protocol")
		}
	}
	return nil
}
