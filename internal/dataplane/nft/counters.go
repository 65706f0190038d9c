package nft

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Traffic counters (ipvsadm -L --stats): connections, and packets and bytes
// each way, per backend. The NAT chains see only a connection's first
// packet, so the counting is done in a filter chain of a table of its own,
// inet <prefix>-counters, hooked at forward, where every packet of a
// balanced connection passes after conntrack and NAT:
//
//	table inet xlb-counters {
//	  set pkt4 { type ipv4_addr . inet_proto . ipv4_addr . inet_service . ct_dir; counter }   (and pkt6)
//	  set new4 { type ipv4_addr . inet_proto . ipv4_addr . inet_service; counter }            (and new6)
//	  chain count { type filter hook forward priority filter
//	    meta nfproto ipv4 ct status & confirmed == 0 ct original ip daddr . meta l4proto . ct reply ip saddr . ct reply proto-src @new4
//	    meta nfproto ipv4 ct original ip daddr . meta l4proto . ct reply ip saddr . ct reply proto-src . ct direction @pkt4
//	    (and the IPv6 forms) }
//	}
//
// A set with a counter gives each element its own, which a lookup that
// matches counts: one hash lookup per forwarded packet (two for the first
// of a connection), whatever the number of farms. An element is VIP .
// protocol . backend address . backend port (the connection's original
// destination and its reply source), so the counters survive rebuilds of
// the farm's chain and maps, and restarts of the daemon (Reconcile adds
// only what is missing). One table for every farm keeps it to one lookup
// however many tables the farms are spread over.
//
// What is not counted: farms in modes dsr and stlsdnat (forwarded at
// netdev ingress, before conntrack and the forward hook), firewall-mark
// farms (no VIP to key on), connections from the LB itself (output, not
// forward), a backend of port 0 (the client's port) in a farm whose port
// ranges span more than maxCountedPorts ports, and the second of two farms
// on one VIP and protocol that send to the same backend address and port
// (its counters read zero; the first farm's count both). A farm's counters
// are its current backends' summed: a backend removed takes its counts
// with it.

const (
	countersSuffix = "-counters"
	chainCount     = "count"
	setPkt4        = "pkt4"
	setPkt6        = "pkt6"
	setNew4        = "new4"
	setNew6        = "new6"
	// maxCountedPorts bounds the elements of a backend of port 0: one per
	// virtual port.
	maxCountedPorts = 64
)

var (
	typeCtr4    = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeIPAddr, nftables.TypeInetService)
	typeCtr6    = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeIP6Addr, nftables.TypeInetService)
	typeCtrDir4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeIPAddr, nftables.TypeInetService, nftables.TypeCTDir)
	typeCtrDir6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeIP6Addr, nftables.TypeInetService, nftables.TypeCTDir)
)

// counters is the counter table and what the plane put in it.
type counters struct {
	table *nftables.Table
	sets  map[string]*nftables.Set
	// byFarm: each farm's elements as last committed; owner: the farm
	// that owns each element (set name + key).
	byFarm map[string][]ctrElem
	// size: each set's elements at the last read (the next read's map
	// size hint).
	size  map[string]int
	owner map[string]string
	// id numbers the sets in a batch, apart from the shards' ranges
	// (nextIDBase).
	id uint32
}

// ctrElem is one counter element: what it counts of which backend.
type ctrElem struct {
	set     string
	key     []byte
	backend string // the backend's name
}

func (e ctrElem) id() string { return e.set + "\x00" + string(e.key) }

func newCounters(prefix string) *counters {
	t := &nftables.Table{Name: prefix + countersSuffix, Family: nftables.TableFamilyINet}
	c := &counters{table: t, sets: map[string]*nftables.Set{}, byFarm: map[string][]ctrElem{}, owner: map[string]string{}, size: map[string]int{}}
	for _, s := range []struct {
		name string
		typ  nftables.SetDatatype
	}{{setPkt4, typeCtrDir4}, {setPkt6, typeCtrDir6}, {setNew4, typeCtr4}, {setNew6, typeCtr6}} {
		c.sets[s.name] = &nftables.Set{Table: t, Name: s.name, Concatenation: true, Counter: true,
			KeyType: s.typ, KeyByteOrder: binaryutil.BigEndian}
	}
	return c
}

