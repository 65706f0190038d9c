package model

import (
	"fmt"
	"hash/maphash"
	"strings"
)

// ValidName reports whether s may name a farm, backend or table: 1-64 of
// [A-Za-z0-9_.-]. Names appear in URLs and log prefixes, so they are kept plain.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidIfName reports whether s may name a network interface: 1-15
// bytes (IFNAMSIZ less the NUL), not "." or "..", without '/', ':' or
// white space (the kernel's dev_valid_name, and ':' which marks aliases).
func ValidIfName(s string) bool {
	if len(s) == 0 || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	for _, c := range s {
		if c == '/' || c == ':' || c <= ' ' || c == 0x7f || c >= 0x80 {
			return false
		}
	}
	return true
}

const nameRule = "1 to 64 characters of A-Z, a-z, 0-9, '_', '.', '-'"

// Validate checks a farm on its own (cross-farm conflicts are the engine's job)
// and returns the first problem found as a *FieldError.
func (f *Farm) Validate() error {
	// The object label is built only on error (it is a Sprintf): Validate
	// runs at least twice for each farm an API call puts (decode, and the
	// engine's Put) and nearly always passes.
	bad := func(field, value, problem string) error {
		return &FieldError{Object: farmObject(f.Name), Field: field, Value: value, Problem: problem}
	}
	if !ValidName(f.Name) {
		return &FieldError{Field: "name", Value: f.Name, Problem: "must be " + nameRule}
	}
	switch {
	case f.VirtualAddr.IsValid():
		if f.VirtualAddr.Zone() != "" {
			return bad("virtual-addr", f.VirtualAddr.String(), "must not carry a zone")
		}
		if f.VirtualAddr.Is4In6() {
			return bad("virtual-addr", f.VirtualAddr.String(), "write IPv4 addresses in dotted form")
		}
		if p := addrProblem(f.VirtualAddr, true); p != "" {
			return bad("virtual-addr", f.VirtualAddr.String(), p)
		}
		if err := f.checkFamily("virtual-addr", f.VirtualAddr.Is4()); err != nil {
			return err
		}
	}
	// A farm with neither a virtual-addr nor a mark listens nowhere: it is
	// kept (nftlb keeps it too, e.g. when its backends arrive before its
	// address) and serves nothing until it gets one (Farm.Listens).
	if a := f.VirtualAddr2; a.IsValid() {
		both := f.VirtualAddr.String() + "," + a.String()
		switch {
		case f.Family != FamilyDual:
			return bad("virtual-addr", both, "two addresses need family dual (this farm has family "+f.Family.String()+")")
		case !f.VirtualAddr.IsValid():
			return bad("virtual-addr", both, "the second address needs a first")
		case a.Zone() != "" || a.Is4In6():
			return bad("virtual-addr", both, "must be plain addresses without a zone, IPv4 in dotted form")
		case a.Is4() == f.VirtualAddr.Is4():
			return bad("virtual-addr", both, "the two addresses of a dual farm must be one IPv4 and one IPv6 address")
		}
		if p := addrProblem(a, true); p != "" {
			return bad("virtual-addr", both, p)
		}
	}
	if f.SourceAddr.IsValid() {
		if err := f.checkFamily("source-addr", f.SourceAddr.Is4()); err != nil {
			return err
		}
		if p := addrProblem(f.SourceAddr, false); p != "" {
			return bad("source-addr", f.SourceAddr.String(), p)
		}
		if f.Mode != ModeSNAT {
			return bad("source-addr", f.SourceAddr.String(), "is only used by mode snat (this farm has mode "+f.Mode.String()+")")
		}
	}
	// nftlb runs dsr and stlsdnat at the netdev ingress hook, so both take
	// iface, oface and ether-addr.
	if f.Mode != ModeDSR && f.Mode != ModeStlsDNAT {
		for _, x := range []struct{ field, value string }{{"iface", f.Iface}, {"oface", f.Oface}, {"ether-addr", f.EtherAddr.String()}} {
			if x.value != "" {
				return bad(x.field, x.value, "is only used by modes dsr and stlsdnat (this farm has mode "+f.Mode.String()+")")
			}
		}
	}
	// A stlsdnat farm forwards at layer 2 only from an iface it is told:
	// without one it is routed, and oface or ether-addr would mean nothing.
	if f.Mode == ModeStlsDNAT && f.Iface == "" {
		for _, x := range []struct{ field, value string }{{"oface", f.Oface}, {"ether-addr", f.EtherAddr.String()}} {
			if x.value != "" {
				return bad(x.field, x.value, "needs iface in mode stlsdnat (the interface where clients' traffic arrives; with it the farm forwards at layer 2 from iface to oface)")
			}
		}
	}
	for _, x := range []struct{ field, value string }{{"iface", f.Iface}, {"oface", f.Oface}} {
		if x.value != "" && !ValidIfName(x.value) {
			return bad(x.field, x.value, "must be an interface name: 1 to 15 characters, no '/', ':' or white space")
		}
	}
	if f.EtherAddr[0]&1 != 0 {
		return bad("ether-addr", f.EtherAddr.String(), "must be a unicast Ethernet address (not multicast or broadcast)")
	}
	if len(f.VirtualPorts) > MaxPortRanges {
		return bad("virtual-ports", formatPorts(f.VirtualPorts), fmt.Sprintf("at most %d ports or ranges", MaxPortRanges))
	}
	for i, r := range f.VirtualPorts {
		if r.First == 0 || r.First > r.Last {
			return bad("virtual-ports", r.String(), "ports must be 1-65535 and ranges written low-high")
		}
		for _, o := range f.VirtualPorts[:i] {
			if r.Overlaps(o) {
				return bad("virtual-ports", formatPorts(f.VirtualPorts), fmt.Sprintf("%s overlaps %s", r, o))
			}
		}
	}
	if f.Scheduler == SchedHash || f.Scheduler == SchedSymhash {
		if f.SchedParam == 0 {
			// nftlb's default for hash is srcip.
			return bad("sched-param", "none", "scheduler "+f.Scheduler.String()+" needs hash keys: "+hashKeySpec.allowed())
		}
	} else if f.SchedParam != 0 {
		return bad("sched-param", f.SchedParam.String(), "is only used by schedulers hash and symhash (this farm has "+f.Scheduler.String()+")")
	}
	if f.Persistence != 0 && f.PersistTTL == 0 {
		return bad("persist-ttl", "0", "persistence needs a ttl of 1 second or more")
	}
	if err := f.validateCombinations(); err != nil {
		return err
	}
	if p := textProblem(f.LogPrefix, MaxLogPrefixLen); p != "" {
		return bad("log-prefix", f.LogPrefix, p)
	}
	// A burst without its rate is kept and has no effect (nftlb turns a
	// limit off by setting its rate to 0 and leaves the burst).
	for _, x := range []struct {
		field, value string
	}{{"new-rtlimit-log-prefix", f.NewRTLogPrefix}, {"rst-rtlimit-log-prefix", f.RstRTLogPrefix},
		{"est-connlimit-log-prefix", f.EstConnLogPrefix}, {"tcp-strict-log-prefix", f.TCPStrictLogPrefix}} {
		if p := textProblem(x.value, MaxLogPrefixLen); p != "" {
			return bad(x.field, x.value, p)
		}
	}
	if err := f.validateAddresses(); err != nil {
		return err
	}
	if err := f.validateSessions(); err != nil {
		return err
	}
	if len(f.Backends) > MaxBackends {
		return bad("backends", fmt.Sprint(len(f.Backends)), fmt.Sprintf("at most %d backends per farm", MaxBackends))
	}
	var names nameSet
	for i := range f.Backends {
		b := &f.Backends[i]
		if !names.add(f.Backends, i) {
			return bad("backends", b.Name, "backend names must be unique in a farm")
		}
		if err := f.validateBackend(b); err != nil {
			return err
		}
	}
	for _, p := range f.Policies {
		if !ValidName(p.Name) {
			return bad("policies", p.Name, "policy names must be "+nameRule)
		}
	}
	if err := f.validateSourceTable(); err != nil {
		return err
	}
	return f.validateChecks() // check.go
}

