package nft

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// The postrouting rules need `ct original ip daddr` / `ct original ip6
// daddr` (NFT_CT_DST_IP/NFT_CT_DST_IP6 with a direction attribute).
// google/nftables v0.3.0 only sends the direction for the generic keys, and
// the generic NFT_CT_DST in an inet table is 16 bytes wide for both
// families, which the nft binary cannot list inside a concatenation (it
// aborts). So these few static rules are encoded here and sent in a batch
// of their own: flush the postrouting chain and add the rules, atomic in
// the kernel like every other batch. They never change, so this batch runs
// only in New and Reconcile, after the main batch (which creates the chain).

// rawExpr is one expression already encoded as netlink attributes.
type rawExpr []byte

func ctOrigDaddr(v6 bool) rawExpr {
	key := uint32(unix.NFT_CT_DST_IP)
	if v6 {
		key = unix.NFT_CT_DST_IP6
	}
	data, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_CT_DREG, Data: binaryutil.BigEndian.PutUint32(reg1)},
		{Type: unix.NFTA_CT_KEY, Data: binaryutil.BigEndian.PutUint32(key)},
		{Type: unix.NFTA_CT_DIRECTION, Data: []byte{0}}, // IP_CT_DIR_ORIGINAL
	})
	b, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: []byte("ct\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
	return b
}

func encode(e expr.Any) (rawExpr, error) {
	if m, ok := e.(*expr.Masq); ok && m.ToPorts {
		return masqPorts(m)
	}
	return expr.Marshal(byte(nftables.TableFamilyINet), e)
}

// masqPorts encodes `masquerade to :<min>-<max>` (ports in registers):
// the kernel applies a masquerade's port range only with
// NF_NAT_RANGE_PROTO_SPECIFIED in its flags (nft sets it), which
// google/nftables v0.3.0 does not send along with the registers.
func masqPorts(m *expr.Masq) (rawExpr, error) {
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_MASQ_FLAGS, Data: binaryutil.BigEndian.PutUint32(expr.NF_NAT_RANGE_PROTO_SPECIFIED)},
		{Type: unix.NFTA_MASQ_REG_PROTO_MIN, Data: binaryutil.BigEndian.PutUint32(m.RegProtoMin)},
		{Type: unix.NFTA_MASQ_REG_PROTO_MAX, Data: binaryutil.BigEndian.PutUint32(m.RegProtoMax)},
	})
	if err != nil {
		return nil, err
	}
	return netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: []byte("masq\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
}

// postRulesRaw returns the postrouting rules:
//
//	snat ip to ct original ip daddr . meta l4proto . ct original proto-dst map @snat4
//	ct original ip daddr . meta l4proto . ct original proto-dst @masq4 masquerade
//
// and the IPv6 forms. The key is the VIP the client connected to, from the
// conntrack entry's original direction, so no mark is needed.
//
// A connection tagged for a farm chosen by source table goes first to the
// chain post-src (sourceTaggedPostRule), which holds only the rules by
// mark: its farm's snat or masquerade, and none of the rules found by VIP,
// which are its key's default farm's.
func postRulesRaw(ports model.PortRange) ([][]rawExpr, error) {
	var rules [][]rawExpr
	tagged, err := encodeAll(sourceTaggedPostRule())
	if err != nil {
		return nil, err
	}
	rules = append(rules, tagged)
	// First: ct original ip daddr . meta l4proto . ct original proto-dst
	// vmap @log4 (jump to the farm's log chain, which returns).
	for _, v6 := range []bool{false, true} {
		w := addrWords(v6)
		r := []rawExpr{ctOrigDaddr(v6)}
		for _, e := range []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
			&expr.Ct{Register: reg32 + w + 1, Key: expr.CtKeyPROTODST, Direction: 0},
			&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setLog4, setLog6), IsDestRegSet: true, DestRegister: regVerdict},
		} {
			b, err := encode(e)
			if err != nil {
				return nil, err
			}
			r = append(r, b)
		}
		rules = append(rules, r)
	}
	// Then the backends' own source addresses (backendsnat.go), before
	// the farms'.
	bsnat, err := backendSnatRules(ports)
	if err != nil {
		return nil, err
	}
	rules = append(rules, bsnat...)
	for _, v6 := range []bool{false, true} {
		w := addrWords(v6)
		masq, snat := pick(v6, setMasq4, setMasq6), pick(v6, setSnat4, setSnat6)
		var tails [][]expr.Any
		// The hash twins (single ports) first, then the interval sets.
		for _, names := range [][2]string{{exactSet(snat), exactSet(masq)}, {snat, masq}} {
			tails = append(tails, append([]expr.Any{
				&expr.Lookup{SourceRegister: reg1, SetName: names[0], IsDestRegSet: true, DestRegister: reg1},
			}, snatTo(v6, ports)...), append([]expr.Any{
				&expr.Lookup{SourceRegister: reg1, SetName: names[1]},
			}, masqTo(ports)...))
		}
		for _, tail := range tails {
			r := []rawExpr{ctOrigDaddr(v6)}
			for _, e := range append([]expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w},
				&expr.Ct{Register: reg32 + w + 1, Key: expr.CtKeyPROTODST, Direction: 0},
			}, tail...) {
				b, err := encode(e)
				if err != nil {
					return nil, err
				}
				r = append(r, b)
			}
			rules = append(rules, r)
		}
	}
	mark, err := markPostRules(ports)
	if err != nil {
		return nil, err
	}
	rules = append(rules, mark...)
	hair, err := encodeRules(hairpinRules())
	if err != nil {
		return nil, err
	}
	return append(rules, hair...), nil
}

