package ebpf

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cilium/ebpf"
)

// The program's conntrack clock is jiffies * tick + offset, equal to
// CLOCK_MONOTONIC_COARSE (see "The conntrack clock" in bpf/xlb_lb.c: the
// coarse-clock helper costs a fifth of a conntrack hit here, the inlined
// jiffies read almost nothing). The kernel's tick length (CONFIG_HZ) is not
// something the program can read, and /proc/config.gz is not everywhere, so
// the loader measures it: jiffies and the coarse clock both move at a tick,
// so over a few ticks their ratio is the tick length.

// clockTicks is how many ticks calibrateClock watches: enough that one
// sample taken between the jiffies and the clock update of a tick (a
// microsecond window) cannot move the estimate to another HZ. 10 ms at
// HZ=1000, 40 ms at HZ=250.
const clockTicks = 10

// knownHZ are the CONFIG_HZ values Linux offers (x86: 100, 250, 300, 1000;
// other architectures add the rest). A measured tick must be within
// hzTolerance of one of them.
var knownHZ = []uint64{24, 32, 48, 64, 100, 128, 200, 250, 256, 300, 500, 1000, 1024, 1200}

const hzTolerance = 0.05

type clockSample struct{ jiffies, coarse uint64 }

// calibrateClock measures the tick and sets xlb_clock_offset, then
// xlb_clock_tick_ns (the program reads the tick first and uses the offset
// only once the tick is set). On error the program keeps calling the
// coarse-clock helper: slower, not wrong.
//
// It tries up to three times: on a loaded VM a measurement can be a tick
// or more off (jiffies catching up after missed ticks), which once made a
// CI run measure 4.4 ms for a 4 ms tick; a second try a few tens of
// milliseconds later measures it right.
func (p *Plane) calibrateClock() error {
	var errs []error
	for range 3 {
		err := p.calibrateClockOnce()
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// calibrateClockOnce is one measurement of calibrateClock.
func (p *Plane) calibrateClockOnce() error {
	first, err := p.sampleClock()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Second)
	last := first
	for last.jiffies-first.jiffies < clockTicks {
		if time.Now().After(deadline) {
			return fmt.Errorf("jiffies moved %d ticks in a second, want %d", last.jiffies-first.jiffies, clockTicks)
		}
		time.Sleep(time.Millisecond)
		if last, err = p.sampleClock(); err != nil {
			return err
		}
	}
	tick := float64(last.coarse-first.coarse) / float64(last.jiffies-first.jiffies)
	hz, ok := nearestHZ(tick)
	if !ok {
		return fmt.Errorf("measured tick %.0f ns is no kernel's CONFIG_HZ", tick)
	}
	tickNs := (uint64(time.Second) + hz/2) / hz // the kernel's TICK_NSEC
	// The offset from a few samples, the largest: a sample read between a
	// tick's jiffies and clock updates sees the clock a tick behind.
	offset := last.coarse - last.jiffies*tickNs
	for range 3 {
		time.Sleep(time.Millisecond)
		s, err := p.sampleClock()
		if err != nil {
			return err
		}
		if o := s.coarse - s.jiffies*tickNs; int64(o-offset) > 0 {
			offset = o
		}
	}
	if err := p.objs.XlbClockOffset.Set(offset); err != nil {
		return fmt.Errorf("set clock offset: %w", err)
	}
	if err := p.objs.XlbClockTickNs.Set(tickNs); err != nil {
		return fmt.Errorf("set clock tick: %w", err)
	}
	p.log.Debug("conntrack clock calibrated", "hz", hz, "tick_ns", tickNs)
	return nil
}

// nearestHZ returns the known HZ whose tick is closest to tick ns.
func nearestHZ(tick float64) (uint64, bool) {
	if tick <= 0 {
		return 0, false
	}
	measured := float64(time.Second) / tick
	best := knownHZ[0]
	for _, hz := range knownHZ {
		if math.Abs(float64(hz)-measured) < math.Abs(float64(best)-measured) {
			best = hz
		}
	}
	return best, math.Abs(float64(best)-measured) <= hzTolerance*float64(best)
}

// sampleClock runs xlb_clock until one run saw no tick between its two
// jiffies reads.
func (p *Plane) sampleClock() (clockSample, error) {
	pkt := make([]byte, 14) // a tc test run needs at least an Ethernet header
	for range 10 {
		if _, err := p.objs.XlbClock.Run(&ebpf.RunOptions{Data: pkt}); err != nil {
			return clockSample{}, fmt.Errorf("run xlb_clock: %w", err)
		}
		var s [4]uint64
		if err := p.objs.XlbClockSample.Get(&s); err != nil {
			return clockSample{}, fmt.Errorf("read xlb_clock_sample: %w", err)
		}
		if s[0] == s[2] {
			return clockSample{jiffies: s[0], coarse: s[1]}, nil
		}
	}
	return clockSample{}, errors.New("jiffies moved during every run of xlb_clock")
}
