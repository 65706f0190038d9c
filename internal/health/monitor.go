// Package health runs xlb's active health checks: tcp, http, https, udp,
// exec and HAProxy's agent check, as the farms' "check" objects configure
// them (internal/model/check.go).
//
// One Monitor schedules every check from one goroutine and a timing wheel
// (wheel.go). Each interval is shortened by a random share (Options.Spread) and every
// backend's first check falls at a random point of its first interval, so
// 10,000 checks never fire together. Half-open tcp checks of IPv4
// backends are sent in batches, the SYNs of a tick in one system call, and
// their answers come back in batches from one reader (synprobe.go); every
// other check runs in a goroutine of its own (at most Options.MaxInFlight
// at once) and reports back to the scheduler. The scheduler counts consecutive results (rise, fall: consecutive,
// not a count of all failures) and, on a transition or a change of weight,
// hands the engine a health update. Updates are batched: a burst of
// transitions becomes one data plane change.
//
// The monitor never changes configuration: the engine keeps health apart
// from the desired state and gives the data plane the effective farms.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// Options configure a Monitor.
type Options struct {
	// NetNS is the network namespace the checks' sockets are made in;
	// zero or netns.None(): the daemon's own (the LB's when it runs there).
	NetNS netns.NsHandle
	// Spread is the share of each interval taken off at random (default
	// 0.1): checks of many backends drift apart rather than fire together,
	// and no interval is ever longer than configured, so detection stays
	// within fall × inter + timeout.
	Spread float64
	// MaxInFlight bounds the checks running at once (default 4096).
	MaxInFlight int
	// Batch: checks due within this much of each other start together
	// (one wake-up of the scheduler; half-open ones in one system call):
	// a check may start up to Batch early, at most a tenth of its
	// interval early. While checks are in flight their answers are read
	// at least every Batch (each is stamped on arrival: reading later
	// only delays its result; timeouts are taken on time). Default 20ms:
	// at 10,000 checks a second the scheduler wakes about 1/Batch times
	// a second, and each wake-up costs the Go runtime's and the kernel's
	// scheduling, about a fifth of the daemon's CPU at 5ms
	// (bench/results/health-cpu.md).
	Batch time.Duration
	// HalfOpenRaw runs half-open checks on the raw socket alone, without
	// the bypass around the IP stack (synbypass.go): the engine an
	// interface or namespace where the receive program cannot run gets.
	// Tests use it to run that fallback.
	HalfOpenRaw bool
	// Observe, when set, is told of every check's result with its
	// check type (metrics). It is called with the monitor's lock held:
	// it must be quick and must not call the monitor.
	Observe func(typ model.CheckType, r Result)
}

// Sink takes health updates: the engine.
type Sink interface {
	SetHealth(ctx context.Context, updates []engine.HealthUpdate) error
}

// Monitor schedules and runs the checks of every checked backend.
type Monitor struct {
	log  *slog.Logger
	sink Sink
	opts Options
	d    dialer

	mu      sync.Mutex
	farms   map[string]*model.Farm
	targets map[tkey]*target
	wheel   *wheel
	// syn: the half-open checks' engine, opened at the first such check
	// (nil, with synTried, when it cannot be: those checks connect).
	syn      *synEngine
	synTried bool
	// running: Run has started and not returned. A half-open engine is
	// opened only then (Sync before Run sets wantSyn and Run opens it),
	// so a monitor that is synced and never run holds nothing of it: Run's
	// end is what closes it.
	running bool
	wantSyn bool
	// conn: plain connect checks' engine (connprobe.go), likewise.
	conn      *connEngine
	connTried bool
	ramping   map[*target]struct{}
	pending   map[tkey]engine.HealthUpdate
	rnd       *rand.Rand
	checks    uint64
	fails     uint64
	spawned   uint64 // checks run in a goroutine of their own
	// halfConns: half-open checks that connected, the engine busy or
	// not open.
	halfConns uint64

	wake     chan struct{}
	pendWake chan struct{}
	done     chan finished
	sem      chan struct{}
}

