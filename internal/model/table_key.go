package model

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// TableKey is an entry's key in its canonical binary form, a string so it
// is comparable and orders entries (a table's entries are sorted by it):
//
//	addr    family (4 or 6), address (4 or 16 bytes), prefix length
//	number  4 bytes, big endian
//	iface   the name's bytes
//	mac     6 bytes
//	flow    the fields the table has, in FlowFields order: family (4 or
//	        6, once, if it has an address), src-ip, proto (1 byte),
//	        src-port (2 bytes, big endian), dst-ip, dst-port
//
// The text form (what users write and see) is produced by FormatKey and
// read by ParseKey; an address entry's text is the prefix ("10.0.0.0/8"),
// or the address alone for a host ("10.0.0.1").
type TableKey string

// AddrKey is the key of an addr table's entry for p (which must be masked).
func AddrKey(p netip.Prefix) TableKey {
	a := p.Addr()
	var b [18]byte
	n := 0
	if a.Is4() {
		b[0] = 4
		a4 := a.As4()
		n = 1 + copy(b[1:], a4[:])
	} else {
		b[0] = 6
		a16 := a.As16()
		n = 1 + copy(b[1:], a16[:])
	}
	b[n] = byte(p.Bits())
	return TableKey(b[:n+1])
}

// Prefix returns an addr key's prefix.
func (k TableKey) Prefix() netip.Prefix {
	if len(k) < 2 {
		return netip.Prefix{}
	}
	a, _ := netip.AddrFromSlice([]byte(k[1 : len(k)-1]))
	return netip.PrefixFrom(a, int(k[len(k)-1]))
}

// NumberKey is the key of a number table's entry n.
func NumberKey(n uint32) TableKey {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return TableKey(b[:])
}

// Number returns a number key's number.
func (k TableKey) Number() uint32 {
	if len(k) != 4 {
		return 0
	}
	return binary.BigEndian.Uint32([]byte(k))
}

