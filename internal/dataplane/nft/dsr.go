package nft

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/nsenter"
)

// Mode dsr, as nftlb does it: at netdev ingress of the interface where the
// VIP's traffic arrives, a packet for VIP:port/protocol gets its Ethernet
// source set to the LB's MAC and its destination to the MAC of a backend
// chosen by the scheduler, and is sent out of the interface towards the
// backends with `fwd`. Nothing above layer 2 changes and conntrack never
// sees the packet; backends hold the VIP on lo (with arp_ignore and
// arp_announce) and answer the client directly.
//
// Each of xlb's tables has a netdev twin of the same name:
//
//	table netdev xlb {
//	  map dsr4   { type ipv4_addr . inet_proto . inet_service : verdict; flags interval; }  (and dsr6)
//	  map dsrif4 { type ipv4_addr . inet_proto . inet_service : iface_index; flags interval; } (and dsrif6)
//	  chain dsr {
//	    meta protocol ip ip daddr . meta l4proto . th dport vmap @dsr4         (jump d-<hash>)
//	    meta protocol ip fwd to ip daddr . meta l4proto . th dport map @dsrif4
//	    (and the ip6 forms) }
//	  chain in-<dev> { type filter hook ingress device <dev> priority 0; goto dsr }  one per iface in use
//	  chain d-<hash> {                                                            one per dsr farm
//	    meta iifname != "<iface>" accept
//	    ether saddr set <lb mac> ether daddr set <scheduler> map @m-<hash>-<gen> counter }
//	  map m-<hash>-<gen> { slot : ether_addr }
//	}
//
// google/nftables v0.3.0 (the newest on the module proxy) has no fwd
// expression, and its expression interface has unexported methods, so no
// package can add one. The four rules of the static chain dsr are therefore
// encoded here (fwdExpr) and sent in a batch of their own in New and
// Reconcile, like the postrouting rules (raw.go); they never change. What
// changes per farm (elements, farm chains, device chains, maps) goes in the
// one batch of each Apply: a farm's chain returns to chain dsr, whose fwd
// rule looks the oface up by the same key.
//
// Interfaces and MACs are found when a farm is applied (and on Reconcile):
// iface is the interface holding the VIP or the one the VIP is routed to;
// oface the one the backends are routed to (on-link: dsr needs the
// backends on the LB's layer-2 segment); the LB's MAC is oface's; backend
// MACs come from the neighbour table, after a probe (one UDP datagram to
// the discard port, which makes the kernel resolve the address) if they are
// missing. nftlb's iface, oface, ether-addr and backend ether-addr override
// each. The MACs are resolved at that moment only: a backend whose MAC
// changes needs its farm applied again (or ether-addr set).

// Names in the netdev table.
const (
	setDsr4    = "dsr4"
	setDsr6    = "dsr6"
	setDsrIf4  = "dsrif4"
	setDsrIf6  = "dsrif6"
	chainDsr   = "dsr"
	farmDsr    = "d-"  // dsr farm chain: d-<hash>
	devChain   = "in-" // ingress base chain of a device: in-<ifname>
	probePort  = 9     // discard: the datagram that makes the kernel resolve a neighbour
	probeWait  = 2 * time.Second
	etherAlen  = 6
	ifnameSize = unix.IFNAMSIZ
)

// dsrLink is what a dsr farm's forwarding needs from the namespace.
type dsrLink struct {
	iface string // where the VIP's traffic arrives
	oface string // towards the backends
	ofIdx uint32 // oface's ifindex
	lbMAC [etherAlen]byte
	// ifIdx and ifMAC: iface's index and MAC (where stlsdnat at ingress
	// sends replies from).
	ifIdx uint32
	ifMAC [etherAlen]byte
	macs  map[netip.Addr][etherAlen]byte // backend address -> MAC
}