// ensure adds (idempotently) the table and its sets to the batch of conn;
// existing elements and their counts stay.
func (c *counters) ensure(conn *nftables.Conn) {
	conn.AddTable(c.table)
	for _, name := range []string{setPkt4, setPkt6, setNew4, setNew6} {
		s := c.sets[name]
		c.id++
		s.ID = 0x7f000000 | c.id&0xffffff
		_ = conn.AddSet(s, nil)
	}
	accept := nftables.ChainPolicyAccept
	conn.AddChain(&nftables.Chain{Table: c.table, Name: chainCount, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
}

// ctRaw is a ct expression with a direction: NFTA_CT_DIRECTION is a u8,
// which google/nftables v0.3.0 sends as a big-endian u32 (so the kernel
// reads direction 0 whatever was asked).
func ctRaw(key uint32, dir byte, reg uint32) rawExpr {
	data, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_CT_DREG, Data: binaryutil.BigEndian.PutUint32(reg)},
		{Type: unix.NFTA_CT_KEY, Data: binaryutil.BigEndian.PutUint32(key)},
		{Type: unix.NFTA_CT_DIRECTION, Data: []byte{dir}},
	})
	b, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: []byte("ct\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
	return b
}

// countRules are the count chain's rules (see the top of the file).
func countRules() ([][]rawExpr, error) {
	var rules [][]rawExpr
	for _, v6 := range []bool{false, true} {
		w := addrWords(v6)
		src, dst := uint32(unix.NFT_CT_SRC_IP), uint32(unix.NFT_CT_DST_IP)
		if v6 {
			src, dst = unix.NFT_CT_SRC_IP6, unix.NFT_CT_DST_IP6
		}
		key := func() ([]rawExpr, error) {
			out := []rawExpr{ctRaw(dst, 0, reg1)}
			meta, err := encode(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + w})
			if err != nil {
				return nil, err
			}
			return append(out, meta, ctRaw(src, 1, reg32+w+1), ctRaw(unix.NFT_CT_PROTO_SRC, 1, reg32+2*w+1)), nil
		}
		head := func(extra ...expr.Any) ([]rawExpr, error) {
			var out []rawExpr
			for _, e := range append(nfproto(v6), extra...) {
				b, err := encode(e)
				if err != nil {
					return nil, err
				}
				out = append(out, b)
			}
			return out, nil
		}
		// A new connection, counted once: its first packet is the only
		// one whose conntrack entry is not yet confirmed (that happens
		// when it leaves, at postrouting). Not "ct state new": that holds
		// for every packet of a flow that has had no answer yet.
		newRule, err := head(
			&expr.Ct{Register: reg1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(ipsConfirmed), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(0)},
		)
		if err != nil {
			return nil, err
		}
		k, err := key()
		if err != nil {
			return nil, err
		}
		look, err := encode(&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setNew4, setNew6)})
		if err != nil {
			return nil, err
		}
		rules = append(rules, append(append(newRule, k...), look))

		pktRule, err := head()
		if err != nil {
			return nil, err
		}
		k, err = key()
		if err != nil {
			return nil, err
		}
		dir, err := encode(&expr.Ct{Register: reg32 + 2*w + 2, Key: expr.CtKeyDIRECTION})
		if err != nil {
			return nil, err
		}
		look, err = encode(&expr.Lookup{SourceRegister: reg1, SetName: pick(v6, setPkt4, setPkt6)})
		if err != nil {
			return nil, err
		}
		rules = append(rules, append(append(append(pktRule, k...), dir), look))
	}
	return rules, nil
}

// ipsConfirmed is IPS_CONFIRMED, the conntrack status bit of an entry
// in the table (include/uapi/linux/netfilter/nf_conntrack_common.h).
const ipsConfirmed = 1 << 3

