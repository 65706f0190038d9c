package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// Connection sync (dataplane.ConnSyncer, internal/cluster/connsync) over
// the program's own conntrack (bpf/xlb_sync.h): the program writes a
// record per new, changed and ended flow of a snat or dnat farm to the
// xlb_sync ring buffer while WatchConns reads it; DumpConns walks xlb_ct;
// InstallConns hands a peer's batch to xlb_ct_install, which writes both
// entries of each flow in the kernel (one system call per batch).
// Persistence sessions (xlb_persist) go the same way (dataplane.ConnSession:
// a record per session made, moved or refreshed; DumpSessions for a
// resync), so a persistent client the routers move keeps its backend.

var (
	_ dataplane.ConnSyncer    = (*Plane)(nil)
	_ dataplane.SessionSyncer = (*Plane)(nil)
)

// Batching of events: at most syncBatchMax, or syncBatchWait (the nft
// plane's, internal/conntrack). A reader that found no record in a wait
// sleeps until a record wakes it (xlb_sync_wake), or syncIdleWait.
const (
	syncBatchMax  = 256
	syncBatchWait = 10 * time.Millisecond
	syncIdleWait  = time.Second
)

// syncBatch is how many connections one run of xlb_ct_install takes.
const syncBatch = int(xlbXlbSizeXLB_SIZE_SYNC_BATCH)

// Kinds of sync records (enum xlb_sync_kind), and what xlb_ct_install did
// (enum xlb_sync_rc).
const (
	syncNew     = uint8(xlbXlbSyncKindXLB_SYNC_NEW)
	syncUpdate  = uint8(xlbXlbSyncKindXLB_SYNC_UPDATE)
	syncEnd     = uint8(xlbXlbSyncKindXLB_SYNC_END)
	syncSession = uint8(xlbXlbSyncKindXLB_SYNC_SESSION)

	syncOK      = int32(xlbXlbSyncRcXLB_SYNC_RC_OK)
	syncUnbound = int32(xlbXlbSyncRcXLB_SYNC_RC_UNBOUND)
	syncGone    = int32(xlbXlbSyncRcXLB_SYNC_RC_GONE)
)

// syncRCNames say why xlb_ct_install did not install a connection.
var syncRCNames = map[int32]string{
	int32(xlbXlbSyncRcXLB_SYNC_RC_MODE):      "the farm here is dsr or stlsdnat",
	int32(xlbXlbSyncRcXLB_SYNC_RC_CONFLICT):  "its tuple or its reply tuple is another connection's here",
	int32(xlbXlbSyncRcXLB_SYNC_RC_ERROR):     "conntrack table update failed",
	int32(xlbXlbSyncRcXLB_SYNC_RC_BAD):       "malformed",
	int32(xlbXlbSyncRcXLB_SYNC_RC_NOPERSIST): "no farm here keeps persistence sessions for its service",
}

// syncRefresh is how often a live flow tells the peers it is alive
// (xlb_sync_refresh_ns): a third of the shorter of the established-TCP
// and UDP timeouts, so a peer's copy never idles out while the flow is
// carried here; between 1 s (the program's refresh) and 60 s.
func syncRefresh(to Timeouts) time.Duration {
	d := min(to.TCP, to.UDP) / 3
	return min(max(d, time.Second), time.Minute)
}

// The kernel's TCP conntrack states (enum tcp_conntrack), which the sync
// wire carries (dataplane.SyncConn.TCPState), for both planes.
const (
	kernTCPSynSent     = 1
	kernTCPEstablished = 3
	kernTCPFinWait     = 4
	kernTCPTimeWait    = 7
	kernTCPClose       = 8
)

// kernelTCPState maps a flow state of the program to the kernel's.
func kernelTCPState(s uint8) uint8 {
	switch s {
	case ctStateEST:
		return kernTCPEstablished
	case ctStateFIN:
		return kernTCPFinWait
	case ctStateClose:
		return kernTCPClose
	}
	return kernTCPSynSent
}

// flowTCPState maps the kernel's TCP state to the program's.
func flowTCPState(s uint8) uint8 {
	switch {
	case s == kernTCPEstablished:
		return ctStateEST
	case s >= kernTCPFinWait && s <= kernTCPTimeWait:
		return ctStateFIN
	case s == kernTCPClose:
		return ctStateClose
	}
	return ctStateSYN
}