// nameSetSlots is the size of nameSet's table: twice the backends it
// holds without a map, so probes stay short.
const nameSetSlots = 512

// nameSet finds repeated backend names. A map of the names cost Validate
// about half its time and 3 allocations for a farm of 100 backends; this is
// an open-addressing table of backend indices that lives on the caller's
// stack, with a map only for farms of more than nameSetSlots/2 backends.
type nameSet struct {
	slots [nameSetSlots]uint16 // index+1 into the backends; 0: free
	big   map[string]struct{}
}

var nameSeed = maphash.MakeSeed()

// add records the name of bs[i] and reports whether it was new. It must be
// called for i = 0, 1, 2, ... in turn, with the same bs.
func (s *nameSet) add(bs []Backend, i int) bool {
	name := bs[i].Name
	if len(bs) > nameSetSlots/2 {
		if s.big == nil {
			s.big = make(map[string]struct{}, len(bs))
		}
		if _, dup := s.big[name]; dup {
			return false
		}
		s.big[name] = struct{}{}
		return true
	}
	j := maphash.String(nameSeed, name) % nameSetSlots
	for s.slots[j] != 0 {
		if bs[s.slots[j]-1].Name == name {
			return false
		}
		j = (j + 1) % nameSetSlots
	}
	s.slots[j] = uint16(i + 1)
	return true
}