// netdevSets returns the static sets of the netdev table.
func netdevSets(t *nftables.Table) []*nftables.Set {
	m := func(name string, kt, dt nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, IsMap: true, Interval: true, Concatenation: true,
			KeyType: kt, DataType: dt, KeyByteOrder: binaryutil.BigEndian}
	}
	return []*nftables.Set{
		m(setDsr4, typeSvc4, nftables.TypeVerdict),
		m(setDsr6, typeSvc6, nftables.TypeVerdict),
		m(setDsrIf4, typeSvc4, nftables.TypeIFIndex),
		m(setDsrIf6, typeSvc6, nftables.TypeIFIndex),
		m(setDsrR4, typeSvc4, nftables.TypeVerdict), // stlsdnat at ingress (stlsingress.go)
		m(setDsrR6, typeSvc6, nftables.TypeVerdict),
		m(setL2To4, typeSvc4, nftables.TypeIFIndex),
		m(setL2To6, typeSvc6, nftables.TypeIFIndex),
		m(setL2Back4, typeSvc4, nftables.TypeIFIndex),
		m(setL2Back6, typeSvc6, nftables.TypeIFIndex),
	}
}

// netdevKey: meta protocol ip, then ip daddr . meta l4proto . th dport
// into reg1 (or the ip6 forms). meta nfproto is "netdev" here, so the
// family is told by the Ethernet protocol.
func netdevKey(v6 bool) []expr.Any {
	off, alen := uint32(16), uint32(4)
	ethType := []byte{0x08, 0x00}
	if v6 {
		off, alen = 24, 16
		ethType = []byte{0x86, 0xdd}
	}
	w := addrWords(v6)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: ethType},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
		&expr.Payload{DestRegister: reg32 + w + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

// fwdExpr is `fwd to <register>` (NFT_EXPR fwd, NFTA_FWD_SREG_DEV): send
// the frame out of the interface whose index is in reg.
func fwdExpr(reg uint32) rawExpr {
	data, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_FWD_SREG_DEV, Data: binaryutil.BigEndian.PutUint32(reg)},
	})
	b, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: []byte("fwd\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
	return b
}

// dsrRulesRaw returns the rules of the static chain dsr: for each family,
// the farms' keys, dsr's forwarding, then the backends' replies to
// stlsdnat farms at ingress (stlsingress.go; after dsr's fwd, so a dsr
// packet costs no more lookups than before them).
func dsrRulesRaw() ([][]rawExpr, error) {
	enc := func(es []expr.Any) ([]rawExpr, error) {
		var out []rawExpr
		for _, e := range es {
			b, err := expr.Marshal(byte(nftables.TableFamilyNetdev), e)
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
		return out, nil
	}
	var rules [][]rawExpr
	for _, v6 := range []bool{false, true} {
		vm, err := enc(append(netdevKey(v6),
			&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setDsr4, setDsr6), IsDestRegSet: true, DestRegister: regVerdict}))
		if err != nil {
			return nil, err
		}
		fw, err := enc(append(netdevKey(v6),
			&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setDsrIf4, setDsrIf6), IsDestRegSet: true, DestRegister: reg1}))
		if err != nil {
			return nil, err
		}
		rev, err := enc(append(revKey(v6),
			&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setDsrR4, setDsrR6), IsDestRegSet: true, DestRegister: regVerdict}))
		if err != nil {
			return nil, err
		}
		rules = append(rules, vm, append(fw, fwdExpr(reg1)), rev)
	}
	return rules, nil
}