// counted reports whether the farm's traffic passes the count chain.
func counted(f *model.Farm) bool {
	return f.Listens() && !f.IsMarkFarm() && f.Mode != model.ModeDSR && f.Mode != model.ModeStlsDNAT && f.State == model.StateUp
}

// farmElems returns the counter elements of farm f (a whole farm: a dual
// farm's two VIPs each count the backends of their family; each further
// address counts too: model.Farm.Listeners).
func farmElems(f *model.Farm) []ctrElem {
	if !counted(f) {
		return nil
	}
	var out []ctrElem
	for _, l := range f.Listeners() {
		protos := []uint8{l.Protocol.Number()}
		if l.Protocol == model.ProtoAll {
			protos = []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP}
		}
		var vports []uint16 // for backends of port 0
		n := 0
		for _, r := range l.Ports {
			n += int(r.Last-r.First) + 1
		}
		if n > 0 && n <= maxCountedPorts {
			for _, r := range l.Ports {
				for p := int(r.First); p <= int(r.Last); p++ {
					vports = append(vports, uint16(p))
				}
			}
		}
		vip := l.Addr
		v6 := vip.Is6()
		for i := range f.Backends {
			b := &f.Backends[i]
			if b.Addr.Is6() != v6 {
				continue
			}
			ports := []uint16{b.Port}
			if b.Port == 0 {
				ports = vports
			}
			for _, proto := range protos {
				for _, port := range ports {
					k := ctrKey(vip, proto, b.Addr, port)
					out = append(out,
						ctrElem{set: pick(v6, setNew4, setNew6), key: k, backend: b.Name},
						ctrElem{set: pick(v6, setPkt4, setPkt6), key: append(append([]byte(nil), k...), 0, 0, 0, 0), backend: b.Name},
						ctrElem{set: pick(v6, setPkt4, setPkt6), key: append(append([]byte(nil), k...), 1, 0, 0, 0), backend: b.Name})
				}
			}
		}
	}
	return out
}

// ctrKey is VIP . protocol . backend address . backend port, each field
// padded to 4 bytes.
func ctrKey(vip netip.Addr, proto uint8, be netip.Addr, port uint16) []byte {
	b := append([]byte(nil), vip.AsSlice()...)
	b = append(b, proto, 0, 0, 0)
	b = append(b, be.AsSlice()...)
	return pad4(binary.BigEndian.AppendUint16(b, port))
}

// ctrPending is what a queued change will have put in the counter table.
type ctrPending struct {
	byFarm map[string][]ctrElem // nil value: the farm is gone
	owner  map[string]string    // id -> farm; "" value: released
}

// queue adds the element changes of d (whole farms, not split) to the
// batch of conn.
func (c *counters) queue(conn *nftables.Conn, d plan.Diff) *ctrPending {
	pd := &ctrPending{byFarm: map[string][]ctrElem{}, owner: map[string]string{}}
	ownerOf := func(id string) string {
		if o, ok := pd.owner[id]; ok {
			return o
		}
		return c.owner[id]
	}
	var add, del []ctrElem
	for _, ch := range d.Changes {
		name := ch.Name()
		if name == "" {
			continue
		}
		old, ok := pd.byFarm[name]
		if !ok {
			old = c.byFarm[name]
		}
		var nw []ctrElem
		if ch.New != nil {
			nw = farmElems(ch.New)
		}
		keep := map[string]bool{}
		for _, e := range nw {
			keep[e.id()] = true
		}
		for _, e := range old {
			if !keep[e.id()] && ownerOf(e.id()) == name {
				del = append(del, e)
				pd.owner[e.id()] = ""
			}
		}
		had := map[string]bool{}
		for _, e := range old {
			had[e.id()] = true
		}
		mine := nw[:0:0]
		for _, e := range nw {
			switch o := ownerOf(e.id()); {
			case o == name:
				mine = append(mine, e)
			case o != "":
				// Another farm counts this VIP . backend already.
			default:
				if !had[e.id()] {
					add = append(add, e)
				}
				pd.owner[e.id()] = name
				mine = append(mine, e)
			}
		}
		pd.byFarm[name] = mine
		if ch.New == nil {
			pd.byFarm[name] = nil
		}
	}
	c.send(conn, del, true)
	c.send(conn, add, false)
	return pd
}

