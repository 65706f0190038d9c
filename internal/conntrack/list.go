package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Table implements dataplane.ConnLister and dataplane.ConnCounter with
// netfilter's conntrack, read over netlink (a dump of the table, as
// `conntrack -L` does, without the binary). The nft data plane's
// connections are netfilter's entries: the original direction is client ->
// VIP, the reply direction backend -> client (or -> the SNAT source).
//
// Farms in modes dsr and stlsdnat leave no entry of theirs (they are
// forwarded at netdev ingress, before conntrack), so they list none.
type Table struct {
	// NS is the data plane's network namespace; zero or netns.None(): the
	// current one.
	NS netns.NsHandle
}

var (
	_ dataplane.ConnLister  = Table{}
	_ dataplane.ConnCounter = Table{}
)

func (c Table) handle() (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if c.NS > 0 {
		h, err = netlink.NewHandleAt(c.NS, unix.NETLINK_NETFILTER)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle for conntrack: %w", err)
	}
	return h, nil
}

// dump lists the whole table, IPv4 then IPv6.
func (c Table) dump(ctx context.Context) ([]*netlink.ConntrackFlow, error) {
	h, err := c.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var out []*netlink.ConntrackFlow
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fl, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return nil, fmt.Errorf("list conntrack table: %w", err)
		}
		out = append(out, fl...)
	}
	return out, nil
}

// farmMatcher tells a farm's entries and the backend each went to.
type farmMatcher struct {
	f     *model.Farm
	vips  []netip.Addr
	proto uint8 // 0: any
}

func newFarmMatcher(f *model.Farm) farmMatcher {
	return farmMatcher{f: f, vips: f.VirtualAddrs(), proto: f.Protocol.Number()}
}

// match reports whether fl is one of the farm's connections, and the index
// of its backend (-1: none of the farm's backends has its reply source).
// A farm with VIPs owns the entries to a VIP and one of its ports; a
// firewall-mark farm, those whose reply comes from one of its backends.
func (m farmMatcher) match(fl *netlink.ConntrackFlow) (bool, int) {
	if m.proto != 0 && fl.Forward.Protocol != m.proto {
		return false, -1
	}
	be := m.backend(fl)
	if len(m.vips) == 0 {
		return be >= 0, be
	}
	dst, _ := netip.AddrFromSlice(fl.Forward.DstIP)
	dst = dst.Unmap()
	for _, v := range m.vips {
		if dst == v {
			return m.f.ServesPort(fl.Forward.DstPort), be
		}
	}
	return false, -1
}

// backend returns the index of the backend the entry's reply comes from.
func (m farmMatcher) backend(fl *netlink.ConntrackFlow) int {
	src, ok := netip.AddrFromSlice(fl.Reverse.SrcIP)
	if !ok {
		return -1
	}
	src = src.Unmap()
	for i := range m.f.Backends {
		b := &m.f.Backends[i]
		if b.Addr == src && (b.Port == 0 || b.Port == fl.Reverse.SrcPort) {
			return i
		}
	}
	return -1
}

// connFilter is a dataplane.ConnFilter resolved against farms.
type connFilter struct {
	idx     farmIndex
	backend string // "": any
	client  netip.Addr
}

func newConnFilter(farms []*model.Farm, flt dataplane.ConnFilter) connFilter {
	return connFilter{idx: newFarmIndex(farms, flt.Owners), backend: flt.Backend, client: flt.Client.Unmap()}
}

// find returns the farm and backend index of a matching entry (ok false
// when the entry does not match).
func (cf connFilter) find(fl *netlink.ConntrackFlow) (farmMatcher, int, bool) {
	m, be, ok := cf.idx.find(fl)
	if !ok || cf.backend != "" && (be < 0 || m.f.Backends[be].Name != cf.backend) {
		return m, be, false
	}
	if cf.client.IsValid() {
		src, _ := netip.AddrFromSlice(fl.Forward.SrcIP)
		if src.Unmap() != cf.client {
			return m, be, false
		}
	}
	return m, be, true
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (cf connFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	_, _, ok := cf.find(fl)
	return ok
}

// Connections implements dataplane.ConnLister.
func (c Table) Connections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) ([]dataplane.Conn, error) {
	cf := newConnFilter(farms, flt)
	flows, err := c.dump(ctx)
	if err != nil {
		return nil, err
	}
	var out []dataplane.Conn
	for _, fl := range flows {
		if m, be, ok := cf.find(fl); ok {
			out = append(out, toConn(m.f, fl, be))
		}
	}
	return out, nil
}

// DeleteConnections implements dataplane.ConnLister.
func (c Table) DeleteConnections(ctx context.Context, farms []*model.Farm, flt dataplane.ConnFilter) (int, error) {
	cf := newConnFilter(farms, flt)
	h, err := c.handle()
	if err != nil {
		return 0, err
	}
	defer h.Close()
	total := 0
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, cf)
		total += int(n)
		if err != nil {
			return total, fmt.Errorf("delete conntrack entries: %w", err)
		}
	}
	return total, nil
}

