package health

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The wheel gives back every target once, never earlier than allowed (a
// check: up to a tick and its early before its time; a timeout: after its
// time), across turns, with removals.
func TestWheel(t *testing.T) {
	base := time.Unix(1_000_000, 0)
	w := newWheel(base)
	rnd := rand.New(rand.NewPCG(1, 2))
	type want struct {
		at    time.Time
		early bool
	}
	wants := map[*target]want{}
	var all []*target
	for i := range 5000 {
		tg := &target{}
		// Times over three turns of the wheel, some at the same tick.
		at := base.Add(time.Duration(rnd.Int64N(int64(3 * wheelSlots * wheelTick))))
		if i%7 == 0 {
			at = base.Add(1234 * wheelTick)
		}
		early := i%2 == 0
		e := time.Duration(-1)
		if early {
			e = time.Duration(i%4) * wheelTick // 0 or 2 ticks
		}
		w.add(tg, at, e)
		wants[tg] = want{at, early}
		all = append(all, tg)
	}
	// Remove every tenth.
	for i := 0; i < len(all); i += 10 {
		w.remove(all[i])
		w.remove(all[i]) // twice: no effect
		delete(wants, all[i])
	}
	if w.n != len(wants) {
		t.Fatalf("wheel holds %d, want %d", w.n, len(wants))
	}
	got := map[*target]time.Time{}
	now := base
	for steps := 0; w.n > 0; steps++ {
		if steps > 100000 {
			t.Fatal("wheel never empties")
		}
		d, ok := w.next(now)
		if !ok {
			t.Fatal("next: empty wheel with targets on it")
		}
		now = now.Add(max(d, time.Duration(rnd.Int64N(int64(3*wheelTick)))))
		w.take(now, 3*wheelTick, func(tg *target) {
			if _, dup := got[tg]; dup {
				t.Fatal("a target given back twice")
			}
			got[tg] = now
		})
	}
	if len(got) != len(wants) {
		t.Fatalf("%d targets given back, want %d", len(got), len(wants))
	}
	for tg, wt := range wants {
		at, ok := got[tg]
		if !ok {
			t.Fatal("a target never given back")
		}
		if wt.early && at.Before(wt.at.Add(-wheelTick-tg.wearly)) {
			t.Errorf("check due %v, early %v, given back at %v: more than a tick and its early early", wt.at.Sub(base), tg.wearly, at.Sub(base))
		}
		if !wt.early && !at.After(wt.at) {
			t.Errorf("timeout due %v given back at %v: not after it", wt.at.Sub(base), at.Sub(base))
		}
	}
}

// A target added back from take's callback, for a time already past, is
// taken in the same call's next tick, not lost; one added in the past
// between takes is due within a tick; and an idle wheel jumps over hours
// at once.
func TestWheelReAddAndIdle(t *testing.T) {
	base := time.Unix(1_000_000, 0)
	w := newWheel(base)
	tg := &target{}
	w.add(tg, base.Add(5*wheelTick), 0)
	n := 0
	w.take(base.Add(10*wheelTick), 0, func(x *target) {
		if n++; n == 1 {
			w.add(x, base, 0) // in the past
		}
	})
	if n != 2 {
		t.Fatalf("taken %d times, want 2 (the re-add in the past taken in the same call)", n)
	}
	if _, ok := w.next(base); ok {
		t.Fatal("next on an empty wheel")
	}
	later := base.Add(5 * time.Hour)
	w.take(later, 0, func(*target) { t.Fatal("empty wheel gave a target") })
	w.add(tg, later.Add(-time.Second), 0)
	if d, ok := w.next(later); !ok || d > wheelTick {
		t.Fatalf("next = %v, %v; want at most a tick for a target in the past", d, ok)
	}
	w.add(&target{}, later.Add(time.Hour), 0)
	if d, _ := w.next(later); d > wheelTick {
		t.Fatalf("next = %v with one due", d)
	}
	if d, _ := w.next(later.Add(time.Second)); d != 0 {
		t.Fatalf("next = %v a second later: want 0", d)
	}
}

// take's window starts checks due soon together, within each one's early;
// a timeout is never taken early.
func TestWheelWindow(t *testing.T) {
	base := time.Unix(1_000_000, 0)
	w := newWheel(base)
	now, soon, late, timeout := &target{}, &target{}, &target{}, &target{}
	w.add(now, base, 5*wheelTick)
	w.add(soon, base.Add(3*wheelTick), 5*wheelTick)
	w.add(late, base.Add(3*wheelTick), wheelTick) // may start 1 tick early only
	w.add(timeout, base.Add(2*wheelTick), -1)
	got := map[*target]bool{}
	w.take(base, 5*wheelTick, func(x *target) { got[x] = true })
	if !got[now] || !got[soon] || got[late] || got[timeout] || len(got) != 2 {
		t.Fatalf("taken now %v, soon %v, late %v, timeout %v; want now and soon only", got[now], got[soon], got[late], got[timeout])
	}
	w.take(base.Add(2*wheelTick), 5*wheelTick, func(x *target) { got[x] = true })
	if !got[late] || got[timeout] {
		t.Fatalf("at tick 2: late %v, timeout %v; want late only", got[late], got[timeout])
	}
	w.take(base.Add(3*wheelTick), 5*wheelTick, func(x *target) { got[x] = true })
	if !got[timeout] || w.n != 0 {
		t.Fatalf("at tick 3: timeout %v, %d left", got[timeout], w.n)
	}
}

// BenchmarkWheelHalfOpen runs the scheduler's part of 10,000 half-open
// checks every second (inter 1 s less up to 10 %, timeout 500 ms, every
// answer in before the next wake-up) in simulated time, as the monitor's
// loop drives the wheel: take what is due within the batch window, add
// each one's timeout, remove it when its answer comes, add its next
// check. An op is one check; wakes/s is the loop's wake-ups. Every
// wake-up starts with the CPU's cache flushed (outside the timing), as
// in the daemon. About 270 ns a check here (0.003 core at 10,000 a
// second); timeouts kept apart, so that a dead one is never read (stop
// 28, reverted), measured no faster (bench/results/health-cpu.md).
func BenchmarkWheelHalfOpen(b *testing.B) {
	const (
		n       = 10000
		inter   = time.Second
		timeout = 500 * time.Millisecond
		batch   = 20 * time.Millisecond
	)
	base := time.Unix(1_000_000, 0)
	w := newWheel(base)
	rnd := rand.New(rand.NewPCG(1, 2))
	ts := make([]*target, n)
	for i := range ts {
		ts[i] = &target{}
		w.add(ts[i], base.Add(time.Duration(rnd.Int64N(int64(inter)))), batch)
	}
	// Other work between wake-ups (the answers, the system calls, other
	// processes) leaves no target in the CPU's cache, as in the daemon.
	evict := make([]byte, 16<<20)
	now := base
	var taken []*target
	wakes, checks := 0, 0
	b.ResetTimer()
	for checks < b.N {
		wakes++
		b.StopTimer()
		for i := 0; i < len(evict); i += 64 {
			evict[i]++
		}
		b.StartTimer()
		taken = taken[:0]
		w.take(now, batch, func(t *target) {
			w.add(t, now.Add(timeout), -1)
			taken = append(taken, t)
		})
		for _, t := range taken {
			w.remove(t)
			iv := inter - time.Duration(rnd.Float64()*0.1*float64(inter))
			w.add(t, now.Add(iv), min(batch, iv/10))
		}
		checks += len(taken)
		d, _ := w.next(now)
		now = now.Add(max(d, 50*time.Microsecond))
	}
	b.StopTimer()
	b.ReportMetric(float64(wakes)/now.Sub(base).Seconds(), "wakes/s")
}