type tkey struct{ farm, backend string }

// target is one checked backend and its state.
//
// The fields a check reads and writes come first, with the check's
// timing (model.Check's first fields) right after them: at 10,000
// targets checked every second none is in the CPU's cache when its check
// comes, and the scheduler's CPU was mostly cache misses on targets and
// their probes (bench/results/health-cpu.md), so a check touches a few
// adjacent cache lines of its target and nothing else of it.
type target struct {
	// On the wheel (wheel.go): at its next check, or while a check is
	// in flight (waiting), at that check's timeout.
	wtick    int64
	wearly   time.Duration // how early take may take it
	wgen     uint32        // the wheel's entry for it is live at this generation
	inWheel  bool
	waiting  bool
	up       bool
	running  bool
	removed  bool
	checked  bool
	half     bool   // probe.batchable(): a half-open check the monitor batches
	streak   uint32 // consecutive results against the state
	synToken uint32 // a half-open check's
	connFD   int32  // a connect check's socket; -1: none
	checks   uint64
	fails    uint64
	synStart time.Time // when the check in flight started
	next     time.Time
	dst      netip.AddrPort // probe.dst
	probe    *probe
	check    model.Check
	last     Result

	tkey
	key      string // model.Farm.CheckKey: what was checked
	percent  int32  // agent; -1: not said (100)
	weight   int32  // exec "weight N"; -1: not said
	ramp     uint32
	rampFrom time.Time
}

type finished struct {
	t *target
	r Result
}

// New returns a monitor that reports to sink. Run starts it.
func New(log *slog.Logger, sink Sink, opts Options) *Monitor {
	if opts.Spread <= 0 || opts.Spread >= 1 {
		opts.Spread = 0.1
	}
	if opts.Batch <= 0 {
		opts.Batch = 20 * time.Millisecond
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 4096
	}
	return &Monitor{
		log: log, sink: sink, opts: opts, d: dialer{ns: opts.NetNS, log: log, rawOnly: opts.HalfOpenRaw},
		farms: map[string]*model.Farm{}, targets: map[tkey]*target{}, wheel: newWheel(time.Now()), ramping: map[*target]struct{}{},
		pending: map[tkey]engine.HealthUpdate{}, rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		wake: make(chan struct{}, 1), pendWake: make(chan struct{}, 1),
		done: make(chan finished, 1024), sem: make(chan struct{}, opts.MaxInFlight),
	}
}

// Run schedules checks and reports their results until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	m.mu.Lock()
	m.running = true
	if m.wantSyn && !m.synTried {
		m.synEngine()
		// The first checks at random points of their first interval
		// from now, as Sync places them when the monitor runs: those
		// due while the engine opened would fire at once otherwise.
		now := time.Now()
		for _, t := range m.targets {
			if t.inWheel && !t.checked && !t.running {
				t.next = now.Add(time.Duration(m.rnd.Int64N(int64(t.check.Inter))))
				m.wheel.add(t, t.next, m.early(t.check.Inter))
			}
		}
	}
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.running = false
		m.mu.Unlock()
		m.d.close()
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.report(ctx)
	}()
	m.loop(ctx)
	wg.Wait()
}

// Watch keeps the monitor's targets equal to the engine's checked
// backends until ctx ends.
func (m *Monitor) Watch(ctx context.Context, eng *engine.Engine) {
	ch := make(chan *engine.State, 1)
	eng.Subscribe(ch)
	m.Sync(eng.Snapshot().Farms())
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			// The latest state, not the one received: a send the channel
			// had no room for was dropped.
			m.Sync(eng.Snapshot().Farms())
		}
	}
}

