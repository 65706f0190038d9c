package nft

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	// nftaSetElemExpressions: an element's expressions when it has more
	// than one (one comes as NFTA_SET_ELEM_EXPR); not in x/sys/unix.
	nftaSetElemExpressions = 0x0b
	// nlaTypeMask: an attribute's type without NLA_F_NESTED and
	// NLA_F_NET_BYTEORDER.
	nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
)

// ctrVal is one counter set element's counter.
type ctrVal struct{ packets, bytes uint64 }

// dialCounters opens a netlink connection to nftables in the plane's
// namespace for a dump of the counter sets.
func (s *Plane) dialCounters() (*netlink.Conn, error) {
	cfg := &netlink.Config{}
	if s.opts.NetNS.IsOpen() {
		cfg.NetNS = int(s.opts.NetNS)
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to nftables: %w", err)
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// dumpCounterSet calls each with the key and the counter of every element
// of set in the inet table, from one NFT_MSG_GETSETELEM dump decoded in
// place (key is only valid during the call). Two costs of
// google/nftables' GetSetElements are avoided, with 10,000 backends
// (30,000 elements) read every 2 s by the rate estimator
// (BenchmarkRateTick): it decoded every attribute into new objects (66 MB
// in 590,000 allocations a read), and it received with a page-sized
// buffer, so the kernel filled pages: the kernel's dump of a set walks its
// elements from the first again for every message (skipping those sent),
// so the dump's cost grows with the square of the messages. Received here
// into a 64 KiB buffer, the kernel fills up to 32 KiB a message.
func dumpCounterSet(c *netlink.Conn, buf []byte, table, set string, each func(key []byte, v ctrVal)) error {
	req, err := nftMsg(byte(nftables.TableFamilyINet), unix.NFT_MSG_GETSETELEM, netlink.Request|netlink.Dump, []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
	})
	if err != nil {
		return err
	}
	if _, err := c.Send(req); err != nil {
		return err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return err
		}
		if rerr != nil {
			return rerr
		}
		for b := buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b))
			typ := binary.NativeEndian.Uint16(b[4:])
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return fmt.Errorf("malformed netlink message (%d of %d bytes)", l, len(b))
			}
			msg := b[unix.NLMSG_HDRLEN:l]
			switch typ {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(msg) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(msg)); code != 0 {
						return unix.Errno(-code)
					}
				}
				return nil
			}
			if len(msg) >= 4 {
				setElems(msg[4:], each)
			}
			l = (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
			if l >= len(b) {
				break
			}
			b = b[l:]
		}
	}
}

// setElems calls each for every element with a key and a counter in one
// NEWSETELEM message's attributes.
func setElems(b []byte, each func(key []byte, v ctrVal)) {
	for typ, list, rest, ok := nextAttr(b); ok; typ, list, rest, ok = nextAttr(rest) {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		for typ, el, rest, ok := nextAttr(list); ok; typ, el, rest, ok = nextAttr(rest) {
			if typ != unix.NFTA_LIST_ELEM {
				continue
			}
			var key []byte
			var v ctrVal
			counted := false
			for typ, a, rest, ok := nextAttr(el); ok; typ, a, rest, ok = nextAttr(rest) {
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					for typ, d, rest, ok := nextAttr(a); ok; typ, d, rest, ok = nextAttr(rest) {
						if typ == unix.NFTA_DATA_VALUE {
							key = d
						}
					}
				case unix.NFTA_SET_ELEM_EXPR:
					v, counted = counterExpr(a)
				case nftaSetElemExpressions:
					for typ, e, rest, ok := nextAttr(a); ok; typ, e, rest, ok = nextAttr(rest) {
						if typ != unix.NFTA_LIST_ELEM {
							continue
						}
						if cv, isCounter := counterExpr(e); isCounter {
							v, counted = cv, true
						}
					}
				}
			}
			if key != nil && counted {
				each(key, v)
			}
		}
	}
}

// counterExpr decodes a counter expression's attributes (NFTA_EXPR_NAME
// "counter", NFTA_EXPR_DATA with NFTA_COUNTER_BYTES and _PACKETS).
func counterExpr(b []byte) (ctrVal, bool) {
	var v ctrVal
	isCounter := false
	for typ, a, rest, ok := nextAttr(b); ok; typ, a, rest, ok = nextAttr(rest) {
		switch typ {
		case unix.NFTA_EXPR_NAME:
			isCounter = string(a) == "counter\x00" || string(a) == "counter"
		case unix.NFTA_EXPR_DATA:
			for typ, d, rest, ok := nextAttr(a); ok; typ, d, rest, ok = nextAttr(rest) {
				if len(d) != 8 {
					continue
				}
				switch typ {
				case unix.NFTA_COUNTER_BYTES:
					v.bytes = binary.BigEndian.Uint64(d)
				case unix.NFTA_COUNTER_PACKETS:
					v.packets = binary.BigEndian.Uint64(d)
				}
			}
		}
	}
	return v, isCounter
}

// nextAttr splits the first netlink attribute off b: its type (without the
// nested and byte-order flags), its payload and what follows; ok is false
// at the end of b or at a malformed attribute.
func nextAttr(b []byte) (typ uint16, payload, rest []byte, ok bool) {
	if len(b) < unix.NLA_HDRLEN {
		return 0, nil, nil, false
	}
	l := int(binary.NativeEndian.Uint16(b))
	if l < unix.NLA_HDRLEN || l > len(b) {
		return 0, nil, nil, false
	}
	typ = binary.NativeEndian.Uint16(b[2:]) & nlaTypeMask
	payload = b[unix.NLA_HDRLEN:l]
	l = (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
	if l > len(b) {
		l = len(b)
	}
	return typ, payload, b[l:], true
}
