// Package ebpf is xlb's eBPF data plane: a tcx ingress program (bpf/xlb_lb.c)
// that balances TCP and UDP over IPv4 and IPv6 (dnat and snat with NAT both
// ways, dsr, stlsdnat), and the Go side
// that loads it, attaches it to the interfaces of a network namespace and
// keeps its maps in line with the farms. Programs, links and maps are pinned
// under a bpffs directory so a restarted daemon adopts them without dropping
// traffic or connections. See docs/dataplane-ebpf.md.
package ebpf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/nsenter"
)

// DefaultPinPath is where maps and links are pinned unless Options says otherwise.
const DefaultPinPath = "/sys/fs/bpf/xlb"

// DefaultConnTableSize is the default number of conntrack entries (two per
// connection).
const DefaultConnTableSize = 1 << 18

// Options configure a Plane.
type Options struct {
	// NetNS is the network namespace whose interfaces the program is
	// attached to; 0 means the caller's.
	NetNS netns.NsHandle
	// Interfaces to attach to (tcx ingress); empty means every interface
	// of the namespace but loopback, as found at New.
	Interfaces []string
	// ConnTableSize is the conntrack LRU's size in entries (two per
	// connection), fixed at start-up like IPVS's conn_tab_bits. Changing it
	// across a restart recreates the table (tracked connections are lost).
	ConnTableSize int
	// PinPath is a directory on a bpf file system. Default
	// /sys/fs/bpf/xlb; bpffs is mounted at /sys/fs/bpf if it is not.
	PinPath string
	// XDP attaches the XDP fast path for dsr flows to the same
	// interfaces (off when empty); see XDPMode.
	XDP XDPMode
	// Timeouts are the conntrack idle timeouts; zero fields take the
	// defaults (DefaultTimeouts). They are constants of the loaded program:
	// changing them takes a restart, which is hitless.
	Timeouts Timeouts

	// BridgePortRedirect sends a next hop behind a bridge of the namespace
	// (one without VLAN filtering) straight to the bridge port its MAC was
	// learnt on, with bpf_redirect_peer, when that port is a veth or netkit
	// whose peer is in another namespace (a container's): the packet skips
	// the bridge's and the port's transmit. It also skips what the bridge
	// would do on the way: its output hooks (nft bridge family, ebtables),
	// port isolation, and its counters. Off by default.
	BridgePortRedirect bool

	// SocketCgroup turns on socket-level balancing (bpf/xlb_sock.c) for
	// the processes of this cgroup v2 directory and its descendants:
	// their connect() and sendmsg() to a service address in the plane's
	// namespace go straight to a backend (socklb.go). Empty: off (and
	// links of an earlier run are removed).
	SocketCgroup string

	// SNATPorts are the source ports of this node's snat flows (zero:
	// 1024-65535). Nodes that share a farm's source-addr take disjoint
	// ranges (docs/ha.md).
	SNATPorts model.PortRange

	// PoliciesOnOutput: the socket programs check farms' policies (named
	// tables) for the connections they balance, as kube-proxy filters the
	// node's own connections by loadBalancerSourceRanges. The source is
	// the socket's bound address, or for an unbound socket the node's
	// address towards the VIP (a route lookup when the policies are
	// written). A refused connect() or sendmsg() fails with EPERM. Off
	// (as the nft plane without its Options.PoliciesOnOutput), the node's
	// own connections are not filtered.
	PoliciesOnOutput bool

	// ctRefresh overrides XLB_CT_REFRESH_NS (benchmarks).
	ctRefresh time.Duration
	// syncIdleWait overrides syncIdleWait (tests: a record must wake the
	// reader).
	syncIdleWait time.Duration
	// noPeerRedirect leaves xlb_peer_tx empty: every next hop takes
	// plain bpf_redirect (tests of the transmit path).
	noPeerRedirect bool
}

// Timeouts are the idle timeouts of tracked connections by state, like
// IPVS's (ipvsadm --set tcp tcpfin udp).
type Timeouts struct {
	TCP    time.Duration // established
	TCPFin time.Duration // after a FIN in either direction
	UDP    time.Duration
	SYN    time.Duration // SYN seen, handshake not completed
	Close  time.Duration // after a RST
}

