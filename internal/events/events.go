// Package events carries the daemon's events (health transitions, quorum
// changes, flushed connections) from where they happen to whoever streams
// them (GET /events, xlb events). Publishing never blocks: a subscriber
// that falls behind loses events and is told how many.
package events

import (
	"sync"
	"time"
)

// Kinds of events.
const (
	KindHealth = "health" // a backend went up or down (State, Reason)
	KindWeight = "weight" // a backend's effective weight changed without a transition (warm-up, agent, exec)
	KindQuorum = "quorum" // a farm lost or regained its quorum (State "lost" or "regained")
	KindFlush  = "flush"  // a down backend's connections were flushed (Count)
)

// Event is one thing that happened.
type Event struct {
	ID      uint64    `json:"id"`
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Farm    string    `json:"farm"`
	Backend string    `json:"backend,omitempty"`
	State   string    `json:"state,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	Weight  *uint32   `json:"weight,omitempty"` // effective weight after the event
	Count   *int      `json:"count,omitempty"`  // flushed connections
}

// Broker fans events out to subscribers and keeps the last ones, so a
// client that reconnects with Last-Event-ID misses nothing still held.
type Broker struct {
	mu     sync.Mutex
	nextID uint64
	ring   []Event // the last cap(ring) events, oldest first once full
	start  int
	subs   map[*Sub]struct{}
}

// DefaultKeep is how many past events a broker keeps.
const DefaultKeep = 1024

// NewBroker returns a broker that keeps the last keep events.
func NewBroker(keep int) *Broker {
	return &Broker{ring: make([]Event, 0, max(keep, 1)), subs: map[*Sub]struct{}{}, nextID: 1}
}

// Sub is one subscription.
type Sub struct {
	C       chan Event
	mu      sync.Mutex
	dropped uint64
}

// Dropped returns and resets the number of events lost since the last
// call because the subscriber was slow.
func (s *Sub) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.dropped
	s.dropped = 0
	return n
}

// Publish stamps ev with an id and the time (if unset) and delivers it.
func (b *Broker) Publish(ev Event) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ev.ID = b.nextID
	b.nextID++
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if len(b.ring) < cap(b.ring) {
		b.ring = append(b.ring, ev)
	} else {
		b.ring[b.start] = ev
		b.start = (b.start + 1) % len(b.ring)
	}
	for s := range b.subs {
		select {
		case s.C <- ev:
		default:
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
		}
	}
}

// Subscribe returns a subscription that first holds the kept events with
// an id above after (0: none of them), then every new one. buffer bounds
// what a slow reader may fall behind by. Cancel it when done.
func (b *Broker) Subscribe(after uint64, buffer int) *Sub {
	b.mu.Lock()
	defer b.mu.Unlock()
	var past []Event
	for i := range b.ring {
		ev := b.ring[(b.start+i)%len(b.ring)]
		if after != 0 && ev.ID > after {
			past = append(past, ev)
		}
	}
	s := &Sub{C: make(chan Event, max(buffer, len(past)+1))}
	for _, ev := range past {
		s.C <- ev
	}
	b.subs[s] = struct{}{}
	return s
}

// Cancel ends a subscription.
func (b *Broker) Cancel(s *Sub) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
}

// Recent returns the kept events, oldest first.
func (b *Broker) Recent() []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Event, 0, len(b.ring))
	for i := range b.ring {
		out = append(out, b.ring[(b.start+i)%len(b.ring)])
	}
	return out
}