// markPostRules are the postrouting rules of firewall-mark farms (and of
// farms chosen by source table, which this plane holds as such):
//
//	meta nfproto ipv4 snat ip to meta mark map @snatm4   (and IPv6)
//	meta mark @masqm masquerade
func markPostRules(ports model.PortRange) ([][]rawExpr, error) {
	var rules [][]rawExpr
	for _, v6 := range []bool{false, true} {
		var r []rawExpr
		for _, e := range append(append(nfproto(v6),
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setSnatM4, setSnatM6), IsDestRegSet: true, DestRegister: reg1},
		), snatTo(v6, ports)...) {
			b, err := encode(e)
			if err != nil {
				return nil, err
			}
			r = append(r, b)
		}
		rules = append(rules, r)
	}
	masq, err := encodeAll(append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, SetName: setMasqM},
	}, masqTo(ports)...))
	if err != nil {
		return nil, err
	}
	return append(rules, masq), nil
}

func encodeRules(rules [][]expr.Any) ([][]rawExpr, error) {
	var out [][]rawExpr
	for _, exprs := range rules {
		r, err := encodeAll(exprs)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func nftMsg(family byte, typ int, flags netlink.HeaderFlags, attrs []netlink.Attribute) (netlink.Message, error) {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return netlink.Message{}, err
	}
	hdr := []byte{family, unix.NFNETLINK_V0, 0, 0}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: flags},
		Data:   append(hdr, data...),
	}, nil
}

// Registers of the snat port range: 32-bit registers past the address in
// reg1 (32-bit registers 8-11) and the lookup keys' words.
const (
	regPortMin = reg32 + 8 // NFT_REG32_08
	regPortMax = reg32 + 9
)

// snatTo is `snat to <reg1>` and masqTo `masquerade`, each with this
// node's source ports (Options.SNATPorts) when they are set: `snat ip to
// <reg1>:first-last`, `masquerade to :first-last`.
func snatTo(v6 bool, ports model.PortRange) []expr.Any {
	n := &expr.NAT{Type: expr.NATTypeSourceNAT, Family: natFamily(v6), RegAddrMin: reg1}
	if ports.First == 0 {
		return []expr.Any{n}
	}
	n.RegProtoMin, n.RegProtoMax = regPortMin, regPortMax
	return append(portRegs(ports), n)
}

func masqTo(ports model.PortRange) []expr.Any {
	if ports.First == 0 {
		return []expr.Any{&expr.Masq{}}
	}
	return append(portRegs(ports), &expr.Masq{ToPorts: true, RegProtoMin: regPortMin, RegProtoMax: regPortMax})
}

func portRegs(ports model.PortRange) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: regPortMin, Data: binaryutil.BigEndian.PutUint16(ports.First)},
		&expr.Immediate{Register: regPortMax, Data: binaryutil.BigEndian.PutUint16(ports.Last)},
	}
}

