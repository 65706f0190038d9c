package connsync

import (
	"net/netip"

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

// coalesceKey is a connection as its records name it: its tuple and its
// translation (a new connection on the same tuple to another backend is
// another connection).
type coalesceKey struct {
	proto                       uint8
	client, vip, backend, reply netip.AddrPort
}

// coalescer folds records of one connection within a batch; its map is
// kept between batches (one watcher uses it).
type coalescer struct {
	at map[coalesceKey]int // the batch's record of the connection that later updates fold into
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
		c.at = make(map[coalesceKey]int, len(evs))
	}
	clear(c.at)
	out := evs[:0]
	for _, ev := range evs {
		if ev.Kind == dataplane.ConnSession {
			out = append(out, ev)
			continue
		}
		k := coalesceKey{ev.Conn.Proto, ev.Conn.Client, ev.Conn.VIP, ev.Conn.Backend, ev.Conn.Reply}
		switch ev.Kind {
		case dataplane.ConnUpdate:
			if i, ok := c.at[k]; ok {
				out[i].Conn = ev.Conn
				continue
			}
			c.at[k] = len(out)
		case dataplane.ConnNew:
			c.at[k] = len(out)
		default: // an end: nothing folds across it
			delete(c.at, k)
		}
		out = append(out, ev)
	}
	clear(evs[len(out):]) // no stale copies past the end
	return out
}
