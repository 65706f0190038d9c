package testutil

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nfnetlink_log (NFLOG) constants from linux/netfilter/nfnetlink_log.h
// (not in x/sys/unix).
const (
	nfnlSubsysULOG   = 4
	nfulnlMsgPacket  = 0
	nfulnlMsgConfig  = 1
	nfulaCfgCmd      = 1
	nfulaCfgMode     = 2
	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2
	nfulaPayload     = 9
	nfulaPrefix      = 10
)

// NFLogEntry is one packet logged to an NFLOG group.
type NFLogEntry struct {
	Prefix string
	Src    netip.Addr // of the logged packet's IP header
	Dst    netip.Addr
}

// NFLog receives the packets logged to one NFLOG group in a namespace
// (nftables `log group N`). The kernel log of a namespace other than the
// host's is silent unless a host-wide sysctl says otherwise, so tests read
// NFLOG instead.
type NFLog struct {
	c       *netlink.Conn
	pending []NFLogEntry // read but not returned yet
}

// ListenNFLOG binds NFLOG group in ns; it is closed in tb.Cleanup.
func ListenNFLOG(tb testing.TB, ns netns.NsHandle, group uint16) *NFLog {
	tb.Helper()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		tb.Fatalf("nflog: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	cfg := func(attrs []netlink.Attribute) {
		data, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			tb.Fatal(err)
		}
		hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(group >> 8), byte(group)}
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
			Data:   append(hdr, data...),
		})
		if err != nil {
			tb.Fatalf("nflog config group %d: %v", group, err)
		}
	}
	cfg([]netlink.Attribute{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}})
	mode := binary.BigEndian.AppendUint32(nil, 0xffff)
	cfg([]netlink.Attribute{{Type: nfulaCfgMode, Data: append(mode, nfulnlCopyPacket, 0)}})
	return &NFLog{c: c}
}

// Wait returns the first entry whose prefix contains substr, waiting at
// most timeout. Entries before it are skipped; those after it that came in
// the same read (one packet logged by several rules arrives as one batch)
// are kept for the next Wait.
func (l *NFLog) Wait(substr string, timeout time.Duration) (NFLogEntry, error) {
	for len(l.pending) > 0 {
		e := l.pending[0]
		l.pending = l.pending[1:]
		if strings.Contains(e.Prefix, substr) {
			return e, nil
		}
	}
	deadline := time.Now().Add(timeout)
	if err := l.c.SetReadDeadline(deadline); err != nil {
		return NFLogEntry{}, err
	}
	for {
		msgs, err := l.c.Receive()
		if err != nil {
			return NFLogEntry{}, fmt.Errorf("no NFLOG entry with %q: %w", substr, err)
		}
		for i, m := range msgs {
			e, ok := decodeNFLog(m)
			if !ok {
				continue
			}
			if strings.Contains(e.Prefix, substr) {
				for _, m := range msgs[i+1:] {
					if e, ok := decodeNFLog(m); ok {
						l.pending = append(l.pending, e)
					}
				}
				return e, nil
			}
		}
	}
}

// decodeNFLog decodes one NFLOG packet message.
func decodeNFLog(m netlink.Message) (NFLogEntry, bool) {
	if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
		return NFLogEntry{}, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return NFLogEntry{}, false
	}
	var e NFLogEntry
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			e.Prefix = strings.TrimRight(string(ad.Bytes()), "\x00")
		case nfulaPayload:
			p := ad.Bytes()
			switch {
			case len(p) >= 20 && p[0]>>4 == 4:
				e.Src, _ = netip.AddrFromSlice(p[12:16])
				e.Dst, _ = netip.AddrFromSlice(p[16:20])
			case len(p) >= 40 && p[0]>>4 == 6:
				e.Src, _ = netip.AddrFromSlice(p[8:24])
				e.Dst, _ = netip.AddrFromSlice(p[24:40])
			}
		}
	}
	return e, true
}