// syncConn converts a record of the program to the wire's connection;
// left is the time the flow has before it idles out.
func syncConn(c *xlbSyncConn, left time.Duration) dataplane.SyncConn {
	f := c.Family
	sc := dataplane.SyncConn{
		Proto:   c.Proto,
		Client:  netip.AddrPortFrom(wordsAddr(c.Client, f), be16(c.Cport)),
		VIP:     netip.AddrPortFrom(wordsAddr(c.Vip, f), be16(c.Vport)),
		Backend: netip.AddrPortFrom(wordsAddr(c.Backend, f), be16(c.Bport)),
		Reply:   netip.AddrPortFrom(wordsAddr(c.Reply, f), be16(c.Rport)),
		Timeout: uint32((left + time.Second - 1) / time.Second),
	}
	if c.Proto == unix.IPPROTO_TCP {
		sc.TCPState = kernelTCPState(c.State)
	}
	return sc
}

// sessionConn converts a session record of the program (or an entry of
// xlb_persist in the same shape) to the wire's; left is the time it has
// before it expires.
func sessionConn(c *xlbSyncConn, left time.Duration) dataplane.SyncConn {
	f := c.Family
	return dataplane.SyncConn{
		Proto:   c.Proto,
		Client:  netip.AddrPortFrom(wordsAddr(c.Client, f), be16(c.Cport)),
		VIP:     netip.AddrPortFrom(wordsAddr(c.Vip, f), be16(c.Vport)),
		Backend: netip.AddrPortFrom(wordsAddr(c.Backend, f), be16(c.Bport)),
		Reply:   netip.AddrPortFrom(wordsAddr(c.Reply, f), 0),
		Timeout: uint32((left + time.Second - 1) / time.Second),
	}
}

// WatchConns implements dataplane.ConnSyncer: it turns the program's
// records on (xlb_sync_on), reads them every syncBatchWait (the program
// does not wake the reader) in batches of up to syncBatchMax, and turns
// them off when ctx ends. A wait that brought no record arms the
// program's wake-up (xlb_sync_wake) and the reader sleeps until a record
// comes (then reads every syncBatchWait again) or syncIdleWait: an idle
// node does not wake a hundred times a second. Records lost to a full
// ring buffer end it with an error (the caller resyncs its peers whole).
// One watcher at a time.
func (p *Plane) WatchConns(ctx context.Context, fn func([]dataplane.ConnEvent)) error {
	if !p.syncWatch.CompareAndSwap(false, true) {
		return errors.New("connection events: already watched")
	}
	defer p.syncWatch.Store(false)
	rd, err := ringbuf.NewReader(p.objs.XlbSync)
	if err != nil {
		return fmt.Errorf("connection events: open ring buffer: %w", err)
	}
	defer rd.Close()
	// The reader may sleep up to syncIdleWait: ctx's end wakes it.
	defer context.AfterFunc(ctx, func() { rd.Flush() })()
	var lost0 uint64
	if err := p.objs.XlbSyncLost.Get(&lost0); err != nil {
		return fmt.Errorf("connection events: read lost count: %w", err)
	}
	if err := p.objs.XlbSyncOn.Set(uint32(1)); err != nil {
		return fmt.Errorf("connection events: turn on: %w", err)
	}
	defer p.objs.XlbSyncOn.Set(uint32(0))
	defer p.objs.XlbSyncWake.Set(uint32(0))
	to := p.opts.Timeouts.withDefaults()
	idleWait := syncIdleWait
	if p.opts.syncIdleWait > 0 {
		idleWait = p.opts.syncIdleWait
	}
	var (
		// One batch for the watcher's life: fn keeps none (the
		// interface says so). A new one each flush was 36 KiB of
		// garbage every 10 ms: 1.4 % of the samples of
		// BenchmarkSyncPerPacket at K=100, of about 10 % that sync took.
		batch  = make([]dataplane.ConnEvent, 0, syncBatchMax)
		rec    ringbuf.Record
		got    int  // records since the last wait ended
		waking bool // xlb_sync_wake is set
	)
	flush := func() {
		if len(batch) > 0 {
			fn(batch)
			batch = batch[:0]
		}
	}
	deadline := time.Now().Add(syncBatchWait)
	for {
		rd.SetDeadline(deadline)
		err := rd.ReadInto(&rec)
		switch {
		case err == nil:
			if len(rec.RawSample) < int(unsafe.Sizeof(xlbSyncConn{})) {
				continue
			}
			c := (*xlbSyncConn)(unsafe.Pointer(&rec.RawSample[0]))
			got++
			if waking {
				// Woken by this record: back to reading every
				// syncBatchWait, without wake-ups.
				waking = false
				if err := p.objs.XlbSyncWake.Set(uint32(0)); err != nil {
					return fmt.Errorf("connection events: disarm wake-up: %w", err)
				}
				deadline = time.Now().Add(syncBatchWait)
			}
			ev := dataplane.ConnEvent{Kind: dataplane.ConnEventKind(c.Kind)}
			if c.Kind == syncSession {
				ev.Conn = sessionConn(c, time.Duration(c.Left)*time.Second)
			} else {
				ev.Conn = syncConn(c, to.timeout(c.State))
			}
			batch = append(batch, ev)
			if len(batch) >= syncBatchMax {
				flush()
			}
		case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrFlushed):
			flush()
			if ctx.Err() != nil {
				return nil
			}
			var lost uint64
			if err := p.objs.XlbSyncLost.Get(&lost); err == nil && lost != lost0 {
				return fmt.Errorf("connection events: %d lost (ring buffer full)", lost-lost0)
			}
			switch {
			case got > 0:
				deadline = time.Now().Add(syncBatchWait)
			case !waking:
				// Nothing came: arm the wake-up and look once more,
				// for a record written as it was armed (it woke no one).
				if err := p.objs.XlbSyncWake.Set(uint32(1)); err != nil {
					return fmt.Errorf("connection events: arm wake-up: %w", err)
				}
				waking = true
				deadline = time.Now()
			default:
				deadline = time.Now().Add(idleWait)
			}
			got = 0
			if !waking {
				// Wait for the next batch in a Go timer, then take
				// what is there without blocking: a thread held in
				// epoll_wait for the batch's 10 ms kept the runtime's
				// sysmon waking every 20 µs (it takes the P back each
				// time), about 8 % of a core under load.
				time.Sleep(time.Until(deadline))
			}
		default:
			flush()
			return fmt.Errorf("connection events: read ring buffer: %w", err)
		}
	}
}

