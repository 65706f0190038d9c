package nft

import (
	"github.com/google/nftables/expr"

	"github.com/xlb-lb/xlb/internal/model"
)

// Mode local (nftlb's): the LB itself is the service. nftlb 1.0.7 programs
// nothing for such a farm but its filter chain (where its policies, limits
// and queue apply); packets to the VIP go on to the LB's own sockets. In
// xlb a local farm has its service keys and its chain like any farm, but
// the chain forwards nothing:
//
//	chain f-<hash> {
//		add @nl-... { ip saddr limit rate over ... } counter log prefix "..." drop   (new-rtlimit, per client)
//		add @el-... { ip saddr ct count over N } counter log prefix "..." drop       (est-connlimit, per client)
//		counter accept
//	}
//
// and its filter chain (tcp-strict, rst-rtlimit, queue, helper) and
// policies work as for any farm. Its backends are kept in the
// configuration and not used. The VIP must be an address of the LB (or
// routed to it) for the packets to reach a local socket. A farm's log is
// written in postrouting, which a packet for a local socket never passes,
// so log is refused on local farms.

// localRules returns the chain of a local farm.
func (p *farmPlan) localRules(f *model.Farm) [][]expr.Any {
	return append(p.newConnLimitRules(f, p.logGroup), []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}})
}