// Sync makes the targets those of farms: new checked backends start (up,
// as keepalived's do), changed ones start afresh, removed ones stop.
// Farms are compared by pointer (the engine's are immutable), so a sync
// costs in proportion to the farms that changed.
func (m *Monitor) Sync(farms []*model.Farm) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	seen := make(map[string]struct{}, len(farms))
	for _, f := range farms {
		seen[f.Name] = struct{}{}
		old := m.farms[f.Name]
		if old == f {
			continue
		}
		now = m.syncFarm(old, f, now)
		m.farms[f.Name] = f
	}
	if len(seen) != len(m.farms) {
		for name, f := range m.farms {
			if _, ok := seen[name]; !ok {
				m.syncFarm(f, nil, now)
				delete(m.farms, name)
			}
		}
	}
	m.poke()
}

// syncFarm returns now, or a later time if it took a while (the
// half-open engine opened).
func (m *Monitor) syncFarm(old, nw *model.Farm, now time.Time) time.Time {
	if old != nil {
		for i := range old.Backends {
			b := &old.Backends[i]
			if nw != nil {
				if nb, _ := nw.Backend(b.Name); nb != nil {
					continue
				}
			}
			if t := m.targets[tkey{old.Name, b.Name}]; t != nil {
				m.remove(t)
			}
		}
	}
	if nw == nil {
		return now
	}
	for i := range nw.Backends {
		k := tkey{nw.Name, nw.Backends[i].Name}
		cur := m.targets[k]
		c, ok := nw.Resolve(i)
		if !ok {
			if cur != nil {
				m.remove(cur)
			}
			continue
		}
		key := nw.CheckKey(i, &c)
		if cur != nil && cur.key == key {
			continue
		}
		if cur != nil {
			m.remove(cur)
		}
		p, err := compile(nw, i, c)
		if err != nil {
			// Validation compiled it already; this is a bug.
			m.log.Error("compile health check", "farm", nw.Name, "backend", k.backend, "err", err)
			continue
		}
		if p.batchable() && !m.synTried {
			// Open the half-open engine now (or, before Run, when it
			// starts), not at the first check: loading its receive
			// program takes milliseconds (tens on a busy machine),
			// which in the scheduler's loop would make the checks due
			// meanwhile fire at once, more to one backend than it has
			// source ports.
			m.wantSyn = true
			if m.running {
				m.synEngine()
				now = time.Now()
			}
		}
		t := &target{tkey: k, key: key, check: c, probe: p, half: p.batchable(), dst: p.dst, up: c.InitState != model.InitDown, percent: -1, weight: -1, ramp: 1000, connFD: -1}
		if !t.up {
			// init-state down: out until rise passes.
			m.emit(t, "init-state down: not checked yet")
		}
		// The first check at a random point of the first interval.
		t.next = now.Add(time.Duration(m.rnd.Int64N(int64(c.Inter))))
		m.targets[k] = t
		m.wheel.add(t, t.next, m.early(c.Inter))
	}
	return now
}

func (m *Monitor) remove(t *target) {
	t.removed = true
	m.wheel.remove(t)
	m.giveUp(t)
	delete(m.targets, t.tkey)
	delete(m.ramping, t)
}

