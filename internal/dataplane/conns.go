package dataplane

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Conn is one tracked connection of a farm, what `ipvsadm -Lc` shows.
type Conn struct {
	// Farm is the farm's name.
	Farm string
	// Protocol is the IP protocol number (6 TCP, 17 UDP, 132 SCTP).
	Protocol uint8
	// State is the connection's state as the table names it, in IPVS's
	// words where they exist: "SYN_SENT", "SYN_RECV", "ESTABLISHED",
	// "FIN_WAIT", "TIME_WAIT", "CLOSE", "CLOSE_WAIT", "LAST_ACK",
	// "UDP", ...
	State string
	// Active is IPVS's ActiveConn: an established TCP connection. Every
	// other connection (TCP opening or closing, UDP) is inactive.
	Active bool
	// Expires is how long the entry lives without another packet.
	Expires time.Duration
	// Client is the client's address and port, VIP the address and port
	// it connected to, Backend the real server's.
	Client, VIP, Backend netip.AddrPort
	// BackendName is the farm's backend of that address ("" when no
	// backend of the farm has it any more).
	BackendName string
}

// ConnFilter selects connections. Zero fields match anything.
type ConnFilter struct {
	// Backend is a backend's name (of any of the farms listed).
	Backend string
	// Client is the client's address (any port).
	Client netip.Addr
	// Owners tells the farms of a shared VIP, protocol and port apart
	// (farms chosen by source table); nil: a connection belongs to the
	// first farm given of its key.
	Owners *plan.ConnOwners
}

// ConnLister lists and deletes farms' tracked connections, in one walk of
// the table whatever the number of farms. The eBPF plane implements it
// over its own conntrack table; the nft plane's connections live in the
// kernel's conntrack, which internal/conntrack reads over netlink (the
// engine is given it, as with FlowFlusher).
type ConnLister interface {
	// Connections lists the tracked connections of the given farms that
	// match flt. A connection belongs to the farm of its VIP, protocol
	// and port; the farm's backends resolve BackendName.
	Connections(ctx context.Context, farms []*model.Farm, flt ConnFilter) ([]Conn, error)
	// DeleteConnections deletes the tracked connections of the given
	// farms that match flt and returns how many it deleted. The next
	// packet of such a connection finds no entry (a TCP segment other
	// than a SYN is refused, a UDP datagram is scheduled anew).
	DeleteConnections(ctx context.Context, farms []*model.Farm, flt ConnFilter) (int, error)
}

// ConnCounts are a backend's tracked connections, IPVS's ActiveConn and
// InActConn.
type ConnCounts struct {
	Active, Inactive uint64
}

// ConnTable is the whole connection table as one walk sees it: how many
// entries it holds and its capacity, and each farm's backends' connection
// counts.
type ConnTable struct {
	// Entries and Capacity count the table's entries (the eBPF plane
	// keeps two per connection, netfilter one); Capacity is 0 when
	// unknown.
	Entries, Capacity uint64
	// Backends: farm name -> one ConnCounts per backend, in the farm's
	// order.
	Backends map[string][]ConnCounts
}

// ConnCounter is implemented by what can count every farm's backends'
// connections in one walk of its table (metrics, the ipvsadm listing).
type ConnCounter interface {
	// CountConns walks the table once and counts the connections of
	// the given farms' backends; owners (nil: none) tells the farms of
	// a shared key apart as ConnFilter.Owners does.
	CountConns(ctx context.Context, farms []*model.Farm, owners *plan.ConnOwners) (ConnTable, error)
}

// ErrNoCounters is what a CounterReader answers when it was configured not
// to count (the nft plane with --nft-counters=false).
var ErrNoCounters = errors.New("the data plane was started without traffic counters")

// BulkCounterReader is implemented by data planes that read the counters
// of many farms at once more cheaply than one farm at a time (a scrape of
// /metrics, the rate estimator).
type BulkCounterReader interface {
	// AllCounters reads the counters of each farm (the result is
	// parallel to farms; farms the plane does not hold are zero).
	AllCounters(ctx context.Context, farms []*model.Farm) ([]FarmCounters, error)
}

// PacketStats is implemented by data planes that count what their program
// does with packets, by event ("new_flow", "no_backend", ...), and say
// which of those events drop the packet.
type PacketStats interface {
	PacketStats(ctx context.Context) (map[string]uint64, error)
	// DropReasons are the events of PacketStats that drop the packet.
	DropReasons() []string
}