// DefaultTimeouts are IPVS's defaults.
var DefaultTimeouts = Timeouts{
	TCP:    900 * time.Second,
	TCPFin: 120 * time.Second,
	UDP:    300 * time.Second,
	SYN:    60 * time.Second,
	Close:  10 * time.Second,
}

// withDefaults fills zero fields from DefaultTimeouts.
func (t Timeouts) withDefaults() Timeouts {
	d := DefaultTimeouts
	for _, f := range []struct{ v, def *time.Duration }{
		{&t.TCP, &d.TCP}, {&t.TCPFin, &d.TCPFin}, {&t.UDP, &d.UDP}, {&t.SYN, &d.SYN}, {&t.Close, &d.Close},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return t
}

// Plane is the eBPF data plane.
type Plane struct {
	log  *slog.Logger
	opts Options
	// ifMACs: what writeIfMACs last wrote into xlb_if_mac (hostmac.go).
	ifMACs map[uint32]xlbIfMac
	ns     netns.NsHandle // -1: the caller's
	nl     *netlink.Handle
	objs   xlbObjects

	mu       sync.Mutex
	links    map[string]link.Link   // by interface name
	xdpLinks map[string]link.Link   // by interface name
	farms    map[string]*generation // set through setFarm and dropFarm
	svcIdx   svcIndex               // farms' service keys by VIP
	svcIDs
	backendIDs
	farmIDs farmIDs       // each farm's own id (farmids.go)
	pending []*generation // replaced generations, freed at the next change
	// srcMemo: sourceFor's answers during one Apply or Reconcile
	// (hairpin.go); nil outside them.
	srcMemo sourceCache
	// stlOwner: the farm whose stlsdnat reply mapping each xlb_stateless
	// key is.
	stlOwner map[xlbStlKey]string
	// bySvc: the generation of each generation id in the maps (current
	// or pending), to name the farm and backend of a log record.
	bySvc map[uint32]*generation
	// carry: counters of backends removed from a farm (their xlb_be_stats
	// entries are gone), so a farm's totals do not go backwards.
	carry map[string]dataplane.Counters
	// statSlot: each backend id's counter slot in xlb_be_stats (kept in
	// its xlb_be_flags value too); statSlots allocates them.
	statSlot map[uint32]uint32
	// statKeys, statBuf: AllCounters' buffers for the batched read of
	// the counter slots (reused: the rate estimator reads every 2 s).
	statKeys []uint32
	statBuf  []xlbBeStats
	statSlots
	// watched: the backend ids in xlb_passive (passive.go).
	watched map[uint32]*watch
	// events reads the connection log; evDone is closed when its
	// goroutine ends.
	events *ringbuf.Reader
	evDone chan struct{}
	// pinned: the maps pinned under the pin path, by name; drift: the
	// drift poll (drift.go).
	pinned map[string]*ebpf.Map
	drift  driftPoller
	// watchStop ends the link watch that keeps xlb_peer_tx current;
	// watchDone is closed when its goroutine ends.
	watchStop, watchDone chan struct{}
	// sock and sockLinks: the socket programs and their cgroup links,
	// when Options.SocketCgroup is set.
	sock      *sockObjects
	sockLinks []link.Link
	// tbls: named tables and policies as applied (tables.go).
	tbls tableState
	// srcs: farms chosen by source table (sourcetable.go).
	srcs sourceState
	// syncWatch: WatchConns runs; syncInMu: one InstallConns at a time
	// (xlb_sync_in is one buffer). connsync.go.
	syncWatch atomic.Bool
	syncInMu  sync.Mutex
	// InstallConns's batch for xlb_sync_in, kept for the next (syncInMu).
	syncInVals []xlbSyncConn
}

var _ dataplane.Dataplane = (*Plane)(nil)

// New loads the program and its maps (adopting pinned ones), and attaches
// the program to the interfaces (replacing the program of pinned links in
// place). Call Reconcile next to load the farms.
func New(ctx context.Context, log *slog.Logger, opts Options) (*Plane, error) {
	if opts.PinPath == "" {
		opts.PinPath = DefaultPinPath
	}
	if opts.ConnTableSize <= 0 {
		opts.ConnTableSize = DefaultConnTableSize
	}
	if opts.XDP == "" {
		opts.XDP = XDPOff
	}
	if _, err := ParseXDPMode(string(opts.XDP)); err != nil {
		return nil, err
	}
	p := &Plane{log: log, opts: opts, ns: -1, links: map[string]link.Link{}, xdpLinks: map[string]link.Link{}, farms: map[string]*generation{}, svcIdx: svcIndex{},
		stlOwner: map[xlbStlKey]string{}, bySvc: map[uint32]*generation{}, carry: map[string]dataplane.Counters{}, statSlot: map[uint32]uint32{},
		watched: map[uint32]*watch{}}
	p.statSlots.init()
	p.tbls.reset()
	p.srcs.reset()
	p.svcIDs.init()
	p.backendIDs.init()
	p.farmIDs.initFarmIDs()
	if opts.NetNS > 0 {
		p.ns = opts.NetNS
	}
	mounted, err := ensureBPFFS(opts.PinPath)
	if err != nil {
		return nil, err
	}
	if mounted {
		// Under `ip netns exec` this mount, and every pin on it, lives
		// only as long as this process's mount namespace.
		log.Warn("mounted bpffs at /sys/fs/bpf: pins (and the attached program) last as long as this mount; "+
			"run in the host's mount namespace or pass a pin path on a lasting bpffs", "pin_path", opts.PinPath)
	}
	if p.ns >= 0 {
		p.nl, err = netlink.NewHandleAt(p.ns)
	} else {
		p.nl, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	if err := p.load(); err != nil {
		p.nl.Close()
		return nil, err
	}
	if err := p.calibrateClock(); err != nil {
		log.Warn("conntrack clock not calibrated; using the coarse-clock helper (about 20 ns more per packet)", "err", err)
	}
	if err := p.attach(); err != nil {
		p.closeLinks()
		p.objs.Close()
		p.nl.Close()
		return nil, err
	}
	if err := p.attachSockets(); err != nil {
		p.closeSockets()
		p.closeLinks()
		p.objs.Close()
		p.nl.Close()
		return nil, err
	}
	if err := p.startEvents(); err != nil {
		p.closeSockets()
		p.closeLinks()
		p.objs.Close()
		p.nl.Close()
		return nil, err
	}
	if err := p.startPeerTxWatch(); err != nil {
		p.stopEvents()
		p.closeSockets()
		p.closeLinks()
		p.objs.Close()
		p.nl.Close()
		return nil, err
	}
	return p, nil
}

// Name is "ebpf".
func (p *Plane) Name() string { return Name }

// load loads the collection, adopting pinned maps whose definition still
// matches and replacing (with a warning) those that do not.
func (p *Plane) load() error {
	spec, err := loadXlb()
	if err != nil {
		return fmt.Errorf("load ebpf spec: %w", err)
	}
	spec.Maps[xlbMapXlbCt].MaxEntries = uint32(p.opts.ConnTableSize)
	p.tbls.inner4 = spec.Maps[xlbMapXlbTblAddr4].InnerMap.Copy()
	p.tbls.inner6 = spec.Maps[xlbMapXlbTblAddr6].InnerMap.Copy()
	p.tbls.innerH = spec.Maps[xlbMapXlbTblHash].InnerMap.Copy()
	to := p.opts.Timeouts.withDefaults()
	for name, d := range map[string]time.Duration{
		xlbVarXlbTimeoutTcp: to.TCP, xlbVarXlbTimeoutFin: to.TCPFin, xlbVarXlbTimeoutUdp: to.UDP,
		xlbVarXlbTimeoutSyn: to.SYN, xlbVarXlbTimeoutClose: to.Close,
	} {
		if err := spec.Variables[name].Set(uint64(d.Nanoseconds())); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	if err := spec.Variables[xlbVarXlbSyncRefreshNs].Set(uint64(syncRefresh(to).Nanoseconds())); err != nil {
		return fmt.Errorf("set %s: %w", xlbVarXlbSyncRefreshNs, err)
	}
	if r := p.opts.SNATPorts; r.First != 0 {
		for name, v := range map[string]uint32{xlbVarXlbSnatPortMin: uint32(r.First), xlbVarXlbSnatPortMax: uint32(r.Last)} {
			if err := spec.Variables[name].Set(v); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
		}
	}
	if p.opts.XDP == XDPGeneric {
		if err := spec.Variables[xlbVarXlbXdpAnyTx].Set(uint32(1)); err != nil {
			return fmt.Errorf("set %s: %w", xlbVarXlbXdpAnyTx, err)
		}
	}
	if p.opts.ctRefresh > 0 {
		if err := spec.Variables[xlbVarXlbCtRefreshNs].Set(uint64(p.opts.ctRefresh.Nanoseconds())); err != nil {
			return fmt.Errorf("set %s: %w", xlbVarXlbCtRefreshNs, err)
		}
	}
	var pinned []string
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName { // not .rodata: the program's constants, loaded anew each time
			pinned = append(pinned, name)
		}
	}
	grown, err := p.setAsideGrown(spec) // pinmigrate.go
	if err != nil {
		return err
	}
	if err := p.replaceStalePins(spec, pinned); err != nil {
		return err
	}
	staleTables, err := p.setAsideStaleTables(spec) // pinmigrate.go
	if err != nil {
		return err
	}
	err = spec.LoadAndAssign(&p.objs, &ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: p.opts.PinPath},
	})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load ebpf program: %+v", ve)
		}
		return fmt.Errorf("load ebpf objects: %w", err)
	}
	p.pinned = pinnedMaps(spec, &p.objs.xlbMaps)
	p.migrateGrown(grown)
	p.carryTables(spec, staleTables)
	return nil
}

