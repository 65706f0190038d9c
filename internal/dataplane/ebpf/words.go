package ebpf

import (
	"encoding/binary"
	"net/netip"
)

// ne32 returns the uint32 whose memory holds a's 4 bytes (network order).
func ne32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// addrWords returns an address as a key's 4 x 32 bits (memory in network
// order): an IPv4 address in word 0, the rest zero.
func addrWords(a netip.Addr) [4]uint32 {
	if a.Is4() {
		return [4]uint32{ne32(a)}
	}
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func familyOf(a netip.Addr) uint8 {
	if a.Is4() {
		return afInet
	}
	return afInet6
}

// ne16 returns the uint16 whose memory holds v in network order.
func ne16(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// wordsAddr is addrWords reversed.
func wordsAddr(w [4]uint32, family uint8) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	if family == afInet {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

func be16(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}
