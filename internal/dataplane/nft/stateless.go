package nft

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Mode stlsdnat: stateless DNAT both ways, before conntrack. The raw chain
// (prerouting, priority raw) sends a client's packet for the VIP to the
// farm's chain, which marks it untracked, picks a backend per packet (so
// only hash schedulers: hash, symhash, maglev) and rewrites destination
// address and port (checksums fixed up); the kernel then routes it to the
// backend. A backend's reply (source backend . protocol . port, in
// stlsr4/6) goes to the farm's reverse chain, which marks it untracked and
// rewrites its source back to the VIP and virtual port. Backends must route
// replies through the LB (as in dnat mode). Nothing is kept per connection.

// revElems are the reverse keys: each backend . protocol . its port (or
// the virtual ports when it keeps the client's port).
func revElems(f *model.Farm, chain string) []elem {
	var out []elem
	seen := map[string]bool{}
	for _, b := range f.Backends {
		ports := []model.PortRange{{First: b.Port, Last: b.Port}}
		if b.Port == 0 {
			ports = f.VirtualPorts
		}
		for _, r := range ports {
			e := elem{Key: pad4(svcKey(b.Addr, f.Protocol.Number(), r.First)), KeyEnd: pad4(svcKey(b.Addr, f.Protocol.Number(), r.Last)), Chain: chain}
			if !seen[e.id()] {
				seen[e.id()] = true
				out = append(out, e)
			}
		}
	}
	return out
}

// l4csum is the offset of the transport checksum.
func l4csum(p model.Protocol) uint32 {
	if p == model.ProtoUDP {
		return 6
	}
	return 16
}

// writeAddrPort rewrites the destination (or source) address from reg1
// and, when port is not 0, the port to it, fixing the IP and transport
// checksums.
func writeAddrPort(v6 bool, proto model.Protocol, src bool, port uint16) []expr.Any {
	off := pick(v6, uint32(16), 24)
	poff := uint32(2)
	if src {
		off, poff = pick(v6, uint32(12), 8), 0
	}
	// IPv4: fix the header checksum (offset 10) and, as the address is
	// in the pseudo header, the transport checksum (L4CSUM_PSEUDOHDR).
	//
	// IPv6 has no header checksum: only the transport checksum is to be
	// fixed, i.e. checksum type none with the pseudo-header flag, which
	// the kernel takes but google/nftables v0.3.0 cannot send (it sends
	// the flags only with a checksum type). So the inet checksum offset
	// points into the address field being written: the kernel
	// (nft_payload_set_eval) updates that 16-bit "checksum", then the
	// transport checksum, then stores the new address over both bytes,
	// so the net effect is type none plus the flag. (A transport
	// checksum offset would be wrong for CHECKSUM_PARTIAL packets, which
	// only the pseudo-header path handles.)
	csumOff := uint32(10)
	if v6 {
		csumOff = off
	}
	a := &expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1, Base: expr.PayloadBaseNetworkHeader,
		Offset: off, Len: pick(v6, uint32(4), 16), CsumType: expr.CsumTypeInet, CsumOffset: csumOff, CsumFlags: unix.NFT_PAYLOAD_L4CSUM_PSEUDOHDR}
	out := []expr.Any{a}
	if port != 0 {
		out = append(out,
			&expr.Immediate{Register: reg1, Data: binary.BigEndian.AppendUint16(nil, port)},
			&expr.Payload{OperationType: expr.PayloadWrite, SourceRegister: reg1,
				Base: expr.PayloadBaseTransportHeader, Offset: poff, Len: 2, CsumType: expr.CsumTypeInet, CsumOffset: l4csum(proto)})
	}
	return out
}

// stlsForward: notrack; <scheduler> map @m -> backend; rewrite; accept.
func (p *farmPlan) stlsForward(f *model.Farm, head []expr.Any) []expr.Any {
	r := append([]expr.Any{&expr.Notrack{}}, head...)
	r = append(r, writeAddrPort(p.v6, f.Protocol, false, p.stlsPort)...)
	return append(r, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})
}

// stlsReverse: notrack; ip saddr set VIP [th sport set virtual port]; accept.
func stlsReverse(f *model.Farm, rewritePort bool) [][]expr.Any {
	v6 := f.VirtualAddr.Is6()
	r := append(nfproto(v6), &expr.Notrack{}, &expr.Immediate{Register: reg1, Data: f.VirtualAddr.AsSlice()})
	var port uint16
	if rewritePort {
		port = f.VirtualPorts[0].First
	}
	r = append(r, writeAddrPort(v6, f.Protocol, true, port)...)
	return [][]expr.Any{append(r, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept})}
}
