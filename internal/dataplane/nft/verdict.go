package nft

import (
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// What a farm does when one of its limits matches, as nftlb 1.0 does it
// (seen in the rules Debian's nftlb 1.0.7 emits):
//
//	<match> log prefix "<prefix>" drop          verdict "log drop accept" (the default), "log drop"
//	<match> drop                                verdict "drop", "drop accept"
//	<match> log prefix "<prefix>"               verdict "log", "log accept": logged, let through
//	<match>                                     verdict "accept": let through
//	<match> jump v-<hash>-<kind>                with log-rtlimit, when the verdict logs
//	chain v-<hash>-<kind> { limit rate <log-rtlimit> log prefix "<prefix>"; drop }
//
// The limits are new-rtlimit, rst-rtlimit, est-connlimit (farm and
// backend) and tcp-strict. The prefix is the field's *-log-prefix, by
// default nftlb's "KNAME-FNAME " (backends: "KNAME-FNAME-BNAME "), where
// KNAME is the field's name, FNAME the farm's and BNAME the backend's, in
// a given prefix too. log-rtlimit limits the log lines only: the packets
// over the limit are still dropped, so the rate-limited log needs a chain
// of its own (a limit in the rule would let the drop through with the log).

// limitKind names one of a farm's limits: its verdict chain's suffix and
// nftlb's KNAME.
type limitKind struct {
	suffix string // of the verdict chain: v-<hash>-<suffix>
	kname  string
}

var (
	kindNewRT   = limitKind{"n", "new-rtlimit"}
	kindRstRT   = limitKind{"r", "rst-rtlimit"}
	kindEstConn = limitKind{"e", "est-connlimit"}
	kindStrict  = limitKind{"s", "tcp-strict"}
)

// backendKind is the kind of a backend's est-connlimit; the verdict
// chain is per backend id.
func backendKind(id uint32) limitKind {
	return limitKind{"b" + strconv.FormatUint(uint64(id), 16), "est-connlimit"}
}

const farmVerdict = "v-" // verdict chain: v-<hash>-<kind>

// limitPrefix returns the log prefix of a limit: prefix (nftlb's default
// when empty) with KNAME, FNAME and BNAME replaced, cut to what the kernel
// holds.
func limitPrefix(prefix, kname, farm, backend string) string {
	if prefix == "" {
		prefix = "KNAME-FNAME "
		if backend != "" {
			prefix = "KNAME-FNAME-BNAME "
		}
	}
	return plan.LogPrefix(prefix, kname, "", farm, backend)
}

// verdictChainName names a farm's verdict chain of one limit.
func verdictChainName(farm string, k limitKind) string {
	return farmVerdict + nameHash(farm) + "-" + k.suffix
}

// onMatch returns the statements that follow a limit's match in the
// farm's rule (after a counter), and the verdict chain they jump to ("" if
// none): see the top of this file. group is the NFLOG group of log lines
// (0: the kernel log).
func onMatch(f *model.Farm, k limitKind, prefix string, group uint16) ([]expr.Any, string) {
	out := []expr.Any{&expr.Counter{}}
	logs := f.Verdict&model.VerdictLog != 0
	if logs && f.LogRTLimit != 0 {
		return append(out, &expr.Verdict{Kind: expr.VerdictJump, Chain: verdictChainName(f.Name, k)}), verdictChainName(f.Name, k)
	}
	if logs {
		out = append(out, logExpr(prefix, group))
	}
	if f.Verdict&model.VerdictDrop != 0 {
		out = append(out, &expr.Verdict{Kind: expr.VerdictDrop})
	}
	return out, ""
}

// verdictChainRules returns the rules of a verdict chain (log-rtlimit):
// the rate-limited log line, then the drop if the verdict drops.
func verdictChainRules(f *model.Farm, prefix string, group uint16) [][]expr.Any {
	rules := [][]expr.Any{{
		&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(f.LogRTLimit), Unit: limitUnit(f.LogRTUnit), Burst: 0},
		logExpr(prefix, group),
	}}
	if f.Verdict&model.VerdictDrop != 0 {
		rules = append(rules, []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}})
	}
	return rules
}

func logExpr(prefix string, group uint16) *expr.Log {
	l := &expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte(prefix)}
	if group != 0 {
		l.Key |= 1 << unix.NFTA_LOG_GROUP
		l.Group = group
	}
	return l
}

// limitUnit is the nftables unit of a rate.
func limitUnit(u model.RateUnit) expr.LimitTime {
	switch u {
	case model.PerMinute:
		return expr.LimitTimeMinute
	case model.PerHour:
		return expr.LimitTimeHour
	case model.PerDay:
		return expr.LimitTimeDay
	case model.PerWeek:
		return expr.LimitTimeWeek
	}
	return expr.LimitTimeSecond
}

// verdictChain is a verdict chain a farm needs, with its rules.
type verdictChain struct {
	name  string
	rules [][]expr.Any
}

// verdictChains returns the verdict chains the farm's limits jump to (none
// unless it has log-rtlimit and a verdict that logs).
func verdictChains(f *model.Farm, group uint16, hasFilter bool) []verdictChain {
	if f.LogRTLimit == 0 || f.Verdict&model.VerdictLog == 0 || f.State != model.StateUp {
		return nil
	}
	var out []verdictChain
	add := func(k limitKind, prefix, backend string) {
		p := limitPrefix(prefix, k.kname, f.Name, backend)
		out = append(out, verdictChain{name: verdictChainName(f.Name, k), rules: verdictChainRules(f, p, group)})
	}
	if f.NewRTLimit != 0 {
		add(kindNewRT, f.NewRTLogPrefix, "")
	}
	if f.EstConnLimit != 0 {
		add(kindEstConn, f.EstConnLogPrefix, "")
	}
	if hasFilter && f.RstRTLimit != 0 {
		add(kindRstRT, f.RstRTLogPrefix, "")
	}
	if hasFilter && f.TCPStrict {
		add(kindStrict, f.TCPStrictLogPrefix, "")
	}
	for _, b := range f.ActiveBackends() {
		if b.EstConnLimit != 0 {
			add(backendKind(backendID(b)), b.EstConnLogPrefix, b.Name)
		}
	}
	return out
}

// putVerdictChains makes the farm's verdict chains hold their rules (they
// must exist before the farm's rules that jump to them) and returns their
// names.
func (b *batch) putVerdictChains(vcs []verdictChain) []string {
	var names []string
	for _, vc := range vcs {
		ch := &nftables.Chain{Table: b.p.table, Name: vc.name}
		b.c.AddChain(ch) // idempotent: an existing chain is kept
		b.c.FlushChain(ch)
		for _, r := range vc.rules {
			b.c.AddRule(&nftables.Rule{Table: b.p.table, Chain: ch, Exprs: r})
		}
		names = append(names, vc.name)
	}
	return names
}

// dropVerdictChains deletes the chains of old not in keep; the rules that
// jumped to them are gone (flushed) by then.
func (b *batch) dropVerdictChains(old []string, keep []string) {
	for _, name := range old {
		if !slices.Contains(keep, name) {
			ch := &nftables.Chain{Table: b.p.table, Name: name}
			b.c.FlushChain(ch)
			b.delChain(ch)
		}
	}
}