// FlowKey is a flow table's key split into its fields; fields the table
// does not have are zero.
type FlowKey struct {
	SrcIP, DstIP     netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// Key returns the key of a flow table with fields ff.
func (f FlowKey) Key(ff FlowFields) TableKey {
	b := make([]byte, 0, 40)
	if ff&(FlowSrcIP|FlowDstIP) != 0 {
		a := f.SrcIP
		if ff&FlowSrcIP == 0 {
			a = f.DstIP
		}
		if a.Is4() {
			b = append(b, 4)
		} else {
			b = append(b, 6)
		}
	}
	if ff&FlowSrcIP != 0 {
		b = appendAddrBytes(b, f.SrcIP)
	}
	if ff&FlowProto != 0 {
		b = append(b, f.Proto)
	}
	if ff&FlowSrcPort != 0 {
		b = binary.BigEndian.AppendUint16(b, f.SrcPort)
	}
	if ff&FlowDstIP != 0 {
		b = appendAddrBytes(b, f.DstIP)
	}
	if ff&FlowDstPort != 0 {
		b = binary.BigEndian.AppendUint16(b, f.DstPort)
	}
	return TableKey(b)
}

func appendAddrBytes(b []byte, a netip.Addr) []byte { return append(b, a.AsSlice()...) }

// Flow splits a flow table's key into its fields.
func (k TableKey) Flow(ff FlowFields) FlowKey {
	var f FlowKey
	b := []byte(k)
	alen := 0
	if ff&(FlowSrcIP|FlowDstIP) != 0 {
		if len(b) == 0 {
			return f
		}
		alen = 4
		if b[0] == 6 {
			alen = 16
		}
		b = b[1:]
	}
	take := func(n int) []byte {
		if len(b) < n {
			return make([]byte, n)
		}
		v := b[:n]
		b = b[n:]
		return v
	}
	if ff&FlowSrcIP != 0 {
		f.SrcIP, _ = netip.AddrFromSlice(take(alen))
	}
	if ff&FlowProto != 0 {
		f.Proto = take(1)[0]
	}
	if ff&FlowSrcPort != 0 {
		f.SrcPort = binary.BigEndian.Uint16(take(2))
	}
	if ff&FlowDstIP != 0 {
		f.DstIP, _ = netip.AddrFromSlice(take(alen))
	}
	if ff&FlowDstPort != 0 {
		f.DstPort = binary.BigEndian.Uint16(take(2))
	}
	return f
}

// Is6 reports whether an addr key, or a flow key with addresses, is IPv6.
func (k TableKey) Is6() bool { return len(k) > 0 && k[0] == 6 }

// ParseKey parses an entry's key as text for this table. The error says
// what the table's keys look like.
func (t *Table) ParseKey(s string) (TableKey, error) {
	s = strings.TrimSpace(s)
	switch t.Type {
	case TableAddr:
		return t.parseAddrKey(s)
	case TableNumber:
		n, err := strconv.ParseUint(s, 0, 32)
		if err != nil {
			return "", fmt.Errorf("a number table's keys are whole numbers 0-4294967295 (decimal or 0x hex)")
		}
		return NumberKey(uint32(n)), nil
	case TableIface:
		if !ValidIfName(s) {
			return "", fmt.Errorf("an iface table's keys are interface names: 1 to 15 characters, no '/', ':' or white space")
		}
		return TableKey(s), nil
	case TableMAC:
		hw, err := net.ParseMAC(s)
		if err != nil || len(hw) != 6 {
			return "", fmt.Errorf("a mac table's keys are Ethernet addresses aa:bb:cc:dd:ee:ff")
		}
		return TableKey(hw), nil
	case TableFlow:
		return t.parseFlowKey(s)
	}
	return "", fmt.Errorf("table type %d has no keys", t.Type)
}

func (t *Table) parseAddrKey(s string) (TableKey, error) {
	const form = "an addr table's keys are IPv4 or IPv6 addresses or prefixes (10.0.0.1, 10.0.0.0/8, fd00::/64)"
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return "", fmt.Errorf("malformed prefix: %s", form)
		}
		if m := p.Masked(); m != p {
			return "", fmt.Errorf("the prefix has bits set past its length (did you mean %s?)", m)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return "", fmt.Errorf("malformed address: %s", form)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	a := p.Addr()
	switch {
	case a.Zone() != "":
		return "", fmt.Errorf("an address in a table must not carry a zone")
	case a.Is4In6():
		return "", fmt.Errorf("write IPv4 addresses in dotted form, not as IPv4-mapped IPv6")
	}
	if err := t.checkFamily(a); err != nil {
		return "", err
	}
	return AddrKey(p), nil
}

func (t *Table) checkFamily(a netip.Addr) error {
	switch {
	case t.Family == FamilyIPv4 && !a.Is4():
		return fmt.Errorf("the table has family ipv4: IPv6 keys are not allowed")
	case t.Family == FamilyIPv6 && a.Is4():
		return fmt.Errorf("the table has family ipv6: IPv4 keys are not allowed")
	}
	return nil
}

// protoNames are the protocol names a flow key may use besides numbers.
var protoNames = map[string]uint8{"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58, "sctp": 132}

func protoName(p uint8) string {
	for n, v := range protoNames {
		if v == p {
			return n
		}
	}
	return strconv.Itoa(int(p))
}

func (t *Table) parseFlowKey(s string) (TableKey, error) {
	form := fmt.Sprintf("this flow table's keys are %s, comma-separated", t.Flow)
	parts := strings.Split(s, ",")
	if len(parts) != bitCount(uint8(t.Flow)) {
		return "", fmt.Errorf("%d fields given: %s", len(parts), form)
	}
	var f FlowKey
	i := 0
	next := func() string { p := strings.TrimSpace(parts[i]); i++; return p }
	addr := func(name string) (netip.Addr, error) {
		a, err := netip.ParseAddr(next())
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return a, fmt.Errorf("%s must be an IPv4 or IPv6 address: %s", name, form)
		}
		return a, t.checkFamily(a)
	}
	port := func(name string) (uint16, error) {
		n, err := strconv.ParseUint(next(), 10, 16)
		if err != nil {
			return 0, fmt.Errorf("%s must be a port 0-65535: %s", name, form)
		}
		return uint16(n), nil
	}
	var err error
	if t.Flow&FlowSrcIP != 0 {
		if f.SrcIP, err = addr("src-ip"); err != nil {
			return "", err
		}
	}
	if t.Flow&FlowProto != 0 {
		p := next()
		if n, ok := protoNames[p]; ok {
			f.Proto = n
		} else if n, err := strconv.ParseUint(p, 10, 8); err == nil {
			f.Proto = uint8(n)
		} else {
			return "", fmt.Errorf("proto must be tcp, udp, sctp, icmp, icmpv6 or a number 0-255: %s", form)
		}
	}
	if t.Flow&FlowSrcPort != 0 {
		if f.SrcPort, err = port("src-port"); err != nil {
			return "", err
		}
	}
	if t.Flow&FlowDstIP != 0 {
		if f.DstIP, err = addr("dst-ip"); err != nil {
			return "", err
		}
	}
	if t.Flow&FlowDstPort != 0 {
		if f.DstPort, err = port("dst-port"); err != nil {
			return "", err
		}
	}
	if f.SrcIP.IsValid() && f.DstIP.IsValid() && f.SrcIP.Is4() != f.DstIP.Is4() {
		return "", fmt.Errorf("src-ip and dst-ip must be of the same family")
	}
	return f.Key(t.Flow), nil
}

func bitCount(v uint8) int {
	n := 0
	for ; v != 0; v &= v - 1 {
		n++
	}
	return n
}

// FormatKey returns a key as text, the form ParseKey reads.
func (t *Table) FormatKey(k TableKey) string { return string(t.AppendKey(nil, k)) }

// AppendKey appends FormatKey's text to dst.
func (t *Table) AppendKey(dst []byte, k TableKey) []byte {
	switch t.Type {
	case TableAddr:
		p := k.Prefix()
		dst = p.Addr().AppendTo(dst)
		if p.Bits() != p.Addr().BitLen() {
			dst = append(dst, '/')
			dst = strconv.AppendInt(dst, int64(p.Bits()), 10)
		}
		return dst
	case TableNumber:
		return strconv.AppendUint(dst, uint64(k.Number()), 10)
	case TableIface:
		return append(dst, k...)
	case TableMAC:
		return append(dst, net.HardwareAddr(k).String()...)
	case TableFlow:
		f := k.Flow(t.Flow)
		first := true
		sep := func() {
			if !first {
				dst = append(dst, ',')
			}
			first = false
		}
		if t.Flow&FlowSrcIP != 0 {
			sep()
			dst = f.SrcIP.AppendTo(dst)
		}
		if t.Flow&FlowProto != 0 {
			sep()
			dst = append(dst, protoName(f.Proto)...)
		}
		if t.Flow&FlowSrcPort != 0 {
			sep()
			dst = strconv.AppendUint(dst, uint64(f.SrcPort), 10)
		}
		if t.Flow&FlowDstIP != 0 {
			sep()
			dst = f.DstIP.AppendTo(dst)
		}
		if t.Flow&FlowDstPort != 0 {
			sep()
			dst = strconv.AppendUint(dst, uint64(f.DstPort), 10)
		}
	}
	return dst
}
