package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// The drift watch: nftables' netlink events (what `nft monitor` shows)
// for xlb's tables, from anything but xlb's own sockets (owned.go).
//
// It reads the events itself rather than through google/nftables'
// Monitor, which decodes every rule's expressions (a cost on each of
// xlb's own bulk changes, and an error for expressions it does not know),
// gives a set element's event without the table it is in (so an element
// deleted from xlb's maps could not be told from one of firewalld's), and
// stops at the first receive error. Here each message is read only as far
// as its table: every nftables object message carries its table's name
// as attribute 1.
//
// DriftSeen's barrier: the kernel numbers its transactions (the ruleset
// generation, what NEWGEN announces and GETGEN reads). Once the watch has
// read the NEWGEN of the generation GETGEN answers, it has read every
// event of every transaction committed before.

var _ dataplane.DriftWatcher = (*Plane)(nil)

// driftWait bounds DriftSeen's wait for the watch to catch up.
const driftWait = 2 * time.Second

// watchBuf is the watch socket's receive buffer: a bulk change of xlb's
// own sends an event per element (16,000 farms: about 200,000 events).
// If it overflows anyway, the events lost count as a drift.
const watchBuf = 128 << 20

type driftWatch struct {
	seen atomic.Uint64 // changes by others to xlb's tables, and losses

	mu      sync.Mutex
	running bool
	// dirty: the tables others changed since a reconcile looked at them
	// (RepairDrift); all: events were lost, any may have changed.
	dirty    map[string]bool
	dirtyAll bool
	gen      uint32        // the last generation read
	moved    chan struct{} // closed when gen moves or the watch stops
	query    *netlink.Conn // GETGEN
}

// WatchDrift implements dataplane.DriftWatcher for xlb's tables of any
// --nft-tables layout (inet and netdev) and its named tables' table.
func (s *Plane) WatchDrift(ctx context.Context, drifted func(what string)) error {
	w := &s.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		return errors.New("nft drift watch: already running")
	}
	mon, err := dialEvents(s.opts.NetNS)
	if err != nil {
		return err
	}
	q, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFd(s.opts.NetNS)})
	if err != nil {
		mon.Close()
		return fmt.Errorf("nft drift watch: connect: %w", err)
	}
	// The generation read after joining the group: every later one
	// comes as an event.
	gen, err := getGen(q)
	if err != nil {
		mon.Close()
		q.Close()
		return err
	}
	w.running, w.gen, w.query, w.moved = true, gen, q, make(chan struct{})
	go func() {
		<-ctx.Done()
		mon.Close()
	}()
	go s.watchLoop(ctx, mon, drifted)
	return nil
}

// nsFd is the namespace fd netlink.Config takes (0: the current one).
func nsFd(ns netns.NsHandle) int {
	if ns.IsOpen() {
		return int(ns)
	}
	return 0
}

// dialEvents opens a socket that receives nftables' events.
func dialEvents(ns netns.NsHandle) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFd(ns)})
	if err != nil {
		return nil, fmt.Errorf("nft drift watch: connect: %w", err)
	}
	rc, err := c.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchBuf) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, watchBuf)
			}
		})
	}
	if err == nil {
		err = c.JoinGroup(unix.NFNLGRP_NFTABLES)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("nft drift watch: join the nftables event group: %w", err)
	}
	return c, nil
}

