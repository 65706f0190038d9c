// Package dataplane defines the one interface behind which xlb's kernel data
// planes (nftables, eBPF) sit. The engine hands a data plane the difference
// between two states (a plan.Diff); the data plane applies it as one kernel
// transaction. What is computed the same way for both planes (the
// dual-family split, Maglev, weighted slots, the flow hash) lives in
// package plan, below both.
package dataplane

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
)

// Dataplane programs farms into the kernel.
type Dataplane interface {
	// Name is the data plane's name as the user selects it ("nft", "ebpf").
	Name() string
	// Check refuses a farm that uses something this data plane does not
	// implement, with an *model.FieldError whose Problem says so. It must not
	// touch the kernel.
	Check(f *model.Farm) error
	// Apply applies the diff to the kernel as one transaction: either all of
	// it takes effect or none of it does.
	Apply(ctx context.Context, d plan.Diff) error
	// Reconcile makes the kernel hold exactly the given farms, repairing
	// anything changed by hand, without a moment where existing farms are
	// missing (no flush).
	Reconcile(ctx context.Context, farms []*model.Farm) error
	// Close releases the data plane's resources. It leaves the kernel's
	// rules in place so traffic keeps flowing while xlb restarts.
	Close() error
}

// Unsupported builds the error a data plane returns for a farm field value it
// does not implement.
func Unsupported(plane string, f *model.Farm, field, value string) error {
	return Refuse(f, field, value, fmt.Sprintf("is not implemented by the %s data plane yet", plane))
}

// Refuse builds the error a data plane's Check returns for a farm field
// value it cannot take; problem says why and what it takes instead.
func Refuse(f *model.Farm, field, value, problem string) error {
	return &model.FieldError{Object: fmt.Sprintf("farm %q", f.Name), Field: field, Value: value, Problem: problem}
}

// RefuseBackend is Refuse for a field of the farm's backend named backend.
func RefuseBackend(f *model.Farm, backend, field, value, problem string) error {
	return &model.FieldError{Object: fmt.Sprintf("farm %q backend %q", f.Name, backend), Field: field, Value: value, Problem: problem}
}

// Session is one persistence entry of a farm: a client key and the backend
// its new connections go to.
type Session struct {
	// Client is the persistence key as text: its fields (e.g. source
	// address, port) joined by "-", in the order srcip, dstip, srcport,
	// dstport, srcmac ("10.0.0.7", "10.0.0.7-443").
	Client string
	// Backend is the backend's name ("" if no backend of the farm has
	// that address any more).
	Backend string
	// Expires is how long the session lives without a new connection.
	Expires time.Duration
	// Static: a static session of the farm's configuration (nftlb's
	// "sessions" in a farm body): it does not expire, and the sessions
	// routes do not delete it (it goes by changing the farm).
	Static bool
}

// SessionStore is implemented by data planes that keep persistence
// sessions in the kernel.
type SessionStore interface {
	// Sessions lists the farm's live sessions.
	Sessions(ctx context.Context, f *model.Farm) ([]Session, error)
	// DeleteSessions deletes the farm's sessions of client (when not
	// "") or of the backend named backend (when not ""), and returns how
	// many it deleted.
	DeleteSessions(ctx context.Context, f *model.Farm, client, backend string) (int, error)
}

// SessionInstaller is implemented by planes that take persistence
// sessions from outside (a peer's, through connection sync).
type SessionInstaller interface {
	// InstallSessions makes farm f hold sessions ss (Client in
	// SessionStore's text form, Backend a backend's name, Expires the
	// time left) and returns how many it wrote; a session it holds
	// already with at least as much time left stands.
	InstallSessions(ctx context.Context, f *model.Farm, ss []Session) (int, error)
}

// Counters are traffic counters of a farm or a backend, what
// `ipvsadm -L --stats` shows: connections, and packets and bytes in each
// direction ("in": client -> backend, "out": backend -> client; bytes of
// the IP packets).
type Counters struct {
	Connections uint64
	InPackets   uint64
	InBytes     uint64
	OutPackets  uint64
	OutBytes    uint64
}

// Add adds o to c.
func (c *Counters) Add(o Counters) {
	c.Connections += o.Connections
	c.InPackets += o.InPackets
	c.InBytes += o.InBytes
	c.OutPackets += o.OutPackets
	c.OutBytes += o.OutBytes
}

// BackendCounters are one backend's counters.
type BackendCounters struct {
	Name string
	Counters
}

// FarmCounters are a farm's counters (its own, which include what its
// backends counted) and its backends', in the farm's order.
type FarmCounters struct {
	Counters
	Backends []BackendCounters
}

// CounterReader is implemented by data planes that count traffic per farm
// and backend.
type CounterReader interface {
	// Counters reads the farm's counters from the kernel.
	Counters(ctx context.Context, f *model.Farm) (FarmCounters, error)
}

// StaleFlow names the tracked UDP flows to VIP:Port that were sent to
// Backend, a backend that went away.
type StaleFlow struct {
	VIP     netip.Addr
	Port    uint16
	Backend netip.Addr
}

// FlowFlusher is implemented by data planes that can forget tracked flows
// (both do: nft in netfilter's conntrack of its namespace, eBPF in its own
// table). A configuration change never cuts tracked flows by itself; this
// is for a caller that knows a backend is gone for good: the Kubernetes
// proxy, when an endpoint goes away, because a UDP client that keeps its
// source port would otherwise stay on the dead endpoint until its flow
// idles out (kube-proxy's long-standing UDP black-hole bug).
type FlowFlusher interface {
	// DeleteUDPFlows deletes the tracked UDP flows of flows, so the next
	// datagram of each is scheduled afresh, and returns how many it
	// deleted.
	DeleteUDPFlows(ctx context.Context, flows []StaleFlow) (int, error)
}
