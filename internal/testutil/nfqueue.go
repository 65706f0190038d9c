package testutil

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nfnetlink_queue (NFQUEUE) constants from linux/netfilter/nfnetlink_queue.h
// (not in x/sys/unix). github.com/florianl/go-nfqueue is not on the module
// proxy this project builds from, so this is the few messages a test needs.
const (
	nfnlSubsysQueue    = 3
	nfqnlMsgPacket     = 0
	nfqnlMsgVerdict    = 1
	nfqnlMsgConfig     = 2
	nfqaCfgCmd         = 1
	nfqaCfgParams      = 2
	nfqaPacketHdr      = 1
	nfqaVerdictHdr     = 2
	nfqaPayload        = 10
	nfqnlCfgCmdBind    = 1
	nfqnlCopyPacket    = 2
	nfVerdictDrop      = 0
	nfVerdictAccept    = 1
	nfqueueCopyLenWant = 128
)

// NFQueuePacket is one packet a queue received.
type NFQueuePacket struct {
	Src, Dst netip.Addr
	Proto    uint8
	DstPort  uint16
}

// NFQueue reads one nfqueue in a namespace and gives each packet the
// verdict accept (or drop, see SetDrop); it records what it saw.
type NFQueue struct {
	c    *netlink.Conn
	num  uint16
	mu   sync.Mutex
	seen []NFQueuePacket
	drop bool
	done chan struct{}
}

// ListenNFQueue binds queue num in ns and answers its packets until
// tb's Cleanup.
func ListenNFQueue(tb testing.TB, ns netns.NsHandle, num uint16) *NFQueue {
	tb.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		tb.Fatalf("nfqueue: %v", err)
	}
	q := &NFQueue{c: c, num: num, done: make(chan struct{})}
	cfg := func(attrs []netlink.Attribute) {
		m := q.msg(nfqnlMsgConfig, attrs)
		m.Header.Flags |= netlink.Acknowledge
		if _, err := c.Execute(m); err != nil {
			tb.Fatalf("nfqueue config queue %d: %v", num, err)
		}
	}
	// struct nfqnl_msg_config_cmd {u8 command; u8 pad; be16 pf}
	cfg([]netlink.Attribute{{Type: nfqaCfgCmd, Data: []byte{nfqnlCfgCmdBind, 0, 0, 0}}})
	// struct nfqnl_msg_config_params {be32 copy_range; u8 copy_mode}
	params := binary.BigEndian.AppendUint32(nil, nfqueueCopyLenWant)
	cfg([]netlink.Attribute{{Type: nfqaCfgParams, Data: append(params, nfqnlCopyPacket)}})
	go q.run()
	tb.Cleanup(func() {
		c.Close()
		<-q.done
	})
	return q
}

func (q *NFQueue) msg(typ int, attrs []netlink.Attribute) netlink.Message {
	data, _ := netlink.MarshalAttributes(attrs)
	hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(q.num >> 8), byte(q.num)}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysQueue<<8 | typ), Flags: netlink.Request},
		Data:   append(hdr, data...),
	}
}

// SetDrop makes the queue drop (true) or accept (false) what comes next.
func (q *NFQueue) SetDrop(drop bool) {
	q.mu.Lock()
	q.drop = drop
	q.mu.Unlock()
}

// Seen returns the packets received so far.
func (q *NFQueue) Seen() []NFQueuePacket {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]NFQueuePacket(nil), q.seen...)
}

// WaitSeen waits until n packets were received, at most timeout.
func (q *NFQueue) WaitSeen(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for len(q.Seen()) < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %d received %d packets, want %d", q.num, len(q.Seen()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func (q *NFQueue) run() {
	defer close(q.done)
	for {
		msgs, err := q.c.Receive()
		if err != nil {
			return // closed
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(nfnlSubsysQueue<<8|nfqnlMsgPacket) || len(m.Data) < 4 {
				continue
			}
			ad, err := netlink.NewAttributeDecoder(m.Data[4:])
			if err != nil {
				continue
			}
			var id uint32
			var p NFQueuePacket
			for ad.Next() {
				switch ad.Type() {
				case nfqaPacketHdr:
					if b := ad.Bytes(); len(b) >= 4 {
						id = binary.BigEndian.Uint32(b)
					}
				case nfqaPayload:
					p = parseIPPacket(ad.Bytes())
				}
			}
			q.mu.Lock()
			q.seen = append(q.seen, p)
			verdict := uint32(nfVerdictAccept)
			if q.drop {
				verdict = nfVerdictDrop
			}
			q.mu.Unlock()
			hdr := binary.BigEndian.AppendUint32(nil, verdict)
			hdr = binary.BigEndian.AppendUint32(hdr, id)
			_, _ = q.c.Send(q.msg(nfqnlMsgVerdict, []netlink.Attribute{{Type: nfqaVerdictHdr, Data: hdr}}))
		}
	}
}

// parseIPPacket reads the addresses, protocol and destination port of an
// IPv4 or IPv6 packet (no extension headers).
func parseIPPacket(b []byte) NFQueuePacket {
	var p NFQueuePacket
	var l4 []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		p.Src, _ = netip.AddrFromSlice(b[12:16])
		p.Dst, _ = netip.AddrFromSlice(b[16:20])
		p.Proto = b[9]
		l4 = b[int(b[0]&0xf)*4:]
	case len(b) >= 40 && b[0]>>4 == 6:
		p.Src, _ = netip.AddrFromSlice(b[8:24])
		p.Dst, _ = netip.AddrFromSlice(b[24:40])
		p.Proto = b[6]
		l4 = b[40:]
	}
	if len(l4) >= 4 {
		p.DstPort = binary.BigEndian.Uint16(l4[2:4])
	}
	return p
}