func (m *Monitor) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// loop is the scheduler: it starts the checks that are due, sends the
// half-open ones' SYNs, and takes in the results.
func (m *Monitor) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var answers []synAnswer
	var conns []connDone
	defer func() {
		m.mu.Lock()
		if m.conn != nil {
			m.conn.close()
		}
		m.mu.Unlock()
	}()
	for {
		m.mu.Lock()
		now := time.Now()
		if m.conn != nil {
			conns = m.conn.poll(conns[:0])
			m.connsDone(conns)
		}
		if m.syn != nil {
			// The replies that came since the last wake, before any
			// timeout is taken for their check.
			answers = m.syn.takeAnswers(answers[:0])
			m.synAnswers(answers)
		}
		m.wheel.take(now, m.opts.Batch, func(t *target) { m.due(ctx, t, now) })
		syn := m.syn
		m.mu.Unlock()
		if syn != nil && syn.queued() > 0 {
			// The SYNs of the checks due, in one system call (or a
			// few); on a veth or loopback their replies are there when
			// it returns.
			syn.flush()
			answers = syn.takeAnswers(append(answers[:0], syn.takeFailed()...))
		}
		m.mu.Lock()
		if len(answers) > 0 {
			m.synAnswers(answers)
			now = time.Now()
		}
		if m.conn != nil {
			// On a veth or loopback most connects are done already.
			if conns = m.conn.poll(conns[:0]); len(conns) > 0 {
				m.connsDone(conns)
				now = time.Now()
			}
		}
		wait, ok := m.wheel.next(now)
		if !ok {
			wait = time.Hour
		}
		if w := m.stepRamps(now); w > 0 && w < wait {
			wait = w
		}
		if wait > m.opts.Batch && (syn != nil && syn.inFlight() > 0 || m.conn != nil && len(m.conn.inFly) > 0) {
			wait = m.opts.Batch // read the answers at least that often
		}
		m.mu.Unlock()
		clear(answers)
		clear(conns)
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-m.wake:
		case f := <-m.done:
			m.mu.Lock()
			m.finish(f)
			// Take in what else has finished, under one lock.
			for more := true; more; {
				select {
				case f := <-m.done:
					m.finish(f)
				default:
					more = false
				}
			}
			m.mu.Unlock()
		}
	}
}

// due handles a target the wheel gives back: a half-open check in flight
// whose timeout passed fails; otherwise its next check starts. Callers
// hold mu.
func (m *Monitor) due(ctx context.Context, t *target, now time.Time) {
	if t.waiting {
		m.giveUp(t)
		r := fail("timeout after " + t.check.Timeout.String())
		r.Start, r.Took = t.synStart, now.Sub(t.synStart)
		m.finish(finished{t, r})
		return
	}
	if t.half {
		if e := m.synEngine(); e != nil {
			token, err := e.queue(&m.d, t.check.SourceAddr, t.dst, t)
			if err == nil {
				t.running, t.waiting, t.synToken, t.synStart = true, true, token, now
				m.wheel.add(t, now.Add(t.check.Timeout), -1)
				return
			}
			if !errors.Is(err, errSynBusy) {
				t.running = true
				r := t.probe.failErr(err)
				r.Start = now
				m.finish(finished{t, r})
				return
			}
			// Every source port busy towards this backend: connect.
		}
	}
	if t.probe.connectable() {
		if c := m.connEngine(); c != nil {
			if t.half {
				m.halfConns++
			}
			t.running = true
			if r, done := c.start(&m.d, t); done {
				r.Start = now
				m.finish(finished{t, r})
				return
			}
			t.waiting, t.synStart = true, now
			m.wheel.add(t, now.Add(t.check.Timeout), -1)
			return
		}
	}
	m.start(ctx, t)
}

// giveUp ends the check in flight of t, if any. Callers hold mu.
func (m *Monitor) giveUp(t *target) {
	if !t.waiting {
		return
	}
	t.waiting = false
	if t.connFD >= 0 {
		m.conn.cancel(t)
	} else {
		m.syn.cancel(t.synToken)
	}
}

// connEngine returns the connect checks' engine, opening it the first
// time; nil if it cannot be opened (those checks run in goroutines).
// Callers hold mu.
func (m *Monitor) connEngine() *connEngine {
	if !m.connTried {
		m.connTried = true
		c, err := newConnEngine()
		if err != nil {
			m.log.Warn("connect checks run one goroutine each", "err", err)
			return nil
		}
		m.conn = c
	}
	return m.conn
}

// connsDone takes in finished connects. A connect that finished after its
// timeout is a timeout. Callers hold mu.
func (m *Monitor) connsDone(ds []connDone) {
	for _, d := range ds {
		t := d.t
		if !t.waiting || t.removed {
			continue
		}
		t.waiting = false
		m.wheel.remove(t)
		var r Result
		switch took := d.at.Sub(t.synStart); {
		case took > t.check.Timeout:
			r = fail("timeout after " + t.check.Timeout.String())
		case d.err == nil:
			r = pass("connected")
		default:
			r = t.probe.failErr(d.err)
		}
		r.Start, r.Took = t.synStart, max(0, min(d.at.Sub(t.synStart), t.check.Timeout))
		m.finish(finished{t, r})
	}
}

