package nft

import (
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/nsenter"
)

// localnetSuffix names the table of EnableLocalhostNodePorts' guard,
// next to the farms' tables (RemoveTables removes it with them).
const localnetSuffix = "-localnet"

// ctStatusDNAT is IPS_DST_NAT: the connection's destination was
// translated.
const ctStatusDNAT = 1 << 5

// EnableLocalhostNodePorts makes farms on 127.0.0.1 work for the node's own
// connections, as kube-proxy's iptables mode serves localhost NodePorts:
//
//   - net.ipv4.conf.all.route_localnet = 1 in namespace ns: the output
//     hook's dnat turns 127.0.0.1 into a backend's address, and the kernel
//     refuses to route a packet whose source is 127.0.0.1 off the host (and
//     to take in the replies, translated back to 127.0.0.1) without it. The
//     farm's snat (masquerade) then gives the packet the outgoing
//     interface's address.
//   - route_localnet also lets other hosts reach the node's
//     loopback-bound services by sending packets to 127.0.0.1
//     (CVE-2020-8558): table inet <prefix>-localnet drops, at input, every
//     new connection to 127.0.0.0/8 from outside that address range that
//     did not arrive on lo and was not translated by a farm — kube-proxy's
//     "block incoming localnet connections" rule.
//
// IPv6 has no such setting: ::1 never serves NodePorts (nor does it with
// kube-proxy). The sysctl is left as it is when the proxy stops, as
// kube-proxy leaves it; the table goes with --cleanup.
func EnableLocalhostNodePorts(ns netns.NsHandle, prefix string) error {
	err := nsenter.Run(ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/route_localnet", []byte("1"), 0)
	})
	if err != nil {
		return fmt.Errorf("set net.ipv4.conf.all.route_localnet to 1 (localhost NodePorts): %w", err)
	}
	c, err := dialNFT(ns)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := c.AddTable(&nftables.Table{Name: prefix + localnetSuffix, Family: nftables.TableFamilyINet})
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Table: t, Name: "input", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.FlushChain(ch)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: localnetGuard()})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("add table inet %s (localhost NodePorts' guard): %w", t.Name, err)
	}
	return nil
}

// localnetGuard is the guard rule:
//
//	meta nfproto ipv4 iifname != "lo" ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8
//	  ct state != { established, related } ct status & dnat == 0 counter drop
func localnetGuard() []expr.Any {
	zero := make([]byte, 4)
	net8 := func(off uint32, op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: zero},
			&expr.Cmp{Op: op, Register: reg1, Data: []byte{127, 0, 0, 0}},
		}
	}
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifnameData("lo")},
	}
	out = append(out, net8(16, expr.CmpOpEq)...)
	out = append(out, net8(12, expr.CmpOpNeq)...)
	return append(out,
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: zero},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: zero},
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusDNAT), Xor: zero},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: zero},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	)
}
