package connsync

import (
	"encoding/binary"

	"github.com/xlb-lb/xlb/internal/dataplane"
)

// A connection's records that share a batch of the data plane's events
// are folded into one before they go to the peers: a TCP flow's new
// record and its "established" update usually share a batch (they are one
// round trip apart; a batch spans up to 10 ms), and a short flow's FIN
// update too. A peer then installs the flow once, in its latest state,
// instead of once per step: on either plane an update of a connection
// does what its new record would do with the later state (the eBPF
// installer moves the state forward, the nft one rewrites the entry), so
// the peer ends up with the same entry for a fraction of the work (each
// record is a hash-table insert or lookup on the peer, and its share of
// the wire).

// coalescer folds records of one connection within a batch; its map is
// kept between batches (one watcher uses it). The map is keyed by a hash
// of the connection, the record found checked against it (its tuple and
// its translation: a new connection on the same tuple to another backend
// is another connection): keyed by the four addresses and ports
// themselves the fold took 100-120 ns a record, 48 with the hash
// (BenchmarkFold, a batch of 75 flows' three records).
type coalescer struct {
	at map[uint64]int // the batch's record of the connection that later updates fold into
}

// connHash mixes c's client address and port, and its VIP's and
// backend's ports: enough to tell a batch's connections apart (not
// secret: a collision only costs a fold; sameConn checks the rest).
func connHash(c *dataplane.SyncConn) uint64 {
	a := c.Client.Addr().As16()
	h := binary.LittleEndian.Uint64(a[:8])*0x9e3779b97f4a7c15 ^ binary.LittleEndian.Uint64(a[8:])
	h ^= uint64(c.Client.Port()) | uint64(c.VIP.Port())<<16 | uint64(c.Backend.Port())<<32 | uint64(c.Proto)<<48
	h *= 0xbf58476d1ce4e5b9
	return h ^ h>>31
}

// sameConn: a and b are one connection's records.
func sameConn(a, b *dataplane.SyncConn) bool {
	return a.Proto == b.Proto && a.Client == b.Client && a.VIP == b.VIP && a.Backend == b.Backend && a.Reply == b.Reply
}

// fold rewrites evs in place, each update of a connection folded into the
// batch's earlier new or update record of it (which takes the update's
// state, timeout and mark, keeping its kind and place), and returns the
// records left. An end, and a new record, start over: what follows them
// folds into them, never into a record before them. Sessions are kept as
// they are.
func (c *coalescer) fold(evs []dataplane.ConnEvent) []dataplane.ConnEvent {
	if len(evs) < 2 {
		return evs
	}
	if c.at == nil {
		c.at = make(map[uint64]int, len(evs))
	}
	clear(c.at)
	out := evs[:0]
	for _, ev := range evs {
		if ev.Kind == dataplane.ConnSession {
			out = append(out, ev)
			continue
		}
		k := connHash(&ev.Conn)
		switch ev.Kind {
		case dataplane.ConnUpdate:
			if i, ok := c.at[k]; ok && sameConn(&out[i].Conn, &ev.Conn) {
				out[i].Conn = ev.Conn
				continue
			}
			c.at[k] = len(out)
		case dataplane.ConnNew:
			c.at[k] = len(out)
		default: // an end: nothing folds across it (a colliding other
			// connection's record only loses its folds)
			delete(c.at, k)
		}
		out = append(out, ev)
	}
	clear(evs[len(out):]) // no stale copies past the end
	return out
}