// synEngine returns the half-open checks' engine, opening it the first
// time; nil if it cannot be opened (those checks connect). Callers hold
// mu.
func (m *Monitor) synEngine() *synEngine {
	if !m.synTried {
		m.synTried = true
		e, err := m.d.prober()
		if err != nil {
			m.log.Warn("half-open checks connect instead", "err", err)
			return nil
		}
		m.syn = e
	}
	return m.syn
}

// synAnswers takes in half-open checks' answers. A reply stamped after
// its check's timeout is a timeout, as if it had not come. Callers hold
// mu.
func (m *Monitor) synAnswers(as []synAnswer) {
	for _, a := range as {
		t, ok := a.owner.(*target)
		if !ok || !t.waiting || t.synToken != a.token || t.removed {
			continue // timed out or removed meanwhile
		}
		t.waiting = false
		m.wheel.remove(t)
		var r Result
		switch {
		case a.err != nil:
			r = t.probe.failErr(a.err)
		case a.at.Sub(t.synStart) > t.check.Timeout:
			r = fail("timeout after " + t.check.Timeout.String())
		case a.answer == synUp:
			r = pass(a.answer)
		default:
			r = fail(a.answer)
		}
		r.Start, r.Took = t.synStart, max(0, min(a.at.Sub(t.synStart), t.check.Timeout))
		m.finish(finished{t, r})
	}
}

func (m *Monitor) start(ctx context.Context, t *target) {
	t.running = true
	m.spawned++
	p := t.probe
	go func() {
		m.sem <- struct{}{}
		r := p.run(ctx, &m.d)
		<-m.sem
		select {
		case m.done <- finished{t, r}:
		case <-ctx.Done():
		}
	}()
}

// finish takes in a check's result. Callers hold mu.
func (m *Monitor) finish(f finished) {
	t, r := f.t, f.r
	t.running = false
	m.checks++
	if !r.OK {
		m.fails++
	}
	if m.opts.Observe != nil {
		m.opts.Observe(t.check.Type, r)
	}
	if t.removed {
		return
	}
	now := time.Now()
	changed, weights := t.observe(r, now)
	// Fixed rate from the check's start, so a check that waited for its
	// timeout does not push the next one back.
	iv := t.interval()
	iv -= time.Duration(m.rnd.Float64() * m.opts.Spread * float64(iv))
	t.next = r.Start.Add(iv)
	if t.next.Before(now) {
		t.next = now
	}
	m.wheel.add(t, t.next, m.early(iv))
	if changed && t.up && t.check.Warmup > 0 {
		m.ramping[t] = struct{}{}
	}
	if changed && !t.up {
		delete(m.ramping, t)
	}
	if changed || weights {
		m.emit(t, r.Detail)
	}
}

// observe applies one result to the target's state. It reports whether
// the state changed (up <-> down) and whether only its weights did.
func (t *target) observe(r Result, now time.Time) (changed, weights bool) {
	t.last, t.checked = r, true
	t.checks++
	if !r.OK {
		t.fails++
	}
	if r.Percent >= 0 && r.Percent != t.percent {
		t.percent, weights = r.Percent, true
	}
	if t.check.Type == model.CheckExec && r.Weight != t.weight {
		t.weight, weights = r.Weight, true
	}
	if t.up {
		if r.OK {
			t.streak = 0
			return false, weights
		}
		t.streak++
		if r.Now || t.streak >= t.check.Fall {
			t.up, t.streak, t.ramp = false, 0, 1000
			return true, weights
		}
		return false, weights
	}
	if !r.OK {
		t.streak = 0
		return false, weights
	}
	t.streak++
	if t.streak >= t.check.Rise {
		t.up, t.streak = true, 0
		if t.check.Warmup > 0 {
			t.rampFrom, t.ramp = now, rampAt(0, t.check.Warmup)
		}
		return true, weights
	}
	return false, weights
}