// DumpConns implements dataplane.ConnSyncer: every flow of a snat or dnat
// farm, from its forward entry, with the time it has left.
func (p *Plane) DumpConns(ctx context.Context) ([]dataplane.SyncConn, error) {
	now, to := monotonicCoarse(), p.opts.Timeouts.withDefaults()
	var out []dataplane.SyncConn
	err := p.walkCT(ctx, func(k *xlbCtKey, v *xlbCtVal) {
		if v.Dir != ctFwd || (v.Mode != modeSNAT && v.Mode != modeDNAT) {
			return
		}
		t := to.timeout(v.State)
		var left time.Duration
		if end := v.Seen + uint64(t); end > now {
			left = min(time.Duration(end-now), t)
		}
		if left <= 0 {
			return // idle past its timeout: the program removes it at its next packet
		}
		c := xlbSyncConn{Client: k.Src, Vip: k.Dst, Backend: v.Dst, Reply: v.Src,
			Cport: k.Sport, Vport: k.Dport, Bport: v.Dport, Rport: v.Sport,
			Proto: k.Proto, Family: k.Family, State: v.State}
		out = append(out, syncConn(&c, left))
	})
	return out, err
}

// DumpSessions implements dataplane.SessionSyncer: every persistence
// session of xlb_persist still within its service's TTL, with the time it
// has left (sessions of a service no longer here are left out).
func (p *Plane) DumpSessions(ctx context.Context) ([]dataplane.SyncConn, error) {
	now := monotonicCoarse()
	ttls := map[xlbSvcKey]uint64{}
	var out []dataplane.SyncConn
	var (
		k      xlbPersistKey
		v      xlbPersistVal
		cursor = p.objs.XlbPersist.Iterate()
	)
	for cursor.Next(&k, &v) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ttl, ok := ttls[k.Svc]
		if !ok {
			var sv xlbSvcVal
			if err := p.objs.XlbServices.Lookup(&k.Svc, &sv); err == nil && sv.Persist != 0 {
				ttl = uint64(sv.PersistTtl) * uint64(time.Second)
			}
			ttls[k.Svc] = ttl
		}
		end := v.Seen + ttl
		if ttl == 0 || end <= now {
			continue
		}
		// The key's tag (a farm chosen by source table) is this node's:
		// the peer steers the client again (sync_steer()).
		c := xlbSyncConn{Client: k.Src, Vip: k.Svc.Addr, Backend: v.Addr,
			Cport: k.Sport, Vport: k.Svc.Port, Bport: v.Port, Proto: k.Svc.Proto, Family: k.Svc.Family & (1<<svcTagShift - 1)}
		out = append(out, sessionConn(&c, time.Duration(min(end-now, ttl))))
	}
	if err := cursor.Err(); err != nil {
		return nil, fmt.Errorf("dump persistence sessions: %w", err)
	}
	return out, nil
}

