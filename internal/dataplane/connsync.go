package dataplane

import (
	"context"
	"net/netip"
)

// SyncConn is one tracked, balanced connection as nodes of a cluster
// exchange it: enough for another node to carry the connection's next
// packet as this node would (to the same backend, with the same
// translation).
type SyncConn struct {
	Proto uint8 // IP protocol number
	// Client and VIP are the connection as the client sent it.
	Client, VIP netip.AddrPort
	// Backend is where it was sent (the reply's source); Reply is the
	// address the backend answers to (the client in dnat, the node's
	// source address in snat).
	Backend, Reply netip.AddrPort
	// Timeout is the seconds left before the entry expires when idle.
	Timeout uint32
	// TCPState is the TCP tracking state (the kernel's enum), 0 for
	// other protocols.
	TCPState uint8
	Mark     uint32
}

// ConnEventKind says what happened to a connection.
type ConnEventKind uint8

// Kinds of connection events.
const (
	ConnNew ConnEventKind = iota + 1
	ConnUpdate
	ConnEnd
	// ConnSession is a persistence session made, moved to another
	// backend, or refreshed (not a connection): Client is the client as
	// the farm's persistence keys it (address, port; the zero address or
	// port where it does not key on them), VIP the farm's service key
	// (port 0 for a farm of every port), Backend the backend the session
	// holds, Timeout the seconds it has left; Reply, TCPState and Mark
	// are unused.
	ConnSession
)

// ConnEvent is one new, updated or ended connection, or a session.
type ConnEvent struct {
	Kind ConnEventKind
	Conn SyncConn
}

// ConnSyncer is implemented for data planes whose connection state can be
// streamed to other nodes and installed from them (internal/cluster/sync).
type ConnSyncer interface {
	// WatchConns calls fn with batches of the plane's connection events
	// until ctx ends or the event source fails. fn keeps no reference to
	// a batch after it returns (a plane may reuse it), and may be called
	// from more than one goroutine at once (sessionsync adds its own).
	WatchConns(ctx context.Context, fn func([]ConnEvent)) error
	// DumpConns returns every tracked connection (a full resync).
	DumpConns(ctx context.Context) ([]SyncConn, error)
	// InstallConns makes the plane hold (or forget, for ConnEnd) the
	// connections of events that another node sent, and returns how many
	// it installed or removed. It keeps no reference to evs (the caller
	// reuses it).
	InstallConns(ctx context.Context, evs []ConnEvent) (int, error)
}

// SessionSyncer is implemented by a ConnSyncer whose persistence sessions
// go to the other nodes too: WatchConns sends them as ConnSession events
// and InstallConns installs them; DumpSessions lists them for a full
// resync.
type SessionSyncer interface {
	DumpSessions(ctx context.Context) ([]SyncConn, error)
}