func linkPin(pinPath, ifname string) string {
	return filepath.Join(pinPath, "link_ingress_"+ifname)
}

// attach attaches the program at tcx ingress of each interface. A pinned
// link of an earlier run gets the new program atomically (bpf_link_update),
// so no packet goes unbalanced during a restart. Pinned links of interfaces
// no longer wanted are removed (which detaches them).
func (p *Plane) attach() error {
	ifaces, err := p.interfaces()
	if err != nil {
		return err
	}
	links, err := p.nl.LinkList()
	if err != nil {
		return fmt.Errorf("list interfaces: %w", err)
	}
	if err := p.writeHostMACs(links); err != nil {
		return err
	}
	want := map[string]bool{}
	for name, idx := range ifaces {
		want[name] = true
		if err := p.attachTCX(name, idx); err != nil {
			return err
		}
	}
	if err := p.attachXDP(ifaces); err != nil {
		return err
	}
	if err := p.writePeerTx(); err != nil {
		return err
	}
	entries, err := os.ReadDir(p.opts.PinPath)
	if err != nil {
		return fmt.Errorf("read pin path: %w", err)
	}
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), "link_ingress_")
		if !ok || want[name] {
			continue
		}
		p.detachTCX(name)
		p.log.Info("detached from interface no longer configured", "interface", name)
	}
	return nil
}

