package connsync

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/netip"
	"slices"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// The wire: a receiver that accepts a connection from a configured peer
// sends a greeting (magic, version, a random 16-byte nonce); the sender
// then sends frames, each
//
//	length u32 (of what follows) | type u8 | seq u64 | payload | HMAC-SHA256(key, nonce | type | seq | payload)
//
// seq starts at 1 and rises by one: a frame replayed, reordered or from
// another connection (another nonce) fails its MAC or its sequence. The
// key is shared by the cluster's nodes (--sync-key-file). The channel is
// authenticated, not encrypted: connection tuples travel in clear text.

const (
	magic       = "XLBSYNC1"
	nonceLen    = 16
	macLen      = sha256.Size
	maxFrame    = 1 << 20 // a batch of 256 IPv6 connections is 14 KiB
	frameHeader = 1 + 8
)

// Frame types.
const (
	frameHello     = 1 // payload: the sender's node name
	frameDumpBegin = 2 // a full resync follows
	frameConns     = 3 // payload: a batch of connection events
	frameDumpEnd   = 4 // the sender's state has been sent whole
	frameKeepalive = 5
)

// Errors a receiver counts.
var (
	errBadMAC    = errors.New("frame fails its MAC")
	errMalformed = errors.New("malformed frame")
)

// frameWriter writes MAC'd frames.
type frameWriter struct {
	w     *bufio.Writer
	key   []byte
	nonce []byte
	seq   uint64
	buf   []byte
	mac   hash.Hash // hmac under key, made once and reset for each frame
}

// frameMAC is h (made under key if nil) reset and fed the nonce.
func frameMAC(h hash.Hash, key, nonce []byte) hash.Hash {
	if h == nil {
		h = hmac.New(sha256.New, key)
	} else {
		h.Reset()
	}
	h.Write(nonce)
	return h
}

func (fw *frameWriter) write(typ byte, payload []byte) error {
	fw.seq++
	fw.buf = fw.buf[:0]
	fw.buf = binary.BigEndian.AppendUint32(fw.buf, uint32(frameHeader+len(payload)+macLen))
	fw.buf = append(fw.buf, typ)
	fw.buf = binary.BigEndian.AppendUint64(fw.buf, fw.seq)
	fw.buf = append(fw.buf, payload...)
	fw.mac = frameMAC(fw.mac, fw.key, fw.nonce)
	fw.mac.Write(fw.buf[4:])
	fw.buf = fw.mac.Sum(fw.buf)
	_, err := fw.w.Write(fw.buf)
	return err
}

func (fw *frameWriter) flush() error { return fw.w.Flush() }

// frameReader reads and checks frames.
type frameReader struct {
	r     *bufio.Reader
	key   []byte
	nonce []byte
	seq   uint64
	buf   []byte
	mac   hash.Hash
	sum   []byte
}

// read returns the next frame's type and payload (valid until the next
// read).
func (fr *frameReader) read() (byte, []byte, error) {
	var lb [4]byte
	if _, err := io.ReadFull(fr.r, lb[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(lb[:])
	if n < frameHeader+macLen || n > maxFrame {
		return 0, nil, fmt.Errorf("%w: length %d", errMalformed, n)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	b := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, b); err != nil {
		return 0, nil, err
	}
	body, sum := b[:n-macLen], b[n-macLen:]
	fr.mac = frameMAC(fr.mac, fr.key, fr.nonce)
	fr.mac.Write(body)
	fr.sum = fr.mac.Sum(fr.sum[:0])
	if !hmac.Equal(fr.sum, sum) {
		return 0, nil, errBadMAC
	}
	seq := binary.BigEndian.Uint64(body[1:9])
	if seq != fr.seq+1 {
		return 0, nil, fmt.Errorf("%w: sequence %d after %d", errMalformed, seq, fr.seq)
	}
	fr.seq = seq
	return body[0], body[frameHeader:], nil
}

// Encoding of a batch: count u16, then per event
//
//	kind u8 | proto u8 | family u8 (4 or 6) | client, vip, backend, reply (address, port u16) | timeout u32 | tcp state u8 | mark u32
//
// kind is a dataplane.ConnEventKind: a connection new, updated or ended,
// or a persistence session (ConnSession: its reply, state and mark zero).

func connSize(is6 bool) int {
	al := 4
	if is6 {
		al = 16
	}
	return 3 + 4*(al+2) + 4 + 1 + 4
}

func appendConns(dst []byte, evs []dataplane.ConnEvent) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(evs)))
	for _, e := range evs {
		c := &e.Conn
		fam := byte(4)
		if c.Client.Addr().Is6() {
			fam = 6
		}
		dst = append(dst, byte(e.Kind), c.Proto, fam)
		for _, ap := range []netip.AddrPort{c.Client, c.VIP, c.Backend, c.Reply} {
			a := ap.Addr()
			if fam == 4 {
				a4 := a.Unmap().As4()
				dst = append(dst, a4[:]...)
			} else {
				a16 := a.As16()
				dst = append(dst, a16[:]...)
			}
			dst = binary.BigEndian.AppendUint16(dst, ap.Port())
		}
		dst = binary.BigEndian.AppendUint32(dst, c.Timeout)
		dst = append(dst, c.TCPState)
		dst = binary.BigEndian.AppendUint32(dst, c.Mark)
	}
	return dst
}

// parseConns decodes a batch into dst's room (a receiver reuses one
// slice: a batch is installed before the next is read); anything out of
// place is errMalformed.
func parseConns(dst []dataplane.ConnEvent, b []byte) ([]dataplane.ConnEvent, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: batch of %d bytes", errMalformed, len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	out := slices.Grow(dst[:0], n)
	for i := range n {
		if len(b) < 3 {
			return nil, fmt.Errorf("%w: connection %d truncated", errMalformed, i)
		}
		kind, proto, fam := dataplane.ConnEventKind(b[0]), b[1], b[2]
		if kind < dataplane.ConnNew || kind > dataplane.ConnSession || (fam != 4 && fam != 6) || proto == 0 {
			return nil, fmt.Errorf("%w: connection %d: kind %d, family %d, protocol %d", errMalformed, i, kind, fam, proto)
		}
		sz := connSize(fam == 6)
		if len(b) < sz {
			return nil, fmt.Errorf("%w: connection %d truncated", errMalformed, i)
		}
		p := b[3:sz]
		al := 4
		if fam == 6 {
			al = 16
		}
		var aps [4]netip.AddrPort
		for j := range aps {
			a, _ := netip.AddrFromSlice(p[:al])
			aps[j] = netip.AddrPortFrom(a, binary.BigEndian.Uint16(p[al:al+2]))
			p = p[al+2:]
		}
		out = append(out, dataplane.ConnEvent{Kind: kind, Conn: dataplane.SyncConn{
			Proto: proto, Client: aps[0], VIP: aps[1], Backend: aps[2], Reply: aps[3],
			Timeout: binary.BigEndian.Uint32(p), TCPState: p[4], Mark: binary.BigEndian.Uint32(p[5:]),
		}})
		b = b[sz:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last connection", errMalformed, len(b))
	}
	return out, nil
}
