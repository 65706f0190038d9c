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
//
// A slot is an array of entries, not a linked list of targets, and a
// target is removed lazily (its generation moves on; the entry is
// dropped when its slot is next taken): at 10,000 targets checked every
// second none is in the CPU's cache when its check comes, and a doubly
// linked list made every add and remove write to two other targets (its
// neighbours), eight cache misses a half-open check (its next check's
// add and take, its timeout's add and remove), which with the target's
// own were most of the scheduler's CPU in a profile
// (bench/results/health-cpu.md). Appending to a slot writes to the slot's
// array only, removing to the target only.
// Callers hold the monitor's lock.
type wheel struct {
	base  time.Time // time of tick 0
	cur   int64     // the first tick not taken yet
	n     int       // targets on the wheel (live entries)
	slots [wheelSlots][]wentry
	full  [wheelSlots / 64]uint64 // slots with entries (live or not)
	due   []*target               // scratch of take
}

// wentry is a target on a slot, live while the target's generation is
// still gen.
type wentry struct {
	t   *target
	gen uint32
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
	w.remove(t)
	k := w.tick(at)
	if early < 0 {
		k++
		early = 0
	}
	k = max(k, w.cur)
	t.wtick, t.wearly = k, early
	t.wgen++
	s := int(k & (wheelSlots - 1))
	if len(w.slots[s]) == 0 {
		w.full[s/64] |= 1 << (s % 64)
	}
	w.slots[s] = append(w.slots[s], wentry{t, t.wgen})
	t.inWheel = true
	w.n++
}

// remove takes t off the wheel if it is on it (its entry is dropped when
// its slot is taken).
func (w *wheel) remove(t *target) {
	if !t.inWheel {
		return
	}
	t.inWheel = false
	t.wgen++
	w.n--
}

// takeSlot takes off slot k's live targets of tick k that ok allows into
// w.due, and drops its dead entries.
func (w *wheel) takeSlot(k int64, ok func(*target) bool) {
	s := int(k & (wheelSlots - 1))
	es := w.slots[s]
	j := 0
	for _, e := range es {
		t := e.t
		switch {
		case !t.inWheel || t.wgen != e.gen:
			// removed, or added again elsewhere
		case t.wtick == k && ok(t):
			w.remove(t)
			w.due = append(w.due, t)
		default:
			es[j] = e
			j++
		}
	}
	clear(es[j:])
	w.slots[s] = es[:j]
	if j == 0 {
		w.full[s/64] &^= 1 << (s % 64)
	}
}

// give calls fn on the targets takeSlot took. fn may add targets back.
func (w *wheel) give(fn func(*target)) {
	for i, t := range w.due {
		w.due[i] = nil
		fn(t)
	}
	w.due = w.due[:0]
}

func anyTarget(*target) bool { return true }

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
		w.takeSlot(k, func(t *target) bool { return t.wearly >= ahead })
		w.give(fn)
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
		// Take this tick's targets off first: fn may add to the slot.
		w.takeSlot(k, anyTarget)
		w.cur = k + 1
		w.give(fn)
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
