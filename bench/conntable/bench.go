package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xlb-lb/xlb/bench/internal/topo"
)

// bench is one topology with its balancer (or none, for the reference).
type bench struct {
	o    options
	self string
	c    config
	t    *topo.Topology
	tmp  string // the daemon's state directory
	pin  string // ebpf: the daemon's --pin-path
}

// sinkRules is every backend's ruleset: drop the benchmark's datagrams
// before conntrack, counting them.
var sinkRules = fmt.Sprintf(`table ip sink {
	chain pre {
		type filter hook prerouting priority -300; policy accept;
		udp dport %d counter drop
	}
}
`, udpPort)

var reCounter = regexp.MustCompile(`counter packets (\d+)`)

// newBench builds a topology: sinks in the backends, the flow sources routed
// back to the client, and for c.plane nft or ebpf the xlb daemon with a UDP
// farm on the VIP.
func newBench(ctx context.Context, o options, self string, c config, pin string) (b *bench, err error) {
	b = &bench{o: o, self: self, c: c, pin: pin}
	if b.t, err = topo.New(ctx, topo.Options{Prefix: o.prefix, Echo: o.echo}); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	for i := range topo.Backends {
		if err := b.t.RunInput(ctx, fmt.Sprintf("be%d", i+1), sinkRules, "nft", "-f", "-"); err != nil {
			return nil, fmt.Errorf("udp sink: %w", err)
		}
	}
	if err := b.t.Run(ctx, "lb", "ip", "route", "add", sourceNet, "via", topo.ClientIP); err != nil {
		return nil, err
	}
	if c.plane == "ref" {
		return b, nil
	}
	if b.tmp, err = os.MkdirTemp("", "xlb-conntable-"); err != nil {
		return nil, err
	}
	args := []string{o.xlb, "daemon", "--listen", apiAddr, "--state-dir", b.tmp, "--socket", "none", "--dataplane", c.plane, "--log-level", "warn"}
	if c.plane == "ebpf" {
		args = append(args, "--conn-table-size", strconv.Itoa(c.table), "--ct-timeout-udp", ctTimeout.String(), "--pin-path", pin)
	}
	if _, err := b.t.Start("lb", []string{"XLB_KEY=" + apiKey}, args...); err != nil {
		return nil, err
	}
	ready := false
	for range 100 {
		if b.cli(ctx, "farm", "list") == nil {
			ready = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !ready {
		return nil, fmt.Errorf("xlb daemon (--dataplane %s) did not become ready", c.plane)
	}
	if err := b.cli(ctx, "farm", "add", "bench-udp", "--vip", topo.VIP, "--ports", strconv.Itoa(udpPort), "--proto", "udp", "--mode", "dnat", "--sched", "rr"); err != nil {
		return nil, err
	}
	for i, ip := range topo.Backends {
		if err := b.cli(ctx, "backend", "add", "bench-udp", fmt.Sprintf("be%d", i+1), "--ip", ip, "--port", strconv.Itoa(udpPort)); err != nil {
			return nil, err
		}
	}
	if c.plane == "nft" {
		// Per namespace; the one-packet flows are unreplied: this timeout.
		if err := b.t.Run(ctx, "lb", "sysctl", "-qw", fmt.Sprintf("net.netfilter.nf_conntrack_udp_timeout=%d", int(ctTimeout.Seconds()))); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (b *bench) cli(ctx context.Context, args ...string) error {
	c := append([]string{"env", "XLB_KEY=" + apiKey, "XLB_API=http://" + apiAddr, b.o.xlb}, args...)
	return b.t.Run(ctx, "lb", c...)
}

func (b *bench) close() {
	if b.t != nil {
		b.t.Close()
	}
	if b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
	if b.pin != "" {
		os.RemoveAll(b.pin) // the pins on our bpffs; the maps go with them
	}
}

// dst is where the flows go: the VIP, or for the reference (no balancer)
// the first backend's own address.
func (b *bench) dst() string {
	if b.c.plane == "ref" {
		return topo.Backends[0]
	}
	return topo.VIP
}

// sinks returns the packets the backends' sinks dropped so far.
func (b *bench) sinks(ctx context.Context) ([]float64, error) {
	var n []float64
	for i := range topo.Backends {
		out, err := b.t.Output(ctx, fmt.Sprintf("be%d", i+1), "nft", "list", "table", "ip", "sink")
		if err != nil {
			return nil, err
		}
		m := reCounter.FindSubmatch(out)
		if m == nil {
			return nil, fmt.Errorf("no counter in the sink of be%d:\n%s", i+1, out)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		n = append(n, v)
	}
	return n, nil
}

// genResult is one generator run.
type genResult struct {
	sent, secs, cpuNs, recv float64
}

// gen runs the generator in the client namespace: count packets at most,
// round robin over flows first..first+flows-1, for at most d; recv is what
// the sinks counted.
func (b *bench) gen(ctx context.Context, first, flows, count int, d time.Duration) (genResult, error) {
	before, err := b.sinks(ctx)
	if err != nil {
		return genResult{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	out, err := b.t.Output(cctx, "client", b.self, "gen", b.dst(), strconv.Itoa(udpPort), strconv.Itoa(first), strconv.Itoa(flows), strconv.Itoa(count), d.String())
	if err != nil {
		return genResult{}, fmt.Errorf("gen: %w", err)
	}
	var r genResult
	if _, err := fmt.Sscan(string(out), &r.sent, &r.secs, &r.cpuNs); err != nil {
		return genResult{}, fmt.Errorf("gen output %q: %w", out, err)
	}
	// Let queued packets reach the sinks: wait until the count is still.
	var after []float64
	last := -1.0
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		if after, err = b.sinks(ctx); err != nil {
			return genResult{}, err
		}
		var sum float64
		for i := range after {
			sum += after[i] - before[i]
		}
		if sum == last {
			break
		}
		last = sum
	}
	r.recv = last
	return r, nil
}

// checkHot sends the hot flows once and fails unless they reached every
// backend they should: a system that does not balance is an error, not a
// number.
func (b *bench) checkHot(ctx context.Context) error {
	before, err := b.sinks(ctx)
	if err != nil {
		return err
	}
	want := len(topo.Backends)
	if b.c.plane == "ref" {
		want = 1
	}
	var after []float64
	got := 0
	for range 20 {
		if _, err := b.gen(ctx, 0, b.o.hot, b.o.hot, 5*time.Second); err != nil {
			return err
		}
		if after, err = b.sinks(ctx); err != nil {
			return err
		}
		got = 0
		for i := range after {
			if after[i] > before[i] {
				got++
			}
		}
		if got >= want {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("check: the %d hot flows to %s reached %d backends, want %d (sinks before %v, after %v)", b.o.hot, b.dst(), got, want, before, after)
}

// entries returns the connections the LB tracks: conntrack -C in the lb
// namespace (nft), or the forward entries of the eBPF conntrack map (one per
// connection; its reply entry may have been evicted by the LRU, to be
// rebuilt from the forward one when a reply comes).
func (b *bench) entries(ctx context.Context) (int, error) {
	if b.c.plane == "nft" {
		out, err := b.t.Output(ctx, "lb", "conntrack", "-C")
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(out)))
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(b.pin, "xlb_ct"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("open the conntrack map: %w", err)
	}
	defer m.Close()
	return countForward(m)
}

// ctDirOffset is the offset of struct ct_val's dir (bpf/xlb_structs.h):
// 0 XLB_CT_FWD, 1 XLB_CT_REPLY.
const ctDirOffset = 36

// countForward counts the forward entries of the conntrack map with batch
// lookups.
func countForward(m *ebpf.Map) (int, error) {
	const chunk = 4096
	if m.ValueSize() <= ctDirOffset {
		return 0, fmt.Errorf("conntrack map values of %d bytes: not struct ct_val", m.ValueSize())
	}
	kt := reflect.ArrayOf(int(m.KeySize()), reflect.TypeFor[byte]())
	vt := reflect.ArrayOf(int(m.ValueSize()), reflect.TypeFor[byte]())
	keys := reflect.MakeSlice(reflect.SliceOf(kt), chunk, chunk)
	vals := reflect.MakeSlice(reflect.SliceOf(vt), chunk, chunk)
	var cursor ebpf.MapBatchCursor
	fwd := 0
	for {
		n, err := m.BatchLookup(&cursor, keys.Interface(), vals.Interface(), nil)
		for i := range n {
			if vals.Index(i).Index(ctDirOffset).Uint() == 0 {
				fwd++
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return fwd, nil
		}
		if err != nil {
			return fwd, fmt.Errorf("count the conntrack map: %w", err)
		}
	}
}

// ebpf statistics: indexes into xlb_stats (enum xlb_stat, bpf/xlb_consts.h).
const (
	statCtFwd   = 3
	statNewFlow = 7
)

// stats returns the eBPF program's ct_fwd and new_flow counters, summed over
// the CPUs (zeros for other planes).
func (b *bench) stats() (ctFwd, newFlow uint64, err error) {
	if b.c.plane != "ebpf" {
		return 0, 0, nil
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(b.pin, "xlb_stats"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, 0, fmt.Errorf("open the stats map: %w", err)
	}
	defer m.Close()
	sum := func(k uint32) (uint64, error) {
		var per []uint64
		if err := m.Lookup(k, &per); err != nil {
			return 0, err
		}
		var s uint64
		for _, v := range per {
			s += v
		}
		return s, nil
	}
	if ctFwd, err = sum(statCtFwd); err != nil {
		return 0, 0, err
	}
	newFlow, err = sum(statNewFlow)
	return ctFwd, newFlow, err
}

// fill sends one packet on each of the flows hot..hot+n-1, counts the table,
// and sends again while fewer than want are tracked (3 passes at most).
func (b *bench) fill(ctx context.Context, n, want int) (got, passes int, secs float64, err error) {
	start := time.Now()
	for passes = 1; passes <= 3; passes++ {
		// Bounded by the count (n packets) and by time.
		if _, err := b.gen(ctx, b.o.hot, n, n, 2*time.Minute); err != nil {
			return 0, passes, 0, err
		}
		if got, err = b.entries(ctx); err != nil {
			return 0, passes, 0, err
		}
		if got >= want {
			break
		}
		log.Printf("  %s: %d of %d connections tracked after pass %d, sending again", b.c, got, want, passes)
	}
	return got, min(passes, 3), time.Since(start).Seconds(), nil
}

// softirqTicks is the machine's softirq time from /proc/stat, in USER_HZ.
func softirqTicks() uint64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line)) // cpu user nice system idle iowait irq softirq ...
	if len(f) < 8 {
		return 0
	}
	v, _ := strconv.ParseUint(f[7], 10, 64)
	return v
}

// clockTicks is USER_HZ, the unit of /proc/stat.
const clockTicks = 100

// load runs one measured load: the hot flows or every tracked flow.
func (b *bench) load(ctx context.Context, load string, n int) (sample, error) {
	first, flows := 0, b.o.hot
	if load == "spread" {
		flows = b.o.hot + n
	}
	fwd0, new0, err := b.stats()
	if err != nil {
		return sample{}, err
	}
	si0 := softirqTicks()
	r, err := b.gen(ctx, first, flows, int(maxPPS*b.o.duration.Seconds()), b.o.duration)
	if err != nil {
		return sample{}, err
	}
	si1 := softirqTicks()
	fwd1, new1, err := b.stats()
	if err != nil {
		return sample{}, err
	}
	if r.recv <= 0 || r.secs <= 0 {
		return sample{}, fmt.Errorf("%s: no packet reached the sinks through %s (%.0f sent)", load, b.dst(), r.sent)
	}
	s := sample{
		PPS: r.recv / r.secs, Sent: r.sent, Received: r.recv, Seconds: r.secs,
		LossPct:      100 * (r.sent - r.recv) / r.sent,
		CPUNsPerPkt:  r.cpuNs / r.recv,
		SoftirqNsPkt: float64(si1-si0) * (1e9 / clockTicks) / r.recv,
	}
	if b.c.plane == "ebpf" && fwd1+new1 > fwd0+new0 {
		s.NewFlowPct = 100 * float64(new1-new0) / float64(fwd1+new1-fwd0-new0)
	}
	return s, nil
}

// measureConfig fills a fresh topology with n connections for config c and
// measures every load o.runs times, each run paired with a reference run.
func measureConfig(ctx context.Context, o options, self string, ref *bench, c config, n int, pin string, seq int) ([]*row, error) {
	log.Printf("%s, %d connections: set up", c, n)
	b, err := newBench(ctx, o, self, c, pin)
	if err != nil {
		return nil, err
	}
	defer b.close()
	if err := b.checkHot(ctx); err != nil {
		return nil, err
	}
	want := n + o.hot
	if c.plane == "ebpf" && want > c.table {
		want = 0 // an LRU smaller than n: it holds what it holds
	} else {
		want = want * 98 / 100
	}
	got, passes, fillSecs, err := b.fill(ctx, n, want)
	if err != nil {
		return nil, err
	}
	if got < want {
		return nil, fmt.Errorf("fill: the table holds %d connections after %d passes of %d flows, want at least %d", got, passes, n, want)
	}
	log.Printf("  filled: %d connections tracked (%d passes, %.1f s)", got, passes, fillSecs)
	rows := map[string]*row{}
	var out []*row
	for _, l := range o.loads {
		r := &row{Config: c.String(), Plane: c.plane, Table: c.table, Connections: n, Load: l,
			EntriesFilled: got, FillPasses: passes, FillSeconds: fillSecs}
		rows[l] = r
		out = append(out, r)
	}
	for i := range o.runs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		refFirst := (i+seq)%2 == 0
		var refS sample
		runRef := func() error {
			var err error
			if refS, err = ref.load(ctx, "hot", 0); err != nil {
				return fmt.Errorf("reference: %w", err)
			}
			return nil
		}
		if refFirst {
			if err := runRef(); err != nil {
				return nil, err
			}
		}
		got := map[string]sample{}
		for _, l := range o.loads {
			s, err := b.load(ctx, l, n)
			if err != nil {
				return nil, err
			}
			got[l] = s
		}
		if !refFirst {
			if err := runRef(); err != nil {
				return nil, err
			}
		}
		for _, l := range o.loads {
			s := got[l]
			s.RefPPS, s.RefCPUNsPerPkt = refS.PPS, refS.CPUNsPerPkt
			s.RatioToRef = s.PPS / refS.PPS
			s.AddedNsPerPkt = s.CPUNsPerPkt - refS.CPUNsPerPkt
			rows[l].Runs = append(rows[l].Runs, s)
			log.Printf("  run %d/%d %-6s %8.0f packets/s (ref %8.0f, ratio %.3f)  cpu %5.0f ns/packet (+%4.0f vs ref)  loss %.1f %%  new flows %.1f %%",
				i+1, o.runs, l, s.PPS, refS.PPS, s.RatioToRef, s.CPUNsPerPkt, s.AddedNsPerPkt, s.LossPct, s.NewFlowPct)
		}
	}
	after, err := b.entries(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range out {
		r.EntriesAfter = after
	}
	log.Printf("  %d connections tracked after the measurement", after)
	return out, nil
}