func (s *Plane) watchLoop(ctx context.Context, mon *netlink.Conn, drifted func(string)) {
	w := &s.watch
	defer func() {
		w.mu.Lock()
		w.running = false
		w.query.Close()
		close(w.moved)
		w.mu.Unlock()
	}()
	// What the transaction being read did to xlb's tables.
	var pending changeSummary
	for {
		msgs, err := mon.Receive()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// ENOBUFS: events were dropped; which is not known, so it
			// counts as a drift. The socket still works.
			pending.reset()
			w.markDirty(nil, true)
			w.seen.Add(1)
			drifted(fmt.Sprintf("nftables events lost (%v)", err))
			if !errors.Is(err, unix.ENOBUFS) {
				// Anything else: back off, or spin on a broken socket.
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
			// The lost events may include NEWGENs: catch up.
			if gen, gerr := w.getGen(); gerr == nil {
				w.advance(gen)
			}
			continue
		}
		for _, m := range msgs {
			if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
				continue
			}
			typ := int(m.Header.Type & 0xff)
			if typ == unix.NFT_MSG_NEWGEN {
				gen, comm, pid := genInfo(m.Data[4:])
				if pending.n > 0 && !ownPort(m.Header.PID) {
					w.markDirty(pending.touched, false)
					w.seen.Add(1)
					drifted(fmt.Sprintf("%s, by %s (pid %d)", pending.String(), comm, pid))
				}
				pending.reset()
				w.advance(gen)
				continue
			}
			if what, table, ok := s.ours(typ, m.Data[0], m.Data[4:]); ok {
				pending.add(what, table)
			}
		}
	}
}

// changeSummary sums up the changes of one transaction: tables added or
// deleted, then the first few other kinds of change, each with its count
// ("delete rule inet xlb-00 prerouting (6)").
type changeSummary struct {
	kinds   []string
	count   map[string]int
	n       int
	tables  int             // kinds that add or delete a table
	touched map[string]bool // the tables changed
}

const (
	summaryKinds  = 4
	summaryTables = 6
)

func (c *changeSummary) add(what, table string) {
	c.n++
	if c.count == nil {
		c.count, c.touched = map[string]int{}, map[string]bool{}
	}
	c.touched[table] = true
	isTable := strings.Contains(what, " table ")
	if _, ok := c.count[what]; !ok && len(c.kinds) >= summaryKinds && (!isTable || c.tables >= summaryTables) {
		return
	}
	if isTable && c.count[what] == 0 {
		c.tables++
	}
	if c.count[what] == 0 {
		c.kinds = append(c.kinds, what)
	}
	c.count[what]++
}

func (c *changeSummary) reset() {
	c.kinds, c.n, c.tables = c.kinds[:0], 0, 0
	clear(c.count)
	clear(c.touched)
}

func (c *changeSummary) String() string {
	var b strings.Builder
	shown := 0
	kinds := slices.Clone(c.kinds)
	slices.SortStableFunc(kinds, func(a, b string) int {
		ta, tb := strings.Contains(a, " table "), strings.Contains(b, " table ")
		switch {
		case ta && !tb:
			return -1
		case tb && !ta:
			return 1
		}
		return 0
	})
	for i, k := range kinds {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(k)
		if n := c.count[k]; n > 1 {
			fmt.Fprintf(&b, " (%d)", n)
		}
		shown += c.count[k]
	}
	if rest := c.n - shown; rest > 0 {
		fmt.Fprintf(&b, "; %d more changes", rest)
	}
	return b.String()
}

// markDirty records tables others changed (all: which is not known).
func (w *driftWatch) markDirty(tables map[string]bool, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dirty == nil {
		w.dirty = map[string]bool{}
	}
	for t := range tables {
		w.dirty[t] = true
	}
	w.dirtyAll = w.dirtyAll || all
}

// takeDirty returns and forgets the tables others changed; all: any may
// have, or the watch does not run (so it cannot tell).
func (w *driftWatch) takeDirty() (tables map[string]bool, all bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tables, all = w.dirty, w.dirtyAll || !w.running
	w.dirty, w.dirtyAll = nil, false
	return tables, all
}

// advance records that generation gen was read.
func (w *driftWatch) advance(gen uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if int32(gen-w.gen) > 0 {
		w.gen = gen
		close(w.moved)
		w.moved = make(chan struct{})
	}
}

