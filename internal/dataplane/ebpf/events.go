package ebpf

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/xlb-lb/xlb/internal/model"
)

// startEvents starts reading the connection log (xlb_events): one log
// line per new connection of a farm with log set.
func (p *Plane) startEvents() error {
	rd, err := ringbuf.NewReader(p.objs.XlbEvents)
	if err != nil {
		return fmt.Errorf("open connection log ring buffer: %w", err)
	}
	p.events = rd
	p.evDone = make(chan struct{})
	go p.readEvents(rd, p.evDone)
	return nil
}

// stopEvents stops the reader and waits for it.
func (p *Plane) stopEvents() {
	if p.events == nil {
		return
	}
	p.events.Close()
	<-p.evDone
	p.events = nil
}

func (p *Plane) readEvents(rd *ringbuf.Reader, done chan struct{}) {
	defer close(done)
	var rec ringbuf.Record
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed) {
				return
			}
			p.log.Error("read ebpf connection log", "err", err)
			return
		}
		var ev xlbConnEvent
		// Policy drops share the ring buffer, told apart by their size.
		if len(rec.RawSample) == int(unsafe.Sizeof(xlbTblEvent{})) {
			te := *(*xlbTblEvent)(unsafe.Pointer(&rec.RawSample[0]))
			p.logPolicyDrop(&te)
			continue
		}
		if len(rec.RawSample) < int(unsafe.Sizeof(ev)) {
			continue
		}
		ev = *(*xlbConnEvent)(unsafe.Pointer(&rec.RawSample[0]))
		p.logEvent(&ev)
	}
}

// logEvent logs one new connection, naming its farm and backend: a line
// for each hook of the farm's log, with the prefix the nft plane gives that
// hook's line (nftlb's, plan.FarmLogPrefixes).
func (p *Plane) logEvent(ev *xlbConnEvent) {
	farm, backend := "", ""
	var prefixes []string
	p.mu.Lock()
	if g := p.bySvc[ev.Svc]; g != nil {
		farm, prefixes = g.farm, g.logPrefixes
		for i, id := range g.ids {
			if id == ev.Backend && i < len(g.names) {
				backend = g.names[i]
				break
			}
		}
	}
	p.mu.Unlock()
	proto := model.ProtoTCP
	if ev.Proto == model.ProtoUDP.Number() {
		proto = model.ProtoUDP
	}
	client := netip.AddrPortFrom(wordsAddr(ev.Src, ev.Family), be16(ev.Sport)).String()
	vip := netip.AddrPortFrom(wordsAddr(ev.Vip, ev.Family), be16(ev.Vport)).String()
	dst := netip.AddrPortFrom(wordsAddr(ev.Dst, ev.Family), be16(ev.Dport)).String()
	if len(prefixes) == 0 {
		prefixes = []string{""} // the farm is gone: the line still says what happened
	}
	for _, prefix := range prefixes {
		p.log.Info("new connection",
			slog.String("prefix", prefix),
			slog.String("farm", farm),
			slog.String("backend", backend),
			slog.String("protocol", proto.String()),
			slog.String("client", client),
			slog.String("vip", vip),
			slog.String("backend_addr", dst))
	}
}

// logPolicyDrop logs a packet a farm's policy dropped, naming the table
// and its log-prefix (the nft plane logs the same drops with nftables'
// log statement).
func (p *Plane) logPolicyDrop(ev *xlbTblEvent) {
	table, prefix := "", ""
	p.mu.Lock()
	if t := p.tbls.byID[ev.Id]; t != nil {
		table, prefix = t.Name, t.LogPrefix
	}
	p.mu.Unlock()
	verdict := model.ListDeny
	if uint32(ev.Verdict) == tblAllow {
		verdict = model.ListAllow
	}
	p.log.Info("policy drop",
		slog.String("prefix", prefix),
		slog.String("table", table),
		slog.String("verdict", verdict.PolicyType()),
		slog.String("protocol", protoName(ev.Proto)),
		slog.String("client", netip.AddrPortFrom(wordsAddr(ev.Src, ev.Family), be16(ev.Sport)).String()),
		slog.String("vip", netip.AddrPortFrom(wordsAddr(ev.Dst, ev.Family), be16(ev.Dport)).String()),
		slog.Bool("xdp", ev.Xdp != 0))
}

func protoName(n uint8) string {
	for _, pr := range []model.Protocol{model.ProtoTCP, model.ProtoUDP, model.ProtoSCTP} {
		if pr.Number() == n {
			return pr.String()
		}
	}
	return fmt.Sprint(n)
}
