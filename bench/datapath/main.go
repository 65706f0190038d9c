// Command datapath measures the data path: HTTP requests from a client
// through a virtual address to 3 backends, through each of several load
// balancers and a direct connection, all in the same run (the loxilb
// comparison's topology):
//
//	client ns 10.100.0.2 -> lb ns 10.100.0.1 | br0 10.200.0.1 -> backends 10.200.0.11-13:8080
//
// Systems: direct (client to one backend, routed through the lb namespace but
// not balanced), xlb with the nft data plane (snat, as users run it, and dnat,
// which does the same work as the plain nftables and iptables baselines),
// xlb with the eBPF data plane when the daemon offers it, plain nftables DNAT
// with `numgen inc mod 3`, iptables DNAT with `-m statistic --mode nth`, and
// HAProxy in TCP mode.
//
// Every measurement builds a fresh topology of namespaces and removes it
// afterwards, so no system inherits another's hooks, conntrack entries, legacy
// iptables tables or attached programs. Runs are interleaved (run 1 of every
// system, then run 2, ...) and the order rotates, so slow drift of the shared
// machine spreads over all systems instead of penalizing one.
//
// The loads, each with a fixed duration and bounded: wrk with a fixed number
// of keep-alive connections (forwarding cost), wrk with a new connection per
// request (connection setup, NAT and scheduling cost), and UDP packets/s from
// a light generator to sinks that drop cheaply (udp.go).
//
// Must run as root in the host namespace: it creates namespaces named
// xlbb-<pid>-* and deletes them on exit, on error and on SIGINT/SIGTERM.
// Nothing is sent outside those namespaces.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"github.com/xlb-lb/xlb/bench/internal/topo"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	xlb, echo, out string
	runs           int
	duration       time.Duration
	warmup         time.Duration
	conns, threads int
	systems        []string
	loads          []string
	iptables       string
	prefix         string
}

const (
	apiAddr = "127.0.0.1:5590" // inside the lb namespace
	apiKey  = "bench-key-not-secret"
)

