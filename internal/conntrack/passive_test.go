package conntrack

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"testing"

	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/model"
)

// Passive's reading of conntrack's events (the real ones are in
// internal/health's TestPassiveEjectsWithTrafficNft; here the cases real
// traffic cannot make on demand): a SYN-ACK is a success, a RST the
// backend sent is a failure, a client's own RST (no packet in the reply
// direction) is not, nor is an entry deleted while waiting, nor a
// connection to another farm or backend.
func TestPassiveEvents(t *testing.T) {
	fs, err := model.DecodeFarms([]byte(`{"name":"web","virtual-addr":"10.99.0.1","virtual-ports":"80",
		"check":{"passive":{"failures":"3"}},
		"backends":[{"name":"b1","ip-addr":"10.200.0.11","port":"8080"},{"name":"b2","ip-addr":"10.200.0.12","port":"8080"}]}`),
		func(string) (*model.Farm, bool) { return nil, false })
	if err != nil {
		t.Fatal(err)
	}
	p := NewPassive(slog.New(slog.NewTextHandler(io.Discard, nil)), 0)
	// The index only (SetFarms would start listening in this namespace).
	p.mu.Lock()
	p.farms["web"] = passiveFarm{timeout: fs[0].Check.Passive.Resolved().Timeout, f: &fs[0]}
	for i, b := range fs[0].Backends {
		_ = b
		p.indexBackend(&fs[0], i)
	}
	p.mu.Unlock()

	id := uint32(0)
	flow := func(vip, be string, state uint8) *ct.Flow {
		f := &ct.Flow{ID: id}
		f.TupleOrig.Proto.Protocol = unix.IPPROTO_TCP
		f.TupleOrig.IP.SourceAddress = netip.MustParseAddr("10.100.0.2")
		f.TupleOrig.IP.DestinationAddress = netip.MustParseAddr(vip)
		f.TupleOrig.Proto.SourcePort, f.TupleOrig.Proto.DestinationPort = 40000, 80
		bap := netip.MustParseAddrPort(be)
		f.TupleReply.IP.SourceAddress, f.TupleReply.Proto.SourcePort = bap.Addr(), bap.Port()
		f.ProtoInfo.TCP = &ct.ProtoInfoTCP{State: state}
		return f
	}
	start := func(vip, be string) uint32 {
		id++
		p.event(ct.Event{Type: ct.EventNew, Flow: flow(vip, be, tcpSynSent)})
		return id
	}
	end := func(update bool, vip, be string, state uint8, orig, reply uint64) {
		f := flow(vip, be, state)
		f.CountersOrig.Packets, f.CountersReply.Packets = orig, reply
		ev := ct.Event{Type: ct.EventDestroy, Flow: f}
		if update {
			ev.Type = ct.EventUpdate
		}
		p.event(ev)
	}
	const b1, b2, vip = "10.200.0.11:8080", "10.200.0.12:8080", "10.99.0.1"

	start(vip, b1)
	end(false, vip, b1, tcpClose, 1, 1) // the backend's RST
	start(vip, b1)
	end(false, vip, b1, tcpClose, 2, 0) // the client's own RST
	start(vip, b1)
	end(false, vip, b1, tcpSynSent, 1, 0) // deleted (a flush)
	start(vip, b1)
	end(false, vip, b1, tcpClose, 0, 0) // no accounting: counted
	start(vip, b2)
	end(true, vip, b2, tcpSynRecv, 0, 0) // SYN-ACK
	start("10.99.0.9", b2)               // another VIP: not watched
	start(vip, "10.200.0.13:8080")       // not a backend
	if len(p.flows) != 0 {
		t.Errorf("%d handshakes under way, want 0: %v", len(p.flows), p.flows)
	}
	got, _ := p.Counts(context.Background())
	byName := map[string]string{}
	for _, c := range got {
		byName[c.Backend] = fmtCount(c.Consecutive, c.Successes, c.Resets, c.Timeouts)
	}
	if want := map[string]string{"b1": "consecutive 2 successes 0 resets 2 timeouts 0", "b2": "consecutive 0 successes 1 resets 0 timeouts 0"}; byName["b1"] != want["b1"] || byName["b2"] != want["b2"] {
		t.Errorf("counts %v, want %v", byName, want)
	}
}

func fmtCount(cons uint32, succ, resets, timeouts uint64) string {
	return "consecutive " + itoa(uint64(cons)) + " successes " + itoa(succ) + " resets " + itoa(resets) + " timeouts " + itoa(timeouts)
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