// DriftSeen implements dataplane.DriftWatcher.
func (s *Plane) DriftSeen(ctx context.Context) (uint64, error) {
	w := &s.watch
	want, err := w.getGen()
	if err != nil {
		return 0, err
	}
	timeout := time.NewTimer(driftWait)
	defer timeout.Stop()
	for {
		w.mu.Lock()
		running, reached, moved := w.running, int32(w.gen-want) >= 0, w.moved
		w.mu.Unlock()
		if !running {
			return 0, errors.New("nft drift watch: not running")
		}
		if reached {
			return w.seen.Load(), nil
		}
		select {
		case <-moved:
		case <-timeout.C:
			return 0, fmt.Errorf("nft drift watch: generation %d not read within %s", want, driftWait)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// getGen reads the ruleset's generation on the watch's query socket.
func (w *driftWatch) getGen() (uint32, error) {
	w.mu.Lock()
	q, running := w.query, w.running
	w.mu.Unlock()
	if !running {
		return 0, errors.New("nft drift watch: not running")
	}
	return getGen(q)
}

// getGen asks the kernel for the ruleset's generation (NFT_MSG_GETGEN).
func getGen(c *netlink.Conn) (uint32, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("read the nftables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) >= 4 {
			if gen, _, _ := genInfo(m.Data[4:]); gen != 0 {
				return gen, nil
			}
		}
	}
	return 0, errors.New("read the nftables generation: no answer")
}

// genInfo decodes a NEWGEN message's attributes.
func genInfo(b []byte) (gen uint32, comm string, pid uint32) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return 0, "", 0
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_GEN_ID:
			gen = ad.Uint32()
		case unix.NFTA_GEN_PROC_PID:
			pid = ad.Uint32()
		case unix.NFTA_GEN_PROC_NAME:
			comm = ad.String()
		}
	}
	return gen, comm, pid
}

// eventNames are the object events that change a ruleset, by message
// type: what the event did.
var eventNames = map[int]string{
	unix.NFT_MSG_NEWTABLE: "add table", unix.NFT_MSG_DELTABLE: "delete table",
	unix.NFT_MSG_NEWCHAIN: "add chain", unix.NFT_MSG_DELCHAIN: "delete chain",
	unix.NFT_MSG_NEWRULE: "add rule", unix.NFT_MSG_DELRULE: "delete rule",
	unix.NFT_MSG_NEWSET: "add set", unix.NFT_MSG_DELSET: "delete set",
	unix.NFT_MSG_NEWSETELEM: "add element", unix.NFT_MSG_DELSETELEM: "delete element",
	unix.NFT_MSG_NEWOBJ: "add object", unix.NFT_MSG_DELOBJ: "delete object",
	unix.NFT_MSG_NEWFLOWTABLE: "add flowtable", unix.NFT_MSG_DELFLOWTABLE: "delete flowtable",
}

// ours reports whether an object event is about one of xlb's tables, and
// describes it ("delete rule in inet xlb-03 chain prerouting"). Every
// object message carries its table's name as attribute 1, and its own
// name (a chain's as attribute 3, a rule's chain as 2, a set's or an
// element's set as 2, an object's as 2).
func (s *Plane) ours(typ int, family byte, attrs []byte) (what, table string, ok bool) {
	verb, ok := eventNames[typ]
	if !ok {
		return "", "", false
	}
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return "", "", false
	}
	var name string
	nameAttr := uint16(2)
	if typ == unix.NFT_MSG_NEWCHAIN || typ == unix.NFT_MSG_DELCHAIN {
		nameAttr = 3
	}
	for ad.Next() {
		switch ad.Type() {
		case 1:
			table = ad.String()
		case nameAttr:
			if typ != unix.NFT_MSG_NEWTABLE && typ != unix.NFT_MSG_DELTABLE {
				name = ad.String()
			}
		}
	}
	fam := ""
	switch family {
	case unix.NFPROTO_INET:
		fam = "inet"
	case unix.NFPROTO_NETDEV:
		fam = "netdev"
	default:
		return "", "", false
	}
	if !s.ownsTable(fam, table) {
		return "", "", false
	}
	what = fmt.Sprintf("%s %s %s", verb, fam, table)
	if name != "" {
		what += " " + name
	}
	return what, table, true
}

// ownsTable reports whether the table of that family and name is xlb's:
// a farms' table of any --nft-tables layout (inet, or its netdev twin),
// the named tables' table, or the counter table.
func (s *Plane) ownsTable(family, name string) bool {
	if isLayoutTable(s.opts.Table, name) {
		return true
	}
	return family == "inet" && (name == s.opts.Table+tablesSuffix || name == s.opts.Table+countersSuffix)
}