var allSystems = []string{"direct", "xlb-nft", "xlb-nft-dnat", "xlb-nft-dnat-1t", "xlb-ebpf", "nft", "iptables", "haproxy"}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "udpgen" {
		if err := udpgen(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	var o options
	var systems, loads string
	flag.StringVar(&o.xlb, "xlb", "bin/xlb", "xlb binary")
	flag.StringVar(&o.echo, "echo", "bin/xlb-echo", "backend HTTP server binary")
	flag.StringVar(&o.out, "out", "bench/results", "results directory")
	flag.IntVar(&o.runs, "runs", 5, "runs of every system")
	flag.DurationVar(&o.duration, "d", 5*time.Second, "wrk duration of each measurement")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unrecorded wrk run before each measurement (0: none)")
	flag.IntVar(&o.conns, "c", 32, "wrk connections")
	flag.IntVar(&o.threads, "t", 1, "wrk threads")
	flag.StringVar(&systems, "systems", strings.Join(allSystems, ","), "systems to measure, comma separated")
	flag.StringVar(&loads, "loads", "keepalive,close,udp", "keepalive (persistent HTTP connections), close (a new connection per request), udp (packets/s to sinks that drop)")
	flag.StringVar(&o.iptables, "iptables", "iptables-legacy", "iptables binary: iptables-legacy measures x_tables; iptables-nft turns statistic nth into nft's numgen")
	flag.StringVar(&o.prefix, "prefix", fmt.Sprintf("xlbb-%d", os.Getpid()), "prefix of the namespaces it creates (bench/run.sh passes one it can clean up after a crash)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("datapath: ")
	o.systems = strings.Split(systems, ",")
	o.loads = strings.Split(loads, ",")
	for _, s := range o.systems {
		if !slicesContains(allSystems, s) {
			log.Fatalf("-systems: unknown system %q (known: %s)", s, strings.Join(allSystems, ","))
		}
	}
	for _, l := range o.loads {
		if l != "keepalive" && l != "close" && l != "udp" {
			log.Fatalf("-loads: unknown load %q", l)
		}
	}
	if o.runs < 1 || o.duration < time.Second {
		log.Fatal("-runs must be >= 1 and -d >= 1s")
	}
	if os.Geteuid() != 0 {
		log.Fatal("run as root: it creates network namespaces")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, o)
	if err != nil {
		log.Print(err)
		stop()
		os.Exit(1)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// sample is one wrk measurement.
type sample struct {
	ReqPerSec  float64 `json:"req_per_sec"`
	Requests   float64 `json:"requests"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	Errors     float64 `json:"errors"`
	SoftirqUs  float64 `json:"softirq_us_per_req"`
	BusyUs     float64 `json:"machine_cpu_us_per_req"`
	LBProcUs   float64 `json:"lb_process_cpu_us_per_req"`
	DurationMs float64 `json:"duration_ms"`
	Sent       float64 `json:"udp_sent,omitempty"`
	LossPct    float64 `json:"udp_loss_percent,omitempty"`
}

type measurement struct {
	System string   `json:"system"`
	Load   string   `json:"load"`
	Desc   string   `json:"description"`
	Runs   []sample `json:"runs"`
}

func run(ctx context.Context, o options) error {
	for _, bin := range []string{o.xlb, o.echo} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("binary %s: %w (make build first)", bin, err)
		}
	}
	for _, tool := range []string{"ip", "wrk", "curl", "nft", o.iptables, "haproxy"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: %w (scripts/install-deps.sh installs it)", tool, err)
		}
	}
	xlbAbs, _ := filepath.Abs(o.xlb)
	echoAbs, _ := filepath.Abs(o.echo)
	o.xlb, o.echo = xlbAbs, echoAbs

	var notes []string
	skipped := map[string]string{}
	var systems []*system
	for _, name := range o.systems {
		s := newSystem(name, o)
		if name == "xlb-ebpf" {
			help, _ := exec.Command(o.xlb, "daemon", "--help").CombinedOutput()
			if !regexp.MustCompile(`--dataplane.*ebpf`).Match(help) {
				why := "`xlb daemon --help` does not list an ebpf data plane in this build"
				log.Printf("skip xlb-ebpf: %s", why)
				skipped[name] = why
				continue
			}
		}
		systems = append(systems, s)
	}

	results := map[string]*measurement{}
	var order []string
	for _, s := range systems {
		for _, l := range o.loads {
			if l == "udp" && !s.hasUDP() {
				continue
			}
			k := s.name + "/" + l
			results[k] = &measurement{System: s.name, Load: l, Desc: s.desc}
			order = append(order, k)
		}
	}

	start := time.Now()
	for r := range o.runs {
		for i := range systems {
			s := systems[(i+r)%len(systems)] // rotate the order every run
			if err := ctx.Err(); err != nil {
				return err
			}
			samples, err := measure(ctx, o, s)
			if err != nil {
				return fmt.Errorf("run %d, %s: %w", r+1, s.name, err)
			}
			for _, l := range o.loads {
				smp, ok := samples[l]
				if !ok {
					continue
				}
				if l == "udp" {
					log.Printf("run %d/%d %-13s %-9s %8.0f packets/s  loss %.1f %%  softirq %.2f us/packet",
						r+1, o.runs, s.name, l, smp.ReqPerSec, smp.LossPct, smp.SoftirqUs)
					results[s.name+"/"+l].Runs = append(results[s.name+"/"+l].Runs, smp)
					continue
				}
				results[s.name+"/"+l].Runs = append(results[s.name+"/"+l].Runs, smp)
				log.Printf("run %d/%d %-13s %-9s %8.0f req/s  p50 %.2f ms  p99 %.2f ms  softirq %.1f us/req",
					r+1, o.runs, s.name, l, smp.ReqPerSec, smp.P50ms, smp.P99ms, smp.SoftirqUs)
			}
		}
	}
	notes = append(notes,
		fmt.Sprintf("wrk -t%d -c%d -d%s --latency, %s unrecorded warm-up before each measurement; %d runs per system, interleaved with rotating order; a fresh topology of namespaces for every measurement.", o.threads, o.conns, o.duration, o.warmup, o.runs),
		"keepalive: persistent connections (forwarding cost). close: `Connection: close`, a new TCP connection per request (NAT and scheduling cost per connection).",
		"CPU: softirq_us_per_req is the softirq time of the whole machine (/proc/stat, all CPUs) during the run divided by the requests served: with veth every packet of client, LB and backends is processed in softirq, so it includes all hops (and anything else running on the machine); compare it with direct, whose path crosses the same namespaces without balancing. machine_cpu_us_per_req is user+system+irq+softirq of the whole machine per request. lb_process_cpu_us_per_req is the user+system time of the balancer's process (HAProxy, the xlb daemon) per request.",
		fmt.Sprintf("udp: a Go generator in the client sends 18-byte datagrams over %d flows (fixed source ports) for the same duration, at most 3 million packets per second of run; each backend drops them in nftables at prerouting priority -300 and counts them. req/s means packets/s counted at the sinks, µs/req means µs per packet; the check sends 30 one-packet flows first. Each flow is scheduled once, then forwarded by conntrack. HAProxy does not balance UDP and is left out of this load.", udpFlows),
		fmt.Sprintf("iptables baseline uses %s.", o.iptables),
		fmt.Sprintf("total wall time %s.", time.Since(start).Round(time.Second)),
	)
	for name, why := range skipped {
		notes = append(notes, fmt.Sprintf("%s skipped: %s.", name, why))
	}
	return write(o, order, results, notes, skipped)
}

// measure builds a fresh topology, sets system s up, checks that it balances,
// runs wrk once per load, and removes everything.
func measure(ctx context.Context, o options, s *system) (map[string]sample, error) {
	t, err := topo.New(ctx, topo.Options{Prefix: o.prefix, Echo: o.echo})
	if err != nil {
		return nil, err
	}
	defer t.Close()
	if slicesContains(o.loads, "udp") {
		for i := range topo.Backends {
			if err := t.RunInput(ctx, fmt.Sprintf("be%d", i+1), sinkRules, "nft", "-f", "-"); err != nil {
				return nil, fmt.Errorf("udp sink: %w", err)
			}
		}
	}
	if err := s.setup(ctx, t); err != nil {
		return nil, fmt.Errorf("set up: %w", err)
	}
	defer s.teardown(t)
	if err := verify(ctx, t, s); err != nil {
		return nil, err
	}
	out := map[string]sample{}
	for _, load := range o.loads {
		if load == "udp" {
			if !s.hasUDP() {
				continue
			}
			before := readCPU()
			smp, err := udpLoad(ctx, t, s, o.duration)
			if err != nil {
				return nil, err
			}
			after := readCPU()
			tick := 1e6 / clockTicks
			smp.SoftirqUs = float64(after.softirq-before.softirq) * tick / smp.Requests
			smp.BusyUs = float64(after.busy-before.busy) * tick / smp.Requests
			out[load] = smp
			continue
		}
		if o.warmup > 0 {
			if _, err := wrk(ctx, o, t, s, load, o.warmup); err != nil {
				return nil, fmt.Errorf("warm-up: %w", err)
			}
		}
		t.Run(ctx, "lb", "conntrack", "-F") // start from an empty table; errors are harmless (no conntrack yet)
		before := readCPU()
		procBefore := procCPU(s.proc)
		smp, err := wrk(ctx, o, t, s, load, o.duration)
		if err != nil {
			return nil, err
		}
		after := readCPU()
		procAfter := procCPU(s.proc)
		if smp.Requests > 0 {
			tick := 1e6 / clockTicks // µs per USER_HZ tick
			smp.SoftirqUs = float64(after.softirq-before.softirq) * tick / smp.Requests
			smp.BusyUs = float64(after.busy-before.busy) * tick / smp.Requests
			smp.LBProcUs = float64(procAfter-procBefore) * tick / smp.Requests
		}
		out[load] = smp
	}
	return out, nil
}

// verify makes fresh connections through the system and fails unless every
// backend it should reach answered: a baseline that does not balance is an
// error, not a number.
func verify(ctx context.Context, t *topo.Topology, s *system) error {
	want := topo.Backends
	if s.name == "direct" {
		want = topo.Backends[:1]
	}
	seen := map[string]bool{}
	var last string
	deadline := time.Now().Add(5 * time.Second) // daemons and HAProxy may need a moment
	for len(seen) < len(want) && time.Now().Before(deadline) {
		out, err := t.Output(ctx, "client", "curl", "-s", "--max-time", "1", s.url())
		if err != nil {
			last = err.Error()
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if f := strings.Fields(string(out)); len(f) > 0 {
			seen[f[0]] = true
		}
	}
	if len(seen) < len(want) {
		return fmt.Errorf("check: %s reached backends %v, want %d of them (last error: %s)", s.url(), keys(seen), len(want), last)
	}
	return nil
}

func keys(m map[string]bool) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	return k
}

var (
	reReqs    = regexp.MustCompile(`(\d+) requests in ([\d.]+\w+),`)
	reRate    = regexp.MustCompile(`Requests/sec:\s+([\d.]+)`)
	rePct     = regexp.MustCompile(`^\s+(50|99)%\s+([\d.]+\w+)`)
	reSockErr = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	reNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// wrk runs one wrk load from the client namespace and parses its output.
// wrk stops by itself after d; the context deadline is the backstop.
func wrk(ctx context.Context, o options, t *topo.Topology, s *system, load string, d time.Duration) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	args := []string{"wrk", "-t", strconv.Itoa(o.threads), "-c", strconv.Itoa(o.conns),
		"-d", fmt.Sprintf("%ds", int(d.Round(time.Second).Seconds())), "--timeout", "2s", "--latency"}
	if load == "close" {
		args = append(args, "-H", "Connection: close")
	}
	args = append(args, s.url())
	out, err := t.Output(ctx, "client", args...)
	if err != nil {
		return sample{}, fmt.Errorf("wrk: %w", err)
	}
	var smp sample
	text := string(out)
	if m := reReqs.FindStringSubmatch(text); m != nil {
		smp.Requests, _ = strconv.ParseFloat(m[1], 64)
		if dd, err := time.ParseDuration(m[2]); err == nil {
			smp.DurationMs = float64(dd.Milliseconds())
		}
	}
	if m := reRate.FindStringSubmatch(text); m != nil {
		smp.ReqPerSec, _ = strconv.ParseFloat(m[1], 64)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if m := rePct.FindStringSubmatch(sc.Text()); m != nil {
			dd, err := time.ParseDuration(m[2])
			if err != nil {
				continue
			}
			v := float64(dd.Microseconds()) / 1000
			if m[1] == "50" {
				smp.P50ms = v
			} else {
				smp.P99ms = v
			}
		}
	}
	if m := reSockErr.FindStringSubmatch(text); m != nil {
		for _, x := range m[1:] {
			n, _ := strconv.ParseFloat(x, 64)
			smp.Errors += n
		}
	}
	if m := reNon2xx.FindStringSubmatch(text); m != nil {
		n, _ := strconv.ParseFloat(m[1], 64)
		smp.Errors += n
	}
	if smp.Requests == 0 || smp.ReqPerSec == 0 {
		return smp, fmt.Errorf("wrk served no requests through %s:\n%s", s.url(), text)
	}
	// A few errors happen at the end of a run (connections cut by the
	// deadline); more than 1 % means the system under test is failing.
	if smp.Errors > 0.01*smp.Requests {
		return smp, fmt.Errorf("wrk: %.0f errors in %.0f requests through %s:\n%s", smp.Errors, smp.Requests, s.url(), text)
	}
	return smp, nil
}

// clockTicks is USER_HZ, the unit of /proc/stat; 100 on every Linux
// architecture Go runs on.
const clockTicks = 100

type cpuTimes struct{ softirq, busy uint64 }

// readCPU reads the machine's aggregate CPU times from /proc/stat (not per
// namespace: the kernel keeps one set for the machine).
func readCPU() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line)) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 8 {
		return cpuTimes{}
	}
	v := func(i int) uint64 { n, _ := strconv.ParseUint(f[i], 10, 64); return n }
	return cpuTimes{softirq: v(7), busy: v(1) + v(2) + v(3) + v(6) + v(7)}
}

// procCPU returns the user+system ticks of process pid (0 if none).
func procCPU(pid int) uint64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields after ')' are fixed.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64) // field 14 utime
	s, _ := strconv.ParseUint(f[12], 10, 64) // field 15 stime
	return u + s
}
