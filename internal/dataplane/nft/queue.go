package nft

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"

	"github.com/xlb-lb/xlb/internal/model"
)

// A farm's "queue" (nfqueue): its new connections go to a userspace queue
// before they are balanced; the program reading the queue accepts or drops
// each. nftlb 1.0.7 emits `tcp flags syn queue num N bypass` in the farm's
// filter chain; xlb's rule in the farm's filter chain (g-<hash>, after
// conntrack, before NAT) is
//
//	ct state new counter queue num N bypass
//
// so a udp farm's new flows are queued too (nftlb's rule matches TCP SYNs
// only, whatever the farm's protocol). bypass: while no program listens on
// the queue, packets pass as if there were no queue (nftlb's choice too).
//
// The kernel's native queue expression (nft_queue, CONFIG_NFT_QUEUE) is not
// in every kernel (not in the 6.18 kernel xlb is tested on), so the rule
// uses the xtables NFQUEUE target through nft_compat
// (CONFIG_NFT_COMPAT and CONFIG_NETFILTER_XT_TARGET_NFQUEUE), as
// iptables-nft does; nft lists it as `queue num N bypass` all the same.

// nfqFlagBypass is NFQ_FLAG_BYPASS of struct xt_NFQ_info_v3.
const nfqFlagBypass = 0x01

// queueInfo is struct xt_NFQ_info_v3 {u16 queuenum, queues_total, flags},
// padded to 8 bytes (XT_ALIGN), in host byte order.
func queueInfo(num uint16) *xt.Unknown {
	b := make([]byte, 8)
	binary.NativeEndian.PutUint16(b[0:], num)
	binary.NativeEndian.PutUint16(b[2:], 1)
	binary.NativeEndian.PutUint16(b[4:], nfqFlagBypass)
	info := xt.Unknown(b)
	return &info
}

// queueRule returns the farm's queue rule, or nil without a queue.
func queueRule(f *model.Farm) []expr.Any {
	if f.Queue < 0 {
		return nil
	}
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		&expr.Counter{},
		&expr.Target{Name: "NFQUEUE", Rev: 3, Info: queueInfo(uint16(f.Queue))},
	}
}