// encNetdev encodes expressions of the netdev table.
func encNetdev(es []expr.Any) ([]rawExpr, error) {
	var out []rawExpr
	for _, e := range es {
		b, err := expr.Marshal(byte(nftables.TableFamilyNetdev), e)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// programDSR replaces the rules of the netdev table's static chains (dsr,
// and stlsdnat at ingress's l2to and l2back), each in one batch.
func (p *shard) programDSR() error {
	rules, err := dsrRulesRaw()
	if err != nil {
		return fmt.Errorf("encode dsr rules: %w", err)
	}
	if err := p.sendRules(byte(nftables.TableFamilyNetdev), chainDsr, rules); err != nil {
		return err
	}
	for _, src := range []bool{false, true} {
		rules, err := l2RulesRaw(src)
		if err != nil {
			return fmt.Errorf("encode stlsdnat forwarding rules: %w", err)
		}
		if err := p.sendRules(byte(nftables.TableFamilyNetdev), pick(src, chainL2To, chainL2Back), rules); err != nil {
			return err
		}
	}
	return nil
}

// ifnameData is an interface name as meta iifname loads it: IFNAMSIZ bytes,
// NUL padded.
func ifnameData(name string) []byte {
	b := make([]byte, ifnameSize)
	copy(b, name)
	return b
}

// dsrFarmRules returns the rules of a dsr farm's chain d-<hash>.
func (p *farmPlan) dsrFarmRules(f *model.Farm, mapName string, mapID, modulus uint32) [][]expr.Any {
	l := p.dsr
	other := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifnameData(l.iface)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
	if p.kind == kindNone {
		return [][]expr.Any{other, {&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}}
	}
	// meta iiftype ether and meta protocol: always true here (the
	// chain is reached only for Ethernet IP packets), but they let nft
	// list the rule as ether saddr set ... and ip saddr.
	r := append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFTYPE, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint16(unix.ARPHRD_ETHER)},
	}, netdevKey(p.v6)[:2]...)
	r = append(r,
		&expr.Immediate{Register: reg1, Data: l.lbMAC[:]},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: etherAlen},
	)
	r = append(r, netdevSched(f, p.v6, modulus)...)
	r = append(r,
		&expr.Lookup{SourceRegister: reg1, SetName: mapName, SetID: mapID, IsDestRegSet: true, DestRegister: reg1},
		&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 0, Len: etherAlen},
		&expr.Counter{},
	)
	// The chain returns to dsr, whose next rule forwards the frame.
	return [][]expr.Any{other, r}
}

