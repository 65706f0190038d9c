package nft

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Backend est-connlimit (IPVS's upper threshold): a backend with a limit
// takes no new connection while it holds that many. Such a farm names its
// backends by id through the ct mark (see persist.go) and, per distinct
// limit L, has
//
//	set i-<hash>-<gen>-L { type mark; }   the ids of the serving backends with limit L
//	set c-<hash>-L { type mark; flags dynamic; }  one connection counter per backend
//
// and its chain is
//
//	ct mark set <scheduler> map @m
//	ct mark @i-..-L add @c-..-L { ct mark ct count over L } counter drop   (one rule per L)
//	dnat to ct mark map @a
//
// The counter sets keep their names across rebuilds, so the counts survive
// changes to the farm. A connection over the limit is dropped (the client
// retries and, with rr, reaches the next backend), as nftlb does; it is not
// rescheduled at once. Not available together with persistence yet.
// The farm's verdict (verdict.go) decides what happens over the limit.

// limitSets are the sets of one limit value.
type limitSets struct {
	limit      uint32
	ids, count *nftables.Set
}

func idsName(mapName string, limit uint32) string {
	return "i" + mapName[1:] + "-" + strconv.FormatUint(uint64(limit), 10)
}

func countName(farm string, limit uint32) string {
	return fmt.Sprintf("c-%s-%d", nameHash(farm), limit)
}

// limitList returns the plan's distinct limits, sorted.
func (p *farmPlan) limitList() []uint32 {
	var out []uint32
	for l := range p.limits {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

// limitRules returns the chain of a farm with backend limits (without the
// final drop). sched is the scheduling rule (it leaves a backend id in reg1
// and ends with counter and dnat n). What follows a backend over its limit
// is the farm's verdict (verdict.go); a verdict that logs names the
// backend in the log prefix (nftlb's default "est-connlimit-<farm>-<backend> "),
// so then each backend with a limit has a rule of its own, as in nftlb:
//
//	ct mark <id> add @c-..-L { ct mark ct count over L } counter log prefix "..." drop
func (p *farmPlan) limitRules(f *model.Farm, sched []expr.Any, n *expr.NAT, aset *nftables.Set) [][]expr.Any {
	head := sched[:len(sched)-2]
	pick := append(append([]expr.Any(nil), head...), &expr.Ct{Key: expr.CtKeyMARK, Register: reg1, SourceRegister: true})
	rules := [][]expr.Any{pick}
	logs := f.Verdict&model.VerdictLog != 0
	count := func(ls limitSets) expr.Any {
		return &expr.Dynset{SrcRegKey: reg1, SetName: ls.count.Name, SetID: ls.count.ID, Operation: unix.NFT_DYNSET_OP_ADD,
			Exprs: []expr.Any{&expr.Connlimit{Count: ls.limit, Flags: connlimitOver}}}
	}
	for _, ls := range p.lsets {
		if !logs {
			then, _ := onMatch(f, kindEstConn, "", p.logGroup)
			rules = append(rules, append([]expr.Any{
				&expr.Ct{Key: expr.CtKeyMARK, Register: reg1},
				&expr.Lookup{SourceRegister: reg1, SetName: ls.ids.Name, SetID: ls.ids.ID},
				count(ls),
			}, then...))
			continue
		}
		for _, b := range p.active {
			if b.EstConnLimit != ls.limit {
				continue
			}
			id := backendID(b)
			then, _ := onMatch(f, backendKind(id), limitPrefix(b.EstConnLogPrefix, kindEstConn.kname, f.Name, b.Name), p.logGroup)
			rules = append(rules, append([]expr.Any{
				&expr.Ct{Key: expr.CtKeyMARK, Register: reg1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(id)},
				count(ls),
			}, then...))
		}
	}
	return append(rules, p.resolve(n, aset))
}