// send adds (or deletes) elements, at most elemChunk a message.
func (c *counters) send(conn *nftables.Conn, els []ctrElem, del bool) {
	bySet := map[string][]nftables.SetElement{}
	for _, e := range els {
		bySet[e.set] = append(bySet[e.set], nftables.SetElement{Key: e.key})
	}
	for name, list := range bySet {
		s := c.sets[name]
		for i := 0; i < len(list); i += elemChunk {
			part := list[i:min(i+elemChunk, len(list))]
			if del {
				_ = conn.SetDeleteElements(s, part)
			} else {
				_ = conn.SetAddElements(s, part)
			}
		}
	}
}

// commit records what a queued change put in the kernel.
func (c *counters) commit(pd *ctrPending) {
	for name, els := range pd.byFarm {
		if els == nil {
			delete(c.byFarm, name)
		} else {
			c.byFarm[name] = els
		}
	}
	for id, o := range pd.owner {
		if o == "" {
			delete(c.owner, id)
		} else {
			c.owner[id] = o
		}
	}
}

// reconcile makes the counter sets hold exactly the elements of farms
// (whole farms): it lists them and, in the batch of conn, deletes the
// others and adds the missing ones. Elements already there keep their
// counts (a restarted daemon goes on counting).
func (c *counters) reconcile(conn *nftables.Conn, farms []*model.Farm) (*ctrPending, error) {
	have := map[string]bool{}
	var stale []ctrElem
	for name, s := range c.sets {
		els, err := conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list counter set %s: %w", name, err)
		}
		for _, e := range els {
			ce := ctrElem{set: name, key: e.Key}
			have[ce.id()] = true
			stale = append(stale, ce)
		}
	}
	pd := &ctrPending{byFarm: map[string][]ctrElem{}, owner: map[string]string{}}
	want := map[string]bool{}
	var add []ctrElem
	for _, f := range farms {
		var mine []ctrElem
		for _, e := range farmElems(f) {
			if _, taken := pd.owner[e.id()]; taken {
				continue
			}
			pd.owner[e.id()] = f.Name
			want[e.id()] = true
			mine = append(mine, e)
			if !have[e.id()] {
				add = append(add, e)
			}
		}
		pd.byFarm[f.Name] = mine
	}
	var del []ctrElem
	for _, e := range stale {
		if !want[e.id()] {
			del = append(del, e)
		}
	}
	c.send(conn, del, true)
	c.send(conn, add, false)
	// Reconcile replaces the whole record.
	for id := range c.owner {
		if _, ok := pd.owner[id]; !ok {
			pd.owner[id] = ""
		}
	}
	for name := range c.byFarm {
		if _, ok := pd.byFarm[name]; !ok {
			pd.byFarm[name] = nil
		}
	}
	return pd, nil
}

// read returns the counters of each farm's backends (parallel to farms and
// their backends) from one dump of each counter set (on nl).
func (c *counters) read(nl *netlink.Conn, farms []*model.Farm) ([]dataplane.FarmCounters, error) {
	// Each set's elements by key: a lookup with string(key) allocates
	// nothing.
	vals := make(map[string]map[string]ctrVal, len(c.sets))
	buf := make([]byte, 64<<10)
	for name, s := range c.sets {
		m := make(map[string]ctrVal, c.size[name])
		if err := dumpCounterSet(nl, buf, c.table.Name, s.Name, func(key []byte, v ctrVal) { m[string(key)] = v }); err != nil {
			return nil, fmt.Errorf("read counter set %s: %w", name, err)
		}
		c.size[name] = len(m)
		vals[name] = m
	}
	out := make([]dataplane.FarmCounters, len(farms))
	for i, f := range farms {
		fc := &out[i]
		fc.Backends = make([]dataplane.BackendCounters, len(f.Backends))
		index := make(map[string]int, len(f.Backends))
		for j, b := range f.Backends {
			fc.Backends[j].Name = b.Name
			index[b.Name] = j
		}
		for _, e := range c.byFarm[f.Name] {
			v, found := vals[e.set][string(e.key)]
			j, ok := index[e.backend]
			if !found || !ok {
				continue
			}
			bc := &fc.Backends[j].Counters
			switch {
			case e.set == setNew4 || e.set == setNew6:
				bc.Connections += v.packets
			case e.key[len(e.key)-4] == 0: // original: client -> backend
				bc.InPackets += v.packets
				bc.InBytes += v.bytes
			default:
				bc.OutPackets += v.packets
				bc.OutBytes += v.bytes
			}
		}
		for _, b := range fc.Backends {
			fc.Add(b.Counters)
		}
	}
	return out, nil
}