// attachTCX attaches the program at tcx ingress of interface name (index
// idx), or gives its pinned link of an earlier run the program.
func (p *Plane) attachTCX(name string, idx int) error {
	path := linkPin(p.opts.PinPath, name)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		info, ierr := l.Info()
		if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == idx {
			if err := l.Update(p.objs.XlbIngress); err != nil {
				l.Close()
				return fmt.Errorf("update program of %s: %w", name, err)
			}
			p.links[name] = l
			return nil
		}
		// Stale: the interface was recreated since.
		_ = l.Unpin()
		l.Close()
	}
	var l link.Link
	err := p.inNS(func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{
			Interface: idx,
			Program:   p.objs.XlbIngress,
			Attach:    ebpf.AttachTCXIngress,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("attach tcx ingress to %q: %w", name, err)
	}
	if err := l.Pin(path); err != nil {
		l.Close()
		return fmt.Errorf("pin link of %q: %w", name, err)
	}
	p.links[name] = l
	return nil
}

// detachTCX removes the link of interface name, pinned or held (which
// detaches the program if the interface still exists).
func (p *Plane) detachTCX(name string) {
	if l := p.links[name]; l != nil {
		_ = l.Unpin()
		l.Close()
		delete(p.links, name)
	}
	path := linkPin(p.opts.PinPath, name)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		_ = l.Unpin()
		l.Close()
	} else {
		_ = os.Remove(path)
	}
}