// early is how much earlier than due a check of interval iv may start
// with others (Options.Batch): a tenth of iv at most, so an interval is
// never shortened by more than that besides the spread.
func (m *Monitor) early(iv time.Duration) time.Duration { return min(m.opts.Batch, iv/10) }

// interval is the time to the next check: fastinter while the state is
// changing, downinter while down, inter otherwise.
func (t *target) interval() time.Duration {
	switch {
	case t.streak > 0:
		return t.check.FastInter
	case !t.up:
		return t.check.DownInter
	}
	return t.check.Inter
}

// Warm-up ramps the weight in rampSteps equal steps.
const rampSteps = 10

// rampAt is the warm-up's share (per mille) elapsed into it.
func rampAt(elapsed, warmup time.Duration) uint32 {
	if warmup <= 0 {
		return 1000
	}
	step := int64(elapsed)*rampSteps/int64(warmup) + 1
	return uint32(min(step*1000/rampSteps, 1000))
}

// stepRamps moves the warm-ups on and returns the time to the next step
// (0: none ramping). Callers hold mu.
func (m *Monitor) stepRamps(now time.Time) time.Duration {
	var next time.Duration
	for t := range m.ramping {
		el := now.Sub(t.rampFrom)
		r := rampAt(el, t.check.Warmup)
		if r != t.ramp {
			t.ramp = r
			m.emit(t, fmt.Sprintf("warm-up %d%%", r/10))
		}
		if r >= 1000 {
			delete(m.ramping, t)
			continue
		}
		stepLen := max(t.check.Warmup/rampSteps, time.Millisecond)
		w := stepLen - el%stepLen
		if next == 0 || w < next {
			next = w
		}
	}
	return next
}

// emit queues the target's health for the engine. Callers hold mu.
func (m *Monitor) emit(t *target, reason string) {
	pct := uint32(100)
	if t.percent >= 0 {
		pct = uint32(t.percent)
	}
	m.pending[t.tkey] = engine.HealthUpdate{Farm: t.farm, Backend: t.backend, Key: t.key, Down: !t.up,
		Reason: reason, Percent: pct, Weight: t.weight, Ramp: t.ramp}
	select {
	case m.pendWake <- struct{}{}:
	default:
	}
}

// report hands queued updates to the sink, all that are waiting in one
// call. A refused batch is offered again a second later, less what newer
// results replaced.
func (m *Monitor) report(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.pendWake:
		}
		m.mu.Lock()
		batch := make([]engine.HealthUpdate, 0, len(m.pending))
		for _, u := range m.pending {
			batch = append(batch, u)
		}
		clear(m.pending)
		m.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		if err := m.sink.SetHealth(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log.Error("apply health updates; retrying in 1s", "updates", len(batch), "err", err)
			m.mu.Lock()
			for _, u := range batch {
				if _, newer := m.pending[tkey{u.Farm, u.Backend}]; !newer {
					m.pending[tkey{u.Farm, u.Backend}] = u
				}
			}
			m.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			select {
			case m.pendWake <- struct{}{}:
			default:
			}
		}
	}
}

// Status is what the monitor knows of one checked backend.
type Status struct {
	Up      bool
	Checked bool   // Last holds a result
	Last    Result // the last check's
	Streak  uint32 // consecutive results against the state (rise or fall under way)
	Checks  uint64
	Fails   uint64
	Ramp    uint32 // warm-up per mille (1000: done)
}

// Status returns the state of a checked backend.
func (m *Monitor) Status(farm, backend string) (Status, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.targets[tkey{farm, backend}]
	if t == nil {
		return Status{}, false
	}
	return Status{Up: t.up, Checked: t.checked, Last: t.last, Streak: t.streak, Checks: t.checks, Fails: t.fails, Ramp: t.ramp}, true
}

// Totals returns the number of checked backends, and of checks run and
// failed since the start.
func (m *Monitor) Totals() (targets int, checks, fails uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.targets), m.checks, m.fails
}
