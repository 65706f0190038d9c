package plan

import (
	"encoding/binary"
	"net/netip"

	"github.com/xlb-lb/xlb/internal/model"
)

// The flow hash is the one function both planes use to turn a flow into a
// slot of a Maglev table: the Linux kernel's jhash (Bob Jenkins' lookup3,
// lib/jhash.h) with seed FlowSeed, over the flow's key laid out as the
// nftables plane's registers hold it, scaled to the table size as the
// kernel's nft_hash expression does (reciprocal_scale). The nftables plane
// has the kernel compute it with `jhash ... mod M seed FlowSeed`; the eBPF
// program computes the same words with the same jhash (bpf/xlb_lb.c,
// lb_flow_hash). FlowSlot is the Go model of both.
//
// Why jhash: it is the only keyed hash an nftables rule can compute over
// arbitrary packet fields, so choosing it lets the two kernels agree
// without either emulating the other.

// FlowSeed is the seed of the flow hash: one constant for every farm and
// node (the choice depends only on the flow and the backend set, so every
// node of a cluster sends a flow to the same backend). It is XLB_HASH_SEED
// of bpf/xlb_consts.h ("xlb!").
const FlowSeed uint32 = 0x786c6221

// Flow is a connection's 5-tuple as the LB sees its first packet.
type Flow struct {
	Src, Dst     netip.Addr
	SPort, DPort uint16
}

// FlowKey appends the bytes the flow hash covers to b: the fields of keys
// in the order source address, destination address, source port,
// destination port, each padded to 4 bytes (IPv4 addresses take 4 bytes,
// IPv6 16; a port is its 2 bytes in network order and 2 zero bytes), as
// nft loads a concatenation into registers.
func FlowKey(b []byte, keys model.HashKey, fl Flow) []byte {
	if keys&model.KeySrcIP != 0 {
		b = append(b, fl.Src.AsSlice()...)
	}
	if keys&model.KeyDstIP != 0 {
		b = append(b, fl.Dst.AsSlice()...)
	}
	if keys&model.KeySrcPort != 0 {
		b = append(binary.BigEndian.AppendUint16(b, fl.SPort), 0, 0)
	}
	if keys&model.KeyDstPort != 0 {
		b = append(binary.BigEndian.AppendUint16(b, fl.DPort), 0, 0)
	}
	return b
}

// FlowSlot returns the slot of a table of m slots that the flow hash gives
// the flow hashed over keys.
func FlowSlot(keys model.HashKey, fl Flow, m int) int {
	var buf [40]byte
	return Scale(Jhash(FlowKey(buf[:0], keys, fl), FlowSeed), m)
}

// Scale maps a 32-bit hash onto [0, m) as the kernel's reciprocal_scale
// does (nft_jhash_eval): the high 32 bits of h*m, not h mod m.
func Scale(h uint32, m int) int {
	return int(uint64(h) * uint64(m) >> 32)
}

// jhashInit is JHASH_INITVAL of the kernel's linux/jhash.h.
const jhashInit = 0xdeadbeef

// Jhash is the kernel's jhash(key, length, initval) of linux/jhash.h: full
// 12-byte blocks are read as CPU-order words (get_unaligned_cpu32), the
// tail byte by byte (little-endian), which is what nft_jhash_eval hashes
// over the registers.
func Jhash(k []byte, initval uint32) uint32 {
	a := jhashInit + uint32(len(k)) + initval
	b, c := a, a
	for len(k) > 12 {
		a += binary.NativeEndian.Uint32(k[0:])
		b += binary.NativeEndian.Uint32(k[4:])
		c += binary.NativeEndian.Uint32(k[8:])
		a, b, c = jhashMix(a, b, c)
		k = k[12:]
	}
	if len(k) == 0 {
		return c
	}
	var tail [12]byte
	copy(tail[:], k)
	a += binary.LittleEndian.Uint32(tail[0:])
	b += binary.LittleEndian.Uint32(tail[4:])
	c += binary.LittleEndian.Uint32(tail[8:])
	_, _, c = jhashFinal(a, b, c)
	return c
}

func rol32(w uint32, s uint) uint32 { return w<<s | w>>(32-s) }

// jhashMix is __jhash_mix.
func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= rol32(c, 4)
	c += b
	b -= a
	b ^= rol32(a, 6)
	a += c
	c -= b
	c ^= rol32(b, 8)
	b += a
	a -= c
	a ^= rol32(c, 16)
	c += b
	b -= a
	b ^= rol32(a, 19)
	a += c
	c -= b
	c ^= rol32(b, 4)
	b += a
	return a, b, c
}

// jhashFinal is __jhash_final.
func jhashFinal(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= rol32(b, 14)
	a ^= c
	a -= rol32(c, 11)
	b ^= a
	b -= rol32(a, 25)
	c ^= b
	c -= rol32(b, 16)
	a ^= c
	a -= rol32(c, 4)
	b ^= a
	b -= rol32(a, 14)
	c ^= b
	c -= rol32(b, 24)
	return a, b, c
}