// InstallConns implements dataplane.ConnSyncer: each batch of up to
// syncBatch connections is written into xlb_sync_in through its memory
// mapping (no system call, no copy per element in the kernel) and
// installed by xlb_ct_install (one system call); only when some were not is
// each one's result read back.
func (p *Plane) InstallConns(ctx context.Context, evs []dataplane.ConnEvent) (int, error) {
	p.syncInMu.Lock()
	defer p.syncInMu.Unlock()
	mem, err := p.objs.XlbSyncIn.Memory()
	if err != nil {
		return 0, fmt.Errorf("install connections: map xlb_sync_in: %w", err)
	}
	// The batch's room is kept between calls (under syncInMu).
	vals := p.syncInVals
	defer func() { p.syncInVals = vals }()
	n := 0
	var first error
	for i := 0; i < len(evs); i += syncBatch {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		chunk := evs[i:min(i+syncBatch, len(evs))]
		vals = vals[:0]
		for _, ev := range chunk {
			vals = append(vals, syncIn(ev))
		}
		if _, err := mem.WriteAt(syncConnBytes(vals), 0); err != nil {
			return n, fmt.Errorf("install connections: write xlb_sync_in: %w", err)
		}
		args, err := binary.Append(nil, binary.NativeEndian, xlbSyncArgs{N: uint32(len(chunk)), Now: monotonicCoarse()})
		if err != nil {
			return n, fmt.Errorf("install connections: encode arguments: %w", err)
		}
		rc, err := p.objs.XlbCtInstall.Run(&ebpf.RunOptions{Context: args})
		if err != nil {
			return n, fmt.Errorf("install connections: run xlb_ct_install: %w", err)
		}
		done := int(int32(rc))
		if done < 0 {
			return n, fmt.Errorf("install connections: batch of %d refused", len(chunk))
		}
		n += done
		if done == len(chunk) || first != nil {
			continue
		}
		// Some were not installed: which, and why (an end for a flow
		// not here is no error). Those installed unbound (no farm here
		// for them yet) were installed: they carry their flows.
		got := make([]xlbSyncConn, len(chunk))
		if _, err := mem.ReadAt(syncConnBytes(got), 0); err != nil {
			return n, fmt.Errorf("install connections: read results: %w", err)
		}
		for j := range chunk {
			if rc := got[j].Rc; rc != syncOK && rc != syncUnbound && rc != syncGone {
				c := chunk[j].Conn
				why := syncRCNames[rc]
				if why == "" {
					why = fmt.Sprintf("result %d", rc)
				}
				first = fmt.Errorf("install connection %d %s -> %s (backend %s): %s", c.Proto, c.Client, c.VIP, c.Backend, why)
				break
			}
		}
	}
	return n, first
}

// syncConnBytes is the memory of cs, as xlb_sync_in's mapping lays its
// elements out (struct sync_conn, a multiple of 8 bytes: no gap between
// elements; native byte order, as bpf2go's type mirrors it).
func syncConnBytes(cs []xlbSyncConn) []byte {
	// An array map's elements are 8-byte aligned: a size that is not a
	// multiple of 8 would not compile here.
	var _ [0]struct{} = [unsafe.Sizeof(xlbSyncConn{}) % 8]struct{}{}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(cs))), len(cs)*int(unsafe.Sizeof(xlbSyncConn{})))
}

// syncIn is a peer's event as xlb_ct_install takes it.
func syncIn(ev dataplane.ConnEvent) xlbSyncConn {
	c := ev.Conn
	kind := syncUpdate
	switch ev.Kind {
	case dataplane.ConnNew:
		kind = syncNew
	case dataplane.ConnEnd:
		kind = syncEnd
	case dataplane.ConnSession:
		kind = syncSession
	}
	in := xlbSyncConn{
		Client: addrWords(c.Client.Addr().Unmap()), Vip: addrWords(c.VIP.Addr().Unmap()),
		Backend: addrWords(c.Backend.Addr().Unmap()), Reply: addrWords(c.Reply.Addr().Unmap()),
		Cport: ne16(c.Client.Port()), Vport: ne16(c.VIP.Port()), Bport: ne16(c.Backend.Port()), Rport: ne16(c.Reply.Port()),
		Kind: kind, Proto: c.Proto, Family: familyOf(c.Client.Addr().Unmap()), Left: c.Timeout,
	}
	if c.Proto == unix.IPPROTO_TCP && kind != syncSession {
		in.State = flowTCPState(c.TCPState)
	}
	return in
}