// programPostrouting replaces the postrouting chain's rules in one batch.
// The chain post-src first (the rules by mark and the hairpin masquerade):
// the postrouting chain's first rule goes to it.
func (p *shard) programPostrouting() error {
	src, err := markPostRules(p.opts.SNATPorts)
	if err != nil {
		return fmt.Errorf("encode post-src rules: %w", err)
	}
	hair, err := encodeRules(hairpinRules())
	if err != nil {
		return fmt.Errorf("encode post-src rules: %w", err)
	}
	src = append(src, hair...)
	if err := p.sendRules(byte(nftables.TableFamilyINet), chainPostSrc, src); err != nil {
		return err
	}
	rules, err := postRulesRaw(p.opts.SNATPorts)
	if err != nil {
		return fmt.Errorf("encode postrouting rules: %w", err)
	}
	return p.sendRules(byte(nftables.TableFamilyINet), chainPostrouting, rules)
}

// sendRules replaces the rules of chain (in xlb's table of that family)
// with rules, in one batch.
func (p *shard) sendRules(family byte, chain string, rules [][]rawExpr) error {
	return p.sendRulesIn(p.table.Name, family, chain, rules)
}

// sendRulesIn is sendRules for a chain of another of xlb's tables (the
// counter table, counters.go).
func (p *shard) sendRulesIn(table string, family byte, chain string, rules [][]rawExpr) error {
	chainAttrs := []netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
	}
	var msgs []netlink.Message
	flush, err := nftMsg(family, unix.NFT_MSG_DELRULE, netlink.Request|netlink.Acknowledge, chainAttrs)
	if err != nil {
		return err
	}
	msgs = append(msgs, flush)
	for _, r := range rules {
		var list []netlink.Attribute
		for _, e := range r {
			list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: e})
		}
		exprs, err := netlink.MarshalAttributes(list)
		if err != nil {
			return err
		}
		m, err := nftMsg(family, unix.NFT_MSG_NEWRULE, netlink.Request|netlink.Acknowledge|netlink.Create|netlink.Append,
			append(chainAttrs[:2:2], netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: exprs}))
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
	}
	return p.sendRaw(msgs)
}

// sendRaw sends msgs as one nftables batch on a connection of its own and
// waits for every ack.
func (p *shard) sendRaw(msgs []netlink.Message) error {
	cfg := &netlink.Config{}
	if p.opts.NetNS.IsOpen() {
		cfg.NetNS = int(p.opts.NetNS)
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return fmt.Errorf("connect to nftables: %w", err)
	}
	if err := recordPort(c); err != nil {
		c.Close()
		return fmt.Errorf("connect to nftables: %w", err)
	}
	defer func() {
		releasePort(c)
		c.Close()
	}()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	batchHdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}
	all := append([]netlink.Message{{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request}, Data: batchHdr}},
		msgs...)
	all = append(all, netlink.Message{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: netlink.Request}, Data: batchHdr})
	if _, err := c.SendMessages(all); err != nil {
		return fmt.Errorf("send batch: %w", err)
	}
	for acks := 0; acks < len(msgs); {
		replies, err := c.Receive()
		if err != nil {
			// The first error is what the kernel rejected; the batch
			// was aborted as a whole.
			return fmt.Errorf("netlink batch rejected: %w", err)
		}
		for _, m := range replies {
			if m.Header.Type == netlink.Error {
				acks++
			}
		}
	}
	return nil
}

// listHelperObjects returns the names of the ct helper objects in xlb's
// table. google/nftables v0.3.0 cannot parse ct helper objects
// (GetObjects fails with "malformed stateful object"), so this is a raw
// NFT_MSG_GETOBJ dump that reads only the names.
func (p *shard) listHelperObjects() ([]string, error) {
	cfg := &netlink.Config{}
	if p.opts.NetNS.IsOpen() {
		cfg.NetNS = int(p.opts.NetNS)
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to nftables: %w", err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return nil, err
	}
	req, err := nftMsg(byte(nftables.TableFamilyINet), unix.NFT_MSG_GETOBJ, netlink.Request|netlink.Dump, []netlink.Attribute{
		{Type: unix.NFTA_OBJ_TABLE, Data: []byte(p.table.Name + "\x00")},
		{Type: unix.NFTA_OBJ_TYPE, Data: binaryutil.BigEndian.PutUint32(unix.NFT_OBJECT_CT_HELPER)},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := c.Execute(req)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, err
		}
		var name, table string
		var typ uint32
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_OBJ_NAME:
				name = ad.String()
			case unix.NFTA_OBJ_TABLE:
				table = ad.String()
			case unix.NFTA_OBJ_TYPE:
				typ = binary.BigEndian.Uint32(ad.Bytes())
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		if table == p.table.Name && typ == unix.NFT_OBJECT_CT_HELPER {
			names = append(names, name)
		}
	}
	return names, nil
}
