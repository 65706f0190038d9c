package health

import (
	"math/bits"
	"time"
)

// wheel holds every scheduled target by the time it is next due: its next
// check, or the timeout of a half-open check in flight. It is a hashed
// timing wheel (Varghese and Lauck): wheelSlots slots of wheelTick each,
// a target in the slot of its tick modulo the wheel, its absolute tick
// kept to tell this turn's from a later turn's. Adding, removing and
// taking a due target are O(1); a heap of 10,000 targets cost a dozen
// time comparisons per operation, 1.3 % of a check's CPU in a profile.
// Callers hold the monitor's lock.
type wheel struct {
	base  time.Time // time of tick 0
	cur   int64     // the first tick not taken yet
	n     int
	slots [wheelSlots]*target // circular doubly linked lists (wnext, wprev)
	full  [wheelSlots / 64]uint64
}

const (
	wheelTick  = time.Millisecond
	wheelSlots = 4096 // a power of two: 4.096 s a turn
)

func newWheel(now time.Time) *wheel { return &wheel{base: now} }

// tick is the tick of time at: the one whose span holds it.
func (w *wheel) tick(at time.Time) int64 { return int64(at.Sub(w.base) / wheelTick) }

// add schedules t at time at. With early >= 0 (a check; intervals are
// only ever shortened) it goes in the tick that holds at, so it is taken
// up to a tick early, and take may take it up to early before that tick
// with others; with early < 0 (a timeout) in the tick after, so it is
// taken late, never early. A time already past is due at the first tick
// not yet taken: within a tick.
func (w *wheel) add(t *target, at time.Time, early time.Duration) {
	k := w.tick(at)
	if early < 0 {
		k++
		early = 0
	}
	k = max(k, w.cur)
	t.wtick, t.wearly = k, early
	s := int(k & (wheelSlots - 1))
	if h := w.slots[s]; h == nil {
		t.wnext, t.wprev = t, t
		w.slots[s] = t
		w.full[s/64] |= 1 << (s % 64)
	} else {
		t.wnext, t.wprev = h, h.wprev
		h.wprev.wnext = t
		h.wprev = t
	}
	t.inWheel = true
	w.n++
}

// remove takes t off the wheel if it is on it.
func (w *wheel) remove(t *target) {
	if !t.inWheel {
		return
	}
	s := int(t.wtick & (wheelSlots - 1))
	if t.wnext == t {
		w.slots[s] = nil
		w.full[s/64] &^= 1 << (s % 64)
	} else {
		t.wprev.wnext = t.wnext
		t.wnext.wprev = t.wprev
		if w.slots[s] == t {
			w.slots[s] = t.wnext
		}
	}
	t.wnext, t.wprev, t.inWheel = nil, nil, false
	w.n--
}

// take removes every target due by now (its tick begun) and calls fn on
// each, in the order of their ticks; then those due within window whose
// early allows it (so that checks due close together start together: one
// wake-up, one system call). fn may add targets back (at a later tick).
func (w *wheel) take(now time.Time, window time.Duration, fn func(*target)) {
	w.takeDue(now, fn)
	if window <= 0 || w.n == 0 {
		return
	}
	last := w.tick(now.Add(window))
	for k := w.cur; k <= last; k++ {
		var ok bool
		if k, ok = w.nextFull(k, last); !ok {
			return
		}
		ahead := w.base.Add(time.Duration(k) * wheelTick).Sub(now)
		s := int(k & (wheelSlots - 1))
		var due *target
		if h := w.slots[s]; h != nil {
			n := 1
			for t := h.wnext; t != h; t = t.wnext {
				n++
			}
			for t := h; n > 0; n-- {
				next := t.wnext
				if t.wtick == k && t.wearly >= ahead {
					w.remove(t)
					t.wnext, due = due, t
				}
				t = next
			}
		}
		for due != nil {
			t := due
			due = t.wnext
			t.wnext = nil
			fn(t)
		}
	}
}

// takeDue takes every target due by now.
func (w *wheel) takeDue(now time.Time, fn func(*target)) {
	end := w.tick(now) // the last tick to take
	for w.cur <= end {
		if w.n == 0 {
			w.cur = end + 1
			return
		}
		// Skip empty slots, a word of the bitmap at a time.
		k, ok := w.nextFull(w.cur, end)
		if !ok {
			w.cur = end + 1
			return
		}
		w.cur = k
		s := int(k & (wheelSlots - 1))
		// Detach this tick's targets first: fn may add to the slot.
		var due *target
		if h := w.slots[s]; h != nil {
			n := 1
			for t := h.wnext; t != h; t = t.wnext {
				n++
			}
			for t := h; n > 0; n-- {
				next := t.wnext
				if t.wtick == k {
					w.remove(t)
					t.wnext, due = due, t // a stack: order within a tick does not matter
				}
				t = next
			}
		}
		w.cur = k + 1
		for due != nil {
			t := due
			due = t.wnext
			t.wnext = nil
			fn(t)
		}
	}
}

// nextFull returns the first tick from k to end (inclusive) whose slot
// holds a target (of this turn or another).
func (w *wheel) nextFull(k, end int64) (int64, bool) {
	for k <= end {
		s := int(k & (wheelSlots - 1))
		word := w.full[s/64] >> (s % 64)
		if word != 0 {
			k += int64(bits.TrailingZeros64(word))
			return k, k <= end
		}
		k += int64(64 - s%64)
	}
	return 0, false
}

// next returns how long from now until the first target is due (0: one is
// due already), and false when the wheel is empty.
func (w *wheel) next(now time.Time) (time.Duration, bool) {
	if w.n == 0 {
		return 0, false
	}
	// The first full slot from cur, within one turn; its targets may be
	// of a later turn, which only makes the loop wake early once a turn.
	k, ok := w.nextFull(w.cur, w.cur+wheelSlots-1)
	if !ok {
		return wheelSlots * wheelTick, true
	}
	// A target in that slot is due at k in this turn, or in a later
	// turn; then the loop wakes early, once a turn.
	d := w.base.Add(time.Duration(k) * wheelTick).Sub(now)
	return max(d, 0), true
}