// helperProtocols are the transport protocols each conntrack helper
// watches (the kernel's nf_conntrack_* helpers).
var helperProtocols = map[Helper][]Protocol{
	HelperAmanda:    {ProtoUDP},
	HelperFTP:       {ProtoTCP},
	HelperH323:      {ProtoTCP, ProtoUDP},
	HelperIRC:       {ProtoTCP},
	HelperNetbiosNS: {ProtoUDP},
	HelperPPTP:      {ProtoTCP},
	HelperSane:      {ProtoTCP},
	HelperSIP:       {ProtoTCP, ProtoUDP},
	HelperSNMP:      {ProtoUDP},
	HelperTFTP:      {ProtoUDP},
}

// HelperProtocols returns the protocols a helper works with.
func HelperProtocols(h Helper) []Protocol { return helperProtocols[h] }

// validateCombinations refuses fields that are valid alone but not
// together.
func (f *Farm) validateCombinations() error {
	bad := func(field, value, problem string) error {
		return &FieldError{Object: farmObject(f.Name), Field: field, Value: value, Problem: problem}
	}
	const ports = KeySrcPort | KeyDstPort
	if f.Persistence&ports != 0 && f.Protocol == ProtoAll {
		return bad("persistence", persistenceName(f.Persistence), "keys srcport and dstport need a protocol with ports (tcp, udp or sctp); this farm has protocol all")
	}
	if f.Scheduler == SchedHash && f.SchedParam&ports != 0 && f.Protocol == ProtoAll {
		return bad("sched-param", f.SchedParam.String(), "keys srcport and dstport need a protocol with ports (tcp, udp or sctp); this farm has protocol all")
	}
	if f.Mode == ModeStlsDNAT {
		// Stateless: no conntrack entry to hang anything on.
		switch {
		case f.Persistence != 0:
			return bad("persistence", persistenceName(f.Persistence), "mode stlsdnat keeps no state; persistence needs mode snat, dnat or dsr")
		case f.Helper != HelperNone:
			return bad("helper", f.Helper.String(), "mode stlsdnat bypasses conntrack; helpers need mode snat or dnat")
		case f.EstConnLimit != 0:
			return bad("est-connlimit", fmt.Sprint(f.EstConnLimit), "mode stlsdnat bypasses conntrack; est-connlimit needs mode snat, dnat or dsr")
		case f.TCPStrict:
			return bad("tcp-strict", "on", "mode stlsdnat bypasses conntrack; tcp-strict needs mode snat, dnat or dsr")
		}
	}
	if f.Helper != HelperNone {
		allowed := helperProtocols[f.Helper]
		ok := false
		var names []string
		for _, p := range allowed {
			ok = ok || p == f.Protocol
			names = append(names, p.String())
		}
		if !ok {
			return bad("helper", f.Helper.String(), fmt.Sprintf("works with protocol %s; this farm has protocol %s", strings.Join(names, " or "), f.Protocol))
		}
		if f.Mode == ModeDSR {
			return bad("helper", f.Helper.String(), "mode dsr does not see the replies a helper must read; helpers need mode snat or dnat")
		}
	}
	if f.Mode == ModeDSR {
		single := len(f.VirtualPorts) == 1 && f.VirtualPorts[0].First == f.VirtualPorts[0].Last
		for _, b := range f.Backends {
			if b.Port != 0 && (!single || b.Port != f.VirtualPorts[0].First) {
				return &FieldError{Object: backendObject(f.Name, b.Name), Field: "port", Value: fmt.Sprint(b.Port),
					Problem: "mode dsr forwards frames unchanged above layer 2, so the backend port must be empty or equal the farm's single virtual port"}
			}
		}
	}
	return nil
}

