package dataplane

import "context"

// PassiveReader is an optional capability: a data plane that watches the
// handshakes of the TCP connections it forwards to the backends of farms
// whose check has "passive" set (model.PassiveCheck), for passive health
// checks. The eBPF plane does, from its own conntrack; the nft plane from
// netfilter's conntrack events (internal/conntrack.Passive).
type PassiveReader interface {
	// PassiveCounts counts the handshakes that went unanswered past
	// their farm's timeout, then returns the counts of every watched
	// backend.
	PassiveCounts(ctx context.Context) ([]PassiveCount, error)
	// ResetPassive starts a backend's consecutive failures afresh (a
	// backend back from an ejection); failures of connections sent
	// before do not count.
	ResetPassive(ctx context.Context, farm, backend string) error
}

// PassiveCount is what a plane saw of one watched backend's handshakes.
// The totals count from when the plane started watching the backend.
type PassiveCount struct {
	Farm, Backend string
	// Consecutive is the failures since the last success (or reset).
	Consecutive uint32
	Successes   uint64 // SYN-ACK within the timeout
	Resets      uint64 // RST from the backend before establishment
	Unreachable uint64 // ICMP unreachable about the SYN
	Slow        uint64 // SYN-ACK later than the timeout
	Timeouts    uint64 // no answer within the timeout
}

// Failures is the total of every kind of failure.
func (c PassiveCount) Failures() uint64 { return c.Resets + c.Unreachable + c.Slow + c.Timeouts }