// openCounters creates (or adopts) the counter table, its sets and its
// chain, at New; its elements come with Reconcile. With NoCounters it
// deletes the table if an earlier run left it, so no packet pays for it.
func (s *Plane) openCounters() error {
	c := newCounters(s.opts.Table)
	if s.opts.NoCounters {
		tables, err := s.conn.ListTablesOfFamily(nftables.TableFamilyINet)
		if err != nil {
			return fmt.Errorf("list tables: %w", err)
		}
		for _, t := range tables {
			if t.Name == c.table.Name {
				s.conn.DelTable(c.table)
				if err := s.conn.Flush(); err != nil {
					s.redial()
					return fmt.Errorf("delete table inet %s (--nft-counters off): %w", c.table.Name, explain(err))
				}
			}
		}
		return nil
	}
	c.ensure(s.conn)
	if err := s.conn.Flush(); err != nil {
		s.redial()
		return fmt.Errorf("create table inet %s: %w", c.table.Name, explain(err))
	}
	s.ctr = c
	return s.sendCountRules()
}

// reconcileCounters makes the counter table hold exactly the elements of
// farms (whole farms), and its chain its rules; counts of elements that
// stay are kept. The caller holds s.mu.
func (s *Plane) reconcileCounters(farms []*model.Farm) error {
	if s.ctr == nil {
		return nil
	}
	// The table first (it may have been deleted by hand), then its
	// elements as they are.
	s.ctr.ensure(s.conn)
	err := s.conn.Flush()
	var pd *ctrPending
	if err == nil {
		pd, err = s.ctr.reconcile(s.conn, farms)
	}
	if err == nil {
		err = s.conn.Flush()
	}
	if err != nil {
		s.redial()
		return fmt.Errorf("table inet %s: %w", s.ctr.table.Name, explain(err))
	}
	s.ctr.commit(pd)
	return s.sendCountRules()
}

// sendCountRules replaces the count chain's rules (they never change).
func (s *Plane) sendCountRules() error {
	rules, err := countRules()
	if err != nil {
		return fmt.Errorf("encode count rules: %w", err)
	}
	return s.shards[0].sendRulesIn(s.ctr.table.Name, byte(nftables.TableFamilyINet), chainCount, rules)
}

var (
	_ dataplane.CounterReader     = (*Plane)(nil)
	_ dataplane.BulkCounterReader = (*Plane)(nil)
)

// Counters implements dataplane.CounterReader.
func (s *Plane) Counters(ctx context.Context, f *model.Farm) (dataplane.FarmCounters, error) {
	out, err := s.AllCounters(ctx, []*model.Farm{f})
	if err != nil {
		return dataplane.FarmCounters{}, err
	}
	return out[0], nil
}

// AllCounters implements dataplane.BulkCounterReader: one dump of the
// counter sets for any number of farms.
func (s *Plane) AllCounters(ctx context.Context, farms []*model.Farm) ([]dataplane.FarmCounters, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil, errClosed
	}
	if s.ctr == nil {
		return nil, fmt.Errorf("nft data plane (--nft-counters=false): %w", dataplane.ErrNoCounters)
	}
	nl, err := s.dialCounters()
	if err != nil {
		return nil, err
	}
	defer nl.Close()
	return s.ctr.read(nl, farms)
}