func (f *Farm) checkFamily(field string, is4 bool) error {
	want := f.Family
	if want == FamilyDual {
		return nil
	}
	if (want == FamilyIPv4) != is4 {
		got := "ipv6"
		if is4 {
			got = "ipv4"
		}
		return &FieldError{Object: farmObject(f.Name), Field: field, Problem: fmt.Sprintf("is an %s address but the farm's family is %s", got, want)}
	}
	return nil
}

func (f *Farm) validateBackend(b *Backend) error {
	// The object name is built only on error: validation runs for every
	// backend of every farm in a bulk change, and nearly always passes.
	bad := func(field, value, problem string) error {
		return &FieldError{Object: backendObject(f.Name, b.Name), Field: field, Value: value, Problem: problem}
	}
	if !ValidName(b.Name) {
		return &FieldError{Object: farmObject(f.Name), Field: "backends.name", Value: b.Name, Problem: "must be " + nameRule}
	}
	if !b.Addr.IsValid() {
		return bad("ip-addr", "", "is required")
	}
	if b.Addr.Zone() != "" || b.Addr.Is4In6() {
		return bad("ip-addr", b.Addr.String(), "must be a plain IPv4 or IPv6 address")
	}
	if p := addrProblem(b.Addr, false); p != "" {
		return bad("ip-addr", b.Addr.String(), p)
	}
	if f.Family != FamilyDual && (f.Family == FamilyIPv4) != b.Addr.Is4() {
		return bad("ip-addr", b.Addr.String(), "does not match the farm's family "+f.Family.String())
	}
	if b.Weight > MaxWeight {
		return bad("weight", fmt.Sprint(b.Weight), fmt.Sprintf("must be 0-%d (0 drains the backend)", MaxWeight))
	}
	if b.Priority < 1 || b.Priority > MaxBackendPriority {
		return bad("priority", fmt.Sprint(b.Priority), fmt.Sprintf("must be 1-%d", MaxBackendPriority))
	}
	if b.SourceAddr.IsValid() && (b.SourceAddr.Zone() != "" || b.SourceAddr.Is4In6() ||
		f.Family != FamilyDual && (f.Family == FamilyIPv4) != b.SourceAddr.Is4()) {
		return bad("source-addr", b.SourceAddr.String(), "must be a plain address of the farm's family "+f.Family.String())
	}
	if p := textProblem(b.EstConnLogPrefix, MaxLogPrefixLen); p != "" {
		return bad("est-connlimit-log-prefix", b.EstConnLogPrefix, p)
	}
	if b.EtherAddr[0]&1 != 0 {
		return bad("ether-addr", b.EtherAddr.String(), "must be a unicast Ethernet address (not multicast or broadcast)")
	}
	if !b.EtherAddr.IsZero() && f.Mode != ModeDSR && f.Mode != ModeStlsDNAT {
		return bad("ether-addr", b.EtherAddr.String(), "is only used by modes dsr and stlsdnat (this farm has mode "+f.Mode.String()+")")
	}
	return nil
}

func formatPorts(rs []PortRange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// validateSourceTable checks the farm's source table on its own; that it
// names an addr table, and how the farm shares its VIP with others, is the
// engine's check (engine.validateSources).
func (f *Farm) validateSourceTable() error {
	if f.SourceTable == "" {
		return nil
	}
	bad := func(problem string) error {
		return &FieldError{Object: farmObject(f.Name), Field: "source-table", Value: f.SourceTable, Problem: problem}
	}
	switch {
	case !ValidTableName(f.SourceTable):
		return bad(fmt.Sprintf("table names must be 1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-'", MaxTableNameLen))
	case !f.VirtualAddr.IsValid():
		return bad("only a farm with a virtual-addr can be chosen by source table (a firewall-mark farm is chosen by its mark)")
	case len(f.Addresses) > 0:
		return bad("a farm chosen by source table serves its own virtual-addr and virtual-ports only: remove its further addresses")
	case len(f.Policies) > 0:
		return bad("a farm chosen by source table cannot have policies: its source table already chooses its clients (put the allowed clients in it, or attach the policies to a farm without a source table)")
	}
	return nil
}