func addrPort(ip []byte, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

func toConn(f *model.Farm, fl *netlink.ConntrackFlow, be int) dataplane.Conn {
	c := dataplane.Conn{
		Farm:     f.Name,
		Protocol: fl.Forward.Protocol,
		Expires:  time.Duration(fl.TimeOut) * time.Second,
		Client:   addrPort(fl.Forward.SrcIP, fl.Forward.SrcPort),
		VIP:      addrPort(fl.Forward.DstIP, fl.Forward.DstPort),
		Backend:  addrPort(fl.Reverse.SrcIP, fl.Reverse.SrcPort),
	}
	if be >= 0 {
		c.BackendName = f.Backends[be].Name
	}
	c.State, c.Active = flowState(fl)
	return c
}

// tcpStates are netfilter's TCP states (enum tcp_conntrack), named as
// IPVS and `conntrack -L` name them.
var tcpStates = [...]string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT",
	"CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}

// tcpEstablished is TCP_CONNTRACK_ESTABLISHED.
const tcpEstablished = 3

// flowState names an entry's state and says whether it is active (an
// established TCP connection: IPVS's ActiveConn).
func flowState(fl *netlink.ConntrackFlow) (string, bool) {
	switch fl.Forward.Protocol {
	case unix.IPPROTO_TCP:
		if p, ok := fl.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
			if int(p.State) < len(tcpStates) {
				return tcpStates[p.State], p.State == tcpEstablished
			}
			return "TCP_" + strconv.Itoa(int(p.State)), false
		}
		return "TCP", false
	case unix.IPPROTO_UDP:
		return "UDP", false
	case unix.IPPROTO_SCTP:
		return "SCTP", false
	}
	return "PROTO_" + strconv.Itoa(int(fl.Forward.Protocol)), false
}

// CountConns implements dataplane.ConnCounter: one dump of the table, each
// entry counted for the farm (and backend) it belongs to.
func (c Table) CountConns(ctx context.Context, farms []*model.Farm, owners *plan.ConnOwners) (dataplane.ConnTable, error) {
	flows, err := c.dump(ctx)
	if err != nil {
		return dataplane.ConnTable{}, err
	}
	out := dataplane.ConnTable{Entries: uint64(len(flows)), Capacity: readSysctl("net/netfilter/nf_conntrack_max"),
		Backends: make(map[string][]dataplane.ConnCounts, len(farms))}
	idx := newFarmIndex(farms, owners)
	for _, fl := range flows {
		m, be, ok := idx.find(fl)
		if !ok || be < 0 {
			continue
		}
		counts := out.Backends[m.f.Name]
		if counts == nil {
			counts = make([]dataplane.ConnCounts, len(m.f.Backends))
			out.Backends[m.f.Name] = counts
		}
		if _, active := flowState(fl); active {
			counts[be].Active++
		} else {
			counts[be].Inactive++
		}
	}
	return out, nil
}

// farmIndex finds the farm of an entry without trying every farm: by
// protocol and VIP, or for firewall-mark farms by backend address.
type farmIndex struct {
	byVIP  map[vipKey][]farmMatcher
	byMark map[netip.Addr][]farmMatcher
	owners *plan.ConnOwners // nil: the first farm of a key
}

type vipKey struct {
	proto uint8
	addr  netip.Addr
}

func newFarmIndex(farms []*model.Farm, owners *plan.ConnOwners) farmIndex {
	x := farmIndex{byVIP: map[vipKey][]farmMatcher{}, byMark: map[netip.Addr][]farmMatcher{}, owners: owners}
	for _, f := range farms {
		if f.Mode == model.ModeDSR || f.Mode == model.ModeStlsDNAT {
			continue // no conntrack entries of theirs
		}
		m := newFarmMatcher(f)
		if len(m.vips) == 0 {
			for i := range f.Backends {
				x.byMark[f.Backends[i].Addr] = append(x.byMark[f.Backends[i].Addr], m)
			}
			continue
		}
		for _, v := range m.vips {
			k := vipKey{m.proto, v}
			x.byVIP[k] = append(x.byVIP[k], m)
		}
	}
	return x
}

// find returns the farm of the entry and the index of its backend (-1:
// none of the farm's backends has its reply source); ok is false when the
// entry is no farm's (of those given: an entry of a farm that shares its
// key with one given is not the given one's).
func (x farmIndex) find(fl *netlink.ConntrackFlow) (farmMatcher, int, bool) {
	dst, _ := netip.AddrFromSlice(fl.Forward.DstIP)
	dst = dst.Unmap()
	src, _ := netip.AddrFromSlice(fl.Reverse.SrcIP)
	owner, asked := "", false
	for _, proto := range []uint8{fl.Forward.Protocol, 0} {
		for _, m := range x.byVIP[vipKey{proto, dst}] {
			ok, be := m.match(fl)
			if !ok {
				continue
			}
			if !asked {
				client, _ := netip.AddrFromSlice(fl.Forward.SrcIP)
				owner, asked = x.owners.Owner(fl.Forward.Protocol, netip.AddrPortFrom(dst, fl.Forward.DstPort), client, src), true
			}
			if owner == "" || owner == m.f.Name {
				return m, be, true
			}
		}
	}
	for _, m := range x.byMark[src.Unmap()] {
		if ok, be := m.match(fl); ok {
			return m, be, true
		}
	}
	return farmMatcher{}, -1, false
}

// readSysctl reads a number from /proc/sys (0 when it cannot).
func readSysctl(name string) uint64 {
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v
}