// interfaces returns name -> ifindex of the interfaces to attach to now
// (see selects). A plain name in Options.Interfaces must exist; a pattern
// may match nothing yet.
func (p *Plane) interfaces() (map[string]int, error) {
	for _, n := range p.opts.Interfaces {
		if isPattern(n) {
			continue
		}
		if _, err := p.nl.LinkByName(n); err != nil {
			return nil, fmt.Errorf("find interface %q: %w", n, err)
		}
	}
	links, err := p.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	out := map[string]int{}
	for _, l := range links {
		if a := l.Attrs(); p.selects(a) {
			out[a.Name] = a.Index
		}
	}
	return out, nil
}

// inNS runs fn inside the plane's network namespace (attaching by ifindex
// resolves the index in the caller's namespace).
func (p *Plane) inNS(fn func() error) error { return nsenter.Run(p.ns, fn) }

// ensureBPFFS makes sure dir exists on a bpf file system, mounting bpffs at
// /sys/fs/bpf when dir is below it and nothing is mounted there (as after
// `ip netns exec`, which remounts /sys).
func ensureBPFFS(dir string) (mounted bool, err error) {
	dir = filepath.Clean(dir)
	if strings.HasPrefix(dir+"/", "/sys/fs/bpf/") && !isBPFFS("/sys/fs/bpf") {
		if err := os.MkdirAll("/sys/fs/bpf", 0o700); err != nil {
			return false, fmt.Errorf("create /sys/fs/bpf: %w", err)
		}
		if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
			return false, fmt.Errorf("mount bpffs at /sys/fs/bpf: %w", err)
		}
		mounted = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return mounted, fmt.Errorf("create pin path: %w", err)
	}
	if !isBPFFS(dir) {
		return mounted, fmt.Errorf("pin path %q is not on a bpf file system", dir)
	}
	return mounted, nil
}

func isBPFFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

func (p *Plane) closeLinks() {
	for n, l := range p.links {
		l.Close()
		delete(p.links, n)
	}
	for n, l := range p.xdpLinks {
		l.Close()
		delete(p.xdpLinks, n)
	}
}

// Close releases the plane's file descriptors. Links and maps stay pinned:
// the program keeps balancing, and tracked connections keep flowing, until
// a new Plane adopts them (or Destroy removes them).
func (p *Plane) Close() error {
	p.stopPeerTxWatch()
	p.stopEvents()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLinks()
	for _, s := range p.tbls.slots {
		s.close() // the outer maps keep the tries bound to a table
	}
	for _, s := range p.tbls.hslots {
		s.m.Close() // likewise the hashes
	}
	p.tbls.reset()
	err := errors.Join(p.closeSockets(), p.objs.Close())
	p.nl.Close()
	return err
}

// Destroy detaches the program and removes every pin (links and maps), then
// closes the plane. Use it to uninstall; a restart uses Close.
func (p *Plane) Destroy() error {
	p.mu.Lock()
	var errs []error
	for _, l := range p.links {
		if err := l.Unpin(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range p.xdpLinks {
		if err := l.Unpin(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range p.sockLinks {
		if err := l.Unpin(); err != nil {
			errs = append(errs, err)
		}
	}
	p.detachSockets() // and their maps' pins
	// Every map the program pins (p.pinned, from the collection spec), so
	// a map added to bpf/ is never left behind (a hand-kept list here
	// once forgot the passive checks' maps).
	for name, m := range p.pinned {
		if err := m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin map %s: %w", name, err))
		}
	}
	p.mu.Unlock()
	errs = append(errs, p.Close())
	return errors.Join(errs...)
}

// Stats returns the program's counters summed over CPUs, by name.
func (p *Plane) Stats() (map[string]uint64, error) {
	out := map[string]uint64{}
	for i, name := range statNames {
		var per []uint64
		if err := p.objs.XlbStats.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("read counter %s: %w", name, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}