// netdevSched puts the farm's scheduler's slot in reg1 at netdev ingress
// (where meta nfproto is "netdev", so the family is not matched again).
func netdevSched(f *model.Farm, v6 bool, modulus uint32) []expr.Any {
	switch f.Scheduler {
	case model.SchedRR:
		return []expr.Any{&expr.Numgen{Register: reg1, Type: unix.NFT_NG_INCREMENTAL, Modulus: modulus}}
	case model.SchedWeight:
		return []expr.Any{
			&expr.Numgen{Register: reg1, Type: unix.NFT_NG_RANDOM, Modulus: modulus},
			&expr.Byteorder{SourceRegister: reg1, DestRegister: reg1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		}
	case model.SchedHash, model.SchedMaglev:
		return hashExprs(f, f.SchedParam, v6, modulus)
	case model.SchedSymhash:
		return []expr.Any{&expr.Hash{DestRegister: reg1, Modulus: modulus, Type: expr.HashTypeSym}}
	}
	return nil
}

// setDSR completes a dsr farm's plan with the resolved links.
func (p *farmPlan) setDSR(f *model.Farm, l *dsrLink) {
	p.dsr = l
	idx := binaryutil.NativeEndian.PutUint32(l.ofIdx)
	p.post = svcElems(f, "", idx)
}

// dsrCheck refuses what the nft data plane's dsr cannot do.
func dsrCheck(f *model.Farm) error {
	bad := func(field, value, problem string) error {
		return dataplane.Refuse(f, field, value,
			problem)
	}
	const why = "mode dsr in the " + PlaneName + " data plane forwards frames at netdev ingress, before conntrack, so it takes no "
	switch {
	case f.IsMarkFarm():
		return bad("mark", fmt.Sprint(f.Mark), "mode dsr in the "+PlaneName+" data plane needs a virtual-addr (packets are matched before any firewall mark is set)")
	case (f.Scheduler == model.SchedRR || f.Scheduler == model.SchedWeight) && f.Protocol != model.ProtoUDP:
		return bad("scheduler", f.Scheduler.String(), "mode dsr in the "+PlaneName+" data plane picks a backend for every packet (no conntrack at netdev ingress), so with protocol "+f.Protocol.String()+" it needs a scheduler that hashes the flow: hash, symhash or maglev (rr and weight are for udp only)")
	case f.Persistence != 0:
		return bad("persistence", f.Persistence.String(), why+"persistence")
	case f.NewRTLimit != 0:
		return bad("new-rtlimit", fmt.Sprint(f.NewRTLimit), why+"new-rtlimit")
	case f.RstRTLimit != 0:
		return bad("rst-rtlimit", fmt.Sprint(f.RstRTLimit), why+"rst-rtlimit")
	case f.EstConnLimit != 0:
		return bad("est-connlimit", fmt.Sprint(f.EstConnLimit), why+"est-connlimit")
	case f.TCPStrict:
		return bad("tcp-strict", "on", why+"tcp-strict")
	case f.Log != 0:
		return bad("log", f.Log.String(), why+"log")
	}
	for _, b := range f.Backends {
		if b.Mark != 0 || b.EstConnLimit != 0 {
			field, v := "mark", fmt.Sprint(b.Mark)
			if b.Mark == 0 {
				field, v = "est-connlimit", fmt.Sprint(b.EstConnLimit)
			}
			return dataplane.RefuseBackend(f, b.Name, field, v,
				why+"backend marks or est-connlimit")
		}
	}
	return nil
}

// atIngress reports whether the farm works at netdev ingress and so needs
// its links resolved: mode dsr, and stlsdnat with an iface.
func atIngress(f *model.Farm) bool { return f.Mode == model.ModeDSR || f.StlsAtIngress() }

// resolveDSR finds the links of the farms at ingress among farms (nil entries are
// skipped) in the plane's namespace.
func resolveDSR(ns netns.NsHandle, farms []*model.Farm) (map[string]*dsrLink, error) {
	var h *vnl.Handle
	out := map[string]*dsrLink{}
	for _, f := range farms {
		if f == nil || !atIngress(f) || f.State != model.StateUp {
			continue
		}
		if h == nil {
			var err error
			if ns.IsOpen() {
				h, err = vnl.NewHandleAt(ns)
			} else {
				h, err = vnl.NewHandle()
			}
			if err != nil {
				return nil, fmt.Errorf("netlink handle for dsr lookups: %w", err)
			}
			defer h.Close()
		}
		l, err := resolveFarm(h, ns, f)
		if err != nil {
			return nil, err
		}
		out[f.Name] = l
	}
	return out, nil
}

func resolveFarm(h *vnl.Handle, ns netns.NsHandle, f *model.Farm) (*dsrLink, error) {
	l := &dsrLink{iface: f.Iface, oface: f.Oface, macs: map[netip.Addr][etherAlen]byte{}}
	if l.iface == "" {
		name, err := vipIface(h, f.VirtualAddr)
		if err != nil {
			return nil, dataplane.Refuse(f, "iface", "", fmt.Sprintf("not set, and %v; set iface to the interface where traffic for %s arrives", err, f.VirtualAddr))
		}
		l.iface = name
	}
	ilk, err := h.LinkByName(l.iface)
	if err != nil {
		return nil, dataplane.Refuse(f, "iface", l.iface, "no such interface in the data plane's network namespace")
	}
	l.ifIdx = uint32(ilk.Attrs().Index)
	if hw := ilk.Attrs().HardwareAddr; len(hw) == etherAlen {
		copy(l.ifMAC[:], hw)
	} else if f.StlsAtIngress() {
		return nil, dataplane.Refuse(f, "iface", l.iface, "has no Ethernet address: mode stlsdnat at ingress forwards Ethernet frames")
	}
	active := f.ActiveBackends()
	if l.oface == "" {
		for _, b := range active {
			rs, err := h.RouteGet(b.Addr.AsSlice())
			if err != nil || len(rs) == 0 {
				return nil, dataplane.RefuseBackend(f, b.Name, "ip-addr", b.Addr.String(),
					"has no route in the data plane's network namespace; mode "+f.Mode.String()+" at ingress needs the backend on a directly connected link (or set the farm's oface)")
			}
			if rs[0].Gw != nil {
				return nil, dataplane.RefuseBackend(f, b.Name, "ip-addr", b.Addr.String(),
					fmt.Sprintf("is reached through the gateway %s; mode %s at ingress forwards frames at layer 2, so backends must be on the LB's own link", rs[0].Gw, f.Mode))
			}
			lk, err := h.LinkByIndex(rs[0].LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("farm %q: link %d of the route to %s: %w", f.Name, rs[0].LinkIndex, b.Addr, err)
			}
			if l.oface != "" && l.oface != lk.Attrs().Name {
				return nil, dataplane.RefuseBackend(f, b.Name, "ip-addr", b.Addr.String(),
					fmt.Sprintf("is on %s but other backends are on %s; a farm at ingress forwards to one oface", lk.Attrs().Name, l.oface))
			}
			l.oface = lk.Attrs().Name
		}
		if l.oface == "" {
			// No serving backend: the chain drops; any oface will do.
			l.oface = l.iface
		}
	}
	lk, err := h.LinkByName(l.oface)
	if err != nil {
		return nil, dataplane.Refuse(f, "oface", l.oface, "no such interface in the data plane's network namespace")
	}
	l.ofIdx = uint32(lk.Attrs().Index)
	if !f.EtherAddr.IsZero() {
		l.lbMAC = f.EtherAddr
	} else if hw := lk.Attrs().HardwareAddr; len(hw) == etherAlen {
		copy(l.lbMAC[:], hw)
	} else {
		return nil, dataplane.Refuse(f, "ether-addr", "", fmt.Sprintf("not set, and %s has no Ethernet address; set ether-addr", l.oface))
	}
	var missing []model.Backend
	for _, b := range active {
		if !b.EtherAddr.IsZero() {
			l.macs[b.Addr] = b.EtherAddr
			continue
		}
		missing = append(missing, b)
	}
	if len(missing) == 0 {
		return l, nil
	}
	lookup := func() error {
		for _, fam := range []int{vnl.FAMILY_V4, vnl.FAMILY_V6} {
			ns, err := h.NeighList(int(l.ofIdx), fam)
			if err != nil {
				return fmt.Errorf("farm %q: list neighbours on %s: %w", f.Name, l.oface, err)
			}
			for _, n := range ns {
				a, ok := netip.AddrFromSlice(n.IP)
				if !ok || len(n.HardwareAddr) != etherAlen || n.State&(vnl.NUD_INCOMPLETE|vnl.NUD_FAILED) != 0 || n.State == vnl.NUD_NONE {
					continue
				}
				var m [etherAlen]byte
				copy(m[:], n.HardwareAddr)
				l.macs[a.Unmap()] = m
			}
		}
		return nil
	}
	if err := lookup(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(probeWait)
	for probed := false; ; probed = true {
		var still []model.Backend
		for _, b := range missing {
			if _, ok := l.macs[b.Addr]; !ok {
				still = append(still, b)
			}
		}
		if len(still) == 0 {
			return l, nil
		}
		if time.Now().After(deadline) {
			b := still[0]
			e := &missingMACs{FieldError: model.FieldError{Object: fmt.Sprintf("farm %q backend %q", f.Name, b.Name), Field: "ether-addr",
				Problem: fmt.Sprintf("not set, and %s has no neighbour entry on %s after probing for %v: is the backend up on that link? set ether-addr to skip the lookup", b.Addr, l.oface, probeWait)}}
			for _, b := range still {
				e.backends = append(e.backends, b.Name)
			}
			return nil, e
		}
		if !probed {
			for _, b := range still {
				if err := probe(ns, l.oface, b.Addr); err != nil {
					return nil, fmt.Errorf("farm %q: probe %s on %s: %w", f.Name, b.Addr, l.oface, err)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
		if err := lookup(); err != nil {
			return nil, err
		}
	}
}

// missingMACs is the error of a farm some of whose serving backends have
// no MAC; it reads as the first one's.
type missingMACs struct {
	model.FieldError
	backends []string
}

func (e *missingMACs) Unwrap() error { return &e.FieldError }

// resolveLenient is resolveDSR for Reconcile (start-up), where one farm must
// not keep the others out of the kernel: a farm whose backends' MACs cannot
// be found is programmed without them (as if they were down), and a farm
// whose interfaces cannot be found is not programmed (as if it were down);
// each is logged. It returns the farms to program and their links.
func resolveLenient(log *slog.Logger, ns netns.NsHandle, farms []*model.Farm) ([]*model.Farm, map[string]*dsrLink, error) {
	out := map[string]*dsrLink{}
	next := make([]*model.Farm, 0, len(farms))
	for _, f := range farms {
		if !atIngress(f) || f.State != model.StateUp {
			next = append(next, f)
			continue
		}
		for {
			links, err := resolveDSR(ns, []*model.Farm{f})
			if err == nil {
				out[f.Name] = links[f.Name]
				break
			}
			var mm *missingMACs
			var fe *model.FieldError
			c := f.Clone()
			switch {
			case errors.As(err, &mm):
				log.Error("dsr backends without a MAC are left out until the farm is applied again", "farm", f.Name, "backends", mm.backends, "err", err)
				for _, name := range mm.backends {
					if b, _ := c.Backend(name); b != nil {
						b.State = model.StateDown
					}
				}
				f = &c
				continue
			case errors.As(err, &fe):
				log.Error("dsr farm left out until it is applied again", "farm", f.Name, "err", err)
				c.State = model.StateDown
				f = &c
			default:
				return nil, nil, err
			}
			break
		}
		next = append(next, f)
	}
	return next, out, nil
}

// vipIface returns the interface that holds vip, or else the one vip is
// routed to.
func vipIface(h *vnl.Handle, vip netip.Addr) (string, error) {
	fam := vnl.FAMILY_V4
	if vip.Is6() {
		fam = vnl.FAMILY_V6
	}
	addrs, err := h.AddrList(nil, fam)
	if err != nil {
		return "", fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip {
			if lk, err := h.LinkByIndex(a.LinkIndex); err == nil && lk.Attrs().Name != "lo" {
				return lk.Attrs().Name, nil
			}
		}
	}
	rs, err := h.RouteGet(vip.AsSlice())
	if err == nil && len(rs) > 0 {
		if lk, err := h.LinkByIndex(rs[0].LinkIndex); err == nil && lk.Attrs().Name != "lo" {
			return lk.Attrs().Name, nil
		}
	}
	return "", fmt.Errorf("no interface holds %s and no route leads to it", vip)
}

// probe sends one empty UDP datagram to addr's discard port out of dev in
// namespace ns, so the kernel resolves addr's MAC.
func probe(ns netns.NsHandle, dev string, addr netip.Addr) error {
	return nsenter.Run(ns, func() error {
		fam := unix.AF_INET6
		var sa unix.Sockaddr = &unix.SockaddrInet6{Port: probePort, Addr: addr.As16()}
		if addr.Is4() {
			fam = unix.AF_INET
			sa = &unix.SockaddrInet4{Port: probePort, Addr: addr.As4()}
		}
		fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev); err != nil {
			return fmt.Errorf("bind to %s: %w", dev, err)
		}
		// An unreachable neighbour is not an error here: the caller waits
		// for the entry and says what is missing.
		_ = unix.Sendto(fd, nil, unix.MSG_DONTWAIT, sa)
		return nil
	})
}

func splitDevs(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// syncDevs adds and deletes the ingress base chains so the netdev table
// hooks exactly the devices in want.
func (b *batch) syncDevs(have, want string) {
	hv, wt := splitDevs(have), splitDevs(want)
	for _, d := range wt {
		if !slices.Contains(hv, d) {
			b.addDevChain(d)
		}
	}
	for _, d := range hv {
		if !slices.Contains(wt, d) {
			ch := &nftables.Chain{Table: b.p.ntable, Name: devChain + d}
			b.c.FlushChain(ch)
			b.delChain(ch)
		}
	}
}

// addDevChain adds (or re-fills) the ingress base chain of device dev.
func (b *batch) addDevChain(dev string) {
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriorityFilter
	ch := b.c.AddChain(&nftables.Chain{Table: b.p.ntable, Name: devChain + dev, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: prio, Device: dev, Policy: &accept})
	b.c.FlushChain(ch)
	b.c.AddRule(&nftables.Rule{Table: b.p.ntable, Chain: ch, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainDsr}}})
}
