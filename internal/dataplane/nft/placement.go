package nft

import (
	"encoding/binary"

	"github.com/xlb-lb/xlb/internal/model"
)

// Placement: where a farm's objects go in the kernel, kept apart from what
// they hold. planFarm builds a farm's rule content (plan.go, rules.go),
// then place decides, once, which table the farm's chain and maps are in,
// which kind of chain its service keys lead to and which static sets they
// go to; the batch (farm.go) reads only the placement to know where to
// write, and the rule builders never decide it. Only the number of a
// group chain is left to the batch (joinGroup): it depends on the groups'
// occupancy, not on the farm.

// chainKind is the kind of chain a farm's service keys lead to.
type chainKind uint8

const (
	// chainOwn: a chain of the farm's own, f-<hash> (or d-<hash> in the
	// netdev table for mode dsr).
	chainOwn chainKind = iota
	// chainDirect: the shared chain of its family, direct4/direct6, one
	// dnat rule over dst4/dst6 (setDirect).
	chainDirect
	// chainGroup: a group chain of its family shared by up to groupSize
	// farms, holding the farm's one rule (group.go).
	chainGroup
)

// placement is where a farm goes (see above).
type placement struct {
	v6     bool
	netdev bool      // the netdev table (mode dsr, stlsdnat at ingress); else the inet table
	via    chainKind // the kind of chain its service keys lead to
	chain  string    // that chain's name (a group chain's once joinGroup ran)
	group  int       // chainGroup: the group chain's number in its family
	// svcSet is the static verdict map of the farm's service keys,
	// postSet the static set of its postrouting keys ("" without any),
	// dstSet (chainDirect) the map of its keys to its one backend.
	svcSet, postSet, dstSet string
}

func (p placement) isDirect() bool { return p.via == chainDirect }
func (p placement) grouped() bool  { return p.via == chainGroup }

// place computes the farm's placement from its content: the mode and the
// flags planFarm and backends set (setDirect and setGrouped have chosen
// the chain kind).
func (p *farmPlan) place() {
	pl := &p.placement
	switch {
	case p.dsrMode:
		pl.netdev = true
		pl.svcSet = pick(pl.v6, setDsr4, setDsr6)
		pl.postSet = pick(pl.v6, setDsrIf4, setDsrIf6)
	case p.l2:
		pl.netdev = true
		pl.svcSet = pick(pl.v6, setDsr4, setDsr6)
		pl.postSet = pick(pl.v6, setL2To4, setL2To6)
	case p.stls:
		pl.svcSet = pick(pl.v6, setStls4, setStls6)
	case p.mark:
		pl.svcSet = pick(pl.v6, setFwm4, setFwm6)
		pl.postSet = setMasqM
		if len(p.post) > 0 && p.post[0].Val != nil {
			pl.postSet = pick(pl.v6, setSnatM4, setSnatM6)
		}
	default:
		pl.svcSet = pick(pl.v6, setSvc4, setSvc6)
		pl.postSet = postSetName(pl.v6, len(p.post) > 0 && p.post[0].Val != nil)
	}
	if len(p.post) == 0 && !p.dsrMode && !p.l2 {
		pl.postSet = ""
	}
	if pl.via == chainDirect {
		pl.dstSet = pick(pl.v6, setDst4, setDst6)
		p.setChain(pick(pl.v6, chainDir4, chainDir6))
	}
}

// setDirect makes the farm direct if every new connection it gets goes to
// the same place: exactly one serving backend, single virtual ports of one
// protocol, and nothing that needs a rule of its own (persistence, backend
// marks or limits, the farm's new-rtlimit or est-connlimit). Whatever the
// scheduler, it would pick that backend.
//
// Why: the kernel walks every chain of every table on each commit, so a
// chain per farm makes each change cost O(farms). Direct farms share one
// chain per family, and a table of them costs a change O(1) (doc.go).
func (p *farmPlan) setDirect(f *model.Farm) {
	if len(p.active) != 1 || p.ids || p.persist != "" || f.NewRTLimit != 0 || f.EstConnLimit != 0 ||
		f.Protocol == model.ProtoAll || len(f.VirtualPorts) == 0 || len(f.Addresses) > 0 {
		return
	}
	for _, r := range f.VirtualPorts {
		if r.First != r.Last {
			return
		}
	}
	b := p.active[0]
	p.direct = make([]elem, 0, len(f.VirtualPorts))
	for _, r := range f.VirtualPorts {
		port := b.Port
		if port == 0 {
			port = r.First // keep the client's port: it is this one
		}
		val := pad4(binary.BigEndian.AppendUint16(append([]byte(nil), b.Addr.AsSlice()...), port))
		p.direct = append(p.direct, elem{Key: pad4(svcKey(f.VirtualAddr, f.Protocol.Number(), r.First)), Val: val})
	}
	p.via = chainDirect
}

func (p *farmPlan) filtSet() string { return pick(p.v6, setFsvc4, setFsvc6) }

func (p *farmPlan) logSet() string { return pick(p.v6, setLog4, setLog6) }

func (p *farmPlan) revSet() string {
	if p.l2 {
		return pick(p.v6, setDsrR4, setDsrR6)
	}
	return pick(p.v6, setStlsR4, setStlsR6)
}

func postSetName(v6, snat bool) string {
	if snat {
		return pick(v6, setSnat4, setSnat6)
	}
	return pick(v6, setMasq4, setMasq6)
}
