// Command health measures xlb's health checks with real traffic: the
// daemon (nft or ebpf data plane) in the LB namespace of a client -> lb ->
// 3 backends topology, an HTTP check on every backend, a client sending
// requests to the VIP at a steady rate, and one fault at a time on a
// backend:
//
//	kill  the backend's server process is killed (SIGKILL: connects are refused)
//	stop  it is stopped (SIGSTOP: connects complete, requests hang)
//	503   it answers HTTP 503 while TCP still connects (xlb-echo's SIGUSR1)
//	loss  30 % of its outgoing packets are dropped (nft numgen in its
//	      namespace: this kernel has no sch_netem)
//
// For each it reports the detection time (fault -> the daemon's "down"
// event, which it sends once the data plane has the change) against
// fall × inter + timeout, the recovery time, and the client requests that
// failed before detection, after it, and after recovery. With -cpu it also
// measures the daemon's CPU while checking -cpu-backends backends every
// second against an idle daemon with the same farms unchecked.
//
// Everything runs in namespaces it creates and deletes; load is bounded in
// time and count.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/bench/internal/results"
	"github.com/xlb-lb/xlb/bench/internal/stats"
	"github.com/xlb-lb/xlb/bench/internal/topo"
	"github.com/xlb-lb/xlb/internal/client"
	"github.com/xlb-lb/xlb/internal/events"
)

const key = "bench-health-key"

// The check under test: HAProxy-like timing, the example.
const (
	inter   = time.Second
	timeout = 500 * time.Millisecond
	rise    = 2
	fall    = 3
)

var (
	xlbBin   = flag.String("xlb", "bin/xlb", "xlb binary")
	echoBin  = flag.String("echo", "bin/xlb-echo", "xlb-echo binary")
	outDir   = flag.String("out", "bench/results", "results directory")
	outName  = flag.String("name", "health", "results file name (<name>.md, <name>.json)")
	prefix   = flag.String("prefix", fmt.Sprintf("xlbh-%d", os.Getpid()), "namespace name prefix")
	runs     = flag.Int("runs", 5, "runs of each fault on each data plane")
	planes   = flag.String("planes", "nft,ebpf", "data planes")
	faults   = flag.String("faults", "kill,stop,503,loss", "faults")
	rate     = flag.Int("rate", 50, "client requests per second")
	doCPU    = flag.Bool("cpu", true, "measure the CPU of checking -cpu-backends backends")
	cpuBE    = flag.Int("cpu-backends", 10000, "backends checked every second in the CPU part")
	cpuSecs  = flag.Int("cpu-seconds", 10, "length of each CPU sample")
	cpuRuns  = flag.Int("cpu-runs", 3, "CPU samples of each kind")
	cpuKinds = flag.String("cpu-checks", "connect,half-open", "kinds of tcp check measured: connect (a full connect, closed with a reset), half-open (SYN, SYN-ACK)")
	detectOn = flag.Bool("detect", true, "run the fault part")
	doFlap   = flag.Bool("flap", true, "measure flapping: transitions of healthy backends with the machine idle and under CPU load")
	flapSecs = flag.Int("flap-seconds", 30, "length of each flapping sample")
	flapHogs = flag.Int("flap-hogs", 4, "busy-looping processes that load the CPU during the loaded sample")
	perfOut  = flag.String("perf", "", "record the daemon's CPU profile (perf record -g -p) during the first checked CPU sample into this file")
	steer    = flag.Bool("steer", false, "measure the LB's own CPU: the daemon pinned to CPU 0, the backends' and the bridge's receive work steered to the other CPUs by RPS on the test namespaces' veths, and the daemon's BPF programs' run time counted (kernel.bpf_stats_enabled on during the CPU part, restored after)")
	perfIdle = flag.String("perf-idle", "", "record the daemon's CPU profile (perf record -g -p) during the first idle sample (farms without checks) into this file")
	perfIn   = flag.String("perf-shares", "", "only print the shares by whose work (perfShares) of this perf.data file, and exit")
)

func main() {
	flag.Parse()
	if *perfIn != "" {
		shares, n, err := perfShares(*perfIn)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d samples:", n)
		for _, k := range []string{"user", "lbKernel", "lbRecv", "bridge", "backends"} {
			fmt.Printf(" %s %.1f%%", k, 100*shares[k])
		}
		fmt.Println()
		return
	}
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates network namespaces")
	}
	ctx := context.Background()
	var rep report
	rep.Started = time.Now().UTC()
	rep.Check = fmt.Sprintf("http GET /, inter %s, timeout %s, rise %d, fall %d", inter, timeout, rise, fall)
	rep.Bound = (fall*inter + timeout).Seconds()
	if *detectOn {
		for _, plane := range strings.Split(*planes, ",") {
			for _, fault := range strings.Split(*faults, ",") {
				for run := range *runs {
					r, err := faultRun(ctx, plane, fault)
					if err != nil {
						log.Fatalf("%s %s run %d: %v", plane, fault, run+1, err)
					}
					log.Printf("%s %s run %d: detected %.2fs (bound %.2fs) recovered %.2fs; failed %d before detection, %d after, %d after recovery (of %d)",
						plane, fault, run+1, r.Detect, rep.Bound, r.Recover, r.FailBefore, r.FailAfter, r.FailRecovered, r.Requests)
					rep.Runs = append(rep.Runs, r)
				}
			}
		}
	}
	if *doFlap {
		for _, plane := range strings.Split(*planes, ",") {
			f, err := flapRun(ctx, plane)
			if err != nil {
				log.Fatalf("flap: %v", err)
			}
			rep.Flap = append(rep.Flap, f...)
		}
	}
	if *doCPU {
		for _, plane := range strings.Split(*planes, ",") {
			c, err := cpuRun(ctx, plane)
			if err != nil {
				log.Fatalf("cpu: %v", err)
			}
			rep.CPU = append(rep.CPU, c)
		}
	}
	rep.Finished = time.Now().UTC()
	if err := results.Write(*outDir, *outName, rep, rep.markdown()); err != nil {
		log.Fatal(err)
	}
}

type runResult struct {
	Plane, Fault  string
	Detect        float64 // s from fault to the down event; -1: not detected
	Recover       float64 // s from the repair to the up event
	Requests      int
	FailBefore    int // requests started between the fault and its detection that failed
	FailAfter     int // started after detection (before the repair) that failed
	FailRecovered int // started after the repair that failed
	Reason        string
	// Transitions of the broken backend while the fault lasted (a steady
	// detection is 1: down; with loss, each return and new fall is a
	// flap), and of the healthy backends (false alarms) over the run.
	VictimTransitions int
	OtherTransitions  int
	FaultSeconds      float64 // how long the fault lasted
}

type cpuResult struct {
	Plane     string
	Backends  int
	Seconds   int
	Idle      []float64 // the same farms without checks: daemon CPU share of one core
	MachineId []float64 // whole machine CPU (of 2 cores, in cores), idle
	// With -steer: the daemon's BPF programs' run time (share of one
	// core) in each idle sample.
	IdleBPF  []float64 `json:",omitempty"`
	Steered  bool      `json:",omitempty"`
	Variants []cpuVariant
}

// cpuVariant is one kind of check measured.
type cpuVariant struct {
	Name      string    // connect, half-open
	Check     string    // the check object
	Checked   []float64 // daemon CPU share of one core while checking, per sample
	User      []float64 // of which user space
	ChecksPS  []float64 // checks per second counted in the API
	FailPS    []float64 // failed checks per second
	MachineCk []float64 // whole machine CPU (of 2 cores, in cores) while checking
	// With -steer: the daemon's BPF programs' run time (share of one
	// core) while checking, per sample.
	BPF []float64 `json:",omitempty"`
	// With -perf: the profiled sample's shares by whose work (perfShares)
	// and its number of samples.
	Perf        map[string]float64 `json:",omitempty"`
	PerfSamples int                `json:",omitempty"`
}

type report struct {
	Started, Finished time.Time
	Check             string
	Bound             float64
	Runs              []runResult
	CPU               []cpuResult
	Flap              []flapResult
}

// flapResult: transitions of healthy backends under one check, with the
// machine idle and under CPU load.
type flapResult struct {
	Plane, Check  string
	Backends      int
	Seconds       int
	Hogs          int
	IdleChecks    uint64
	IdleDowns     int
	LoadChecks    uint64
	LoadDowns     int
	LoadFails     uint64 // failed checks under load
	IdleFails     uint64
	MachineIdle   float64 // cores busy
	MachineLoaded float64
	LoadReasons   []string
}

// env is one topology with a daemon.
type env struct {
	t      *topo.Topology
	daemon *exec.Cmd
	state  string
	c      *client.Client
	client netns.NsHandle
}

func newEnv(ctx context.Context, plane string, extra int) (*env, error) {
	t, err := topo.New(ctx, topo.Options{Prefix: *prefix, Echo: abs(*echoBin), ExtraAddrs: extra})
	if err != nil {
		return nil, err
	}
	e := &env{t: t}
	e.state, err = os.MkdirTemp("", "xlb-bench-health-")
	if err != nil {
		e.close()
		return nil, err
	}
	args := []string{"netns", "exec", t.Name("lb")}
	if *steer && extra > 0 { // the CPU part: the daemon on CPU 0 (taskset execs it: same pid)
		args = append(args, "taskset", "-c", "0")
	}
	args = append(args, abs(*xlbBin), "daemon", "--listen", "127.0.0.1:5555",
		"--state-dir", e.state, "--dataplane", plane)
	if plane == "ebpf" {
		args = append(args, "--pin-path", "/sys/fs/bpf/"+t.Name("lb"), "--interfaces", "eth0,br0")
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), "XLB_KEY="+key)
	logf, err := os.Create(filepath.Join(e.state, "daemon.log"))
	if err != nil {
		e.close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.close()
		return nil, err
	}
	e.daemon = cmd
	e.c = client.New("unix:"+filepath.Join(e.state, "api.sock"), key, nil)
	for range 200 {
		if _, err := e.c.Version(ctx); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := e.c.Version(ctx); err != nil {
		e.close()
		return nil, fmt.Errorf("daemon did not start: %w", err)
	}
	if e.client, err = netns.GetFromName(t.Name("client")); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	if e.daemon != nil {
		syscall.Kill(-e.daemon.Process.Pid, syscall.SIGKILL)
		e.daemon.Wait()
	}
	if e.client > 0 {
		e.client.Close()
	}
	e.t.Close()
	if e.state != "" {
		if os.Getenv("KEEP_STATE") == "" {
			os.RemoveAll(e.state)
		}
	}
	os.RemoveAll("/sys/fs/bpf/" + e.t.Name("lb"))
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// request sends one HTTP request to the VIP from the client namespace.
func (e *env) request() bool {
	var c net.Conn
	err := inNS(e.client, func() error {
		var err error
		c, err = net.DialTimeout("tcp", topo.VIP+":80", 2*time.Second)
		return err
	})
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.Contains(line, " 200 ")
}

func inNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}

type sample struct {
	start time.Time
	ok    bool
}

// load sends requests at -rate until stop is closed; the samples come
// back on the returned channel's close.
func (e *env) load(stop <-chan struct{}) func() []sample {
	var mu sync.Mutex
	var out []sample
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second / time.Duration(*rate))
		defer tick.Stop()
		for n := 0; n < 120*(*rate); n++ { // bounded: 2 minutes at most
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := sample{start: time.Now()}
				s.ok = e.request()
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
			}()
		}
	}()
	return func() []sample {
		<-done
		wg.Wait()
		return out
	}
}

// watch collects the daemon's events: find waits for one, all returns
// those seen so far.
func (e *env) watch(ctx context.Context) (find func(farm, backend, state string, after time.Time, wait time.Duration) (events.Event, bool), all func() []events.Event, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var evs []events.Event
	got := make(chan struct{}, 1)
	go e.c.Events(ctx, 0, func(ev events.Event) error {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
		select {
		case got <- struct{}{}:
		default:
		}
		return nil
	})
	all = func() []events.Event {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(evs)
	}
	find = func(farm, backend, state string, after time.Time, wait time.Duration) (events.Event, bool) {
		deadline := time.After(wait)
		for {
			mu.Lock()
			for _, ev := range evs {
				if ev.Kind == events.KindHealth && ev.Farm == farm && ev.Backend == backend && ev.State == state && !ev.Time.Before(after) {
					mu.Unlock()
					return ev, true
				}
			}
			mu.Unlock()
			select {
			case <-got:
			case <-deadline:
				return events.Event{}, false
			}
		}
	}
	return find, all, cancel
}

const victim = 1 // be2

func faultRun(ctx context.Context, plane, fault string) (runResult, error) {
	r := runResult{Plane: plane, Fault: fault, Detect: -1, Recover: -1}
	e, err := newEnv(ctx, plane, 0)
	if err != nil {
		return r, err
	}
	defer e.close()
	farm := fmt.Sprintf(`{"name":"web","virtual-addr":%q,"virtual-ports":"80","scheduler":"rr",
		"check":{"type":"http","path":"/","inter":%q,"timeout":%q,"rise":"%d","fall":"%d"},"backends":[`,
		topo.VIP, inter.String(), timeout.String(), rise, fall)
	for i, ip := range topo.Backends {
		if i > 0 {
			farm += ","
		}
		farm += fmt.Sprintf(`{"name":"be%d","ip-addr":%q,"port":"8080"}`, i+1, ip)
	}
	farm += "]}"
	if err := e.c.PutFarm(ctx, "web", []byte(farm)); err != nil {
		return r, err
	}
	find, all, cancel := e.watch(ctx)
	defer cancel()
	time.Sleep(2 * inter) // every backend checked at least once
	for range 20 {
		if e.request() {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop := make(chan struct{})
	collect := e.load(stop)
	time.Sleep(time.Second)
	be := fmt.Sprintf("be%d", victim+1)
	ns := e.t.Name(be)
	srv := e.t.Servers[victim]
	t0 := time.Now()
	switch fault {
	case "kill":
		err = srv.Process.Signal(syscall.SIGKILL)
	case "stop":
		err = srv.Process.Signal(syscall.SIGSTOP)
	case "503":
		err = srv.Process.Signal(syscall.SIGUSR1)
	case "loss":
		err = e.t.RunInput(ctx, be, "table inet xlbloss {\n chain out {\n  type filter hook output priority 0;\n  numgen random mod 100 lt 30 drop\n }\n}\n", "nft", "-f", "-")
	default:
		err = fmt.Errorf("unknown fault %q", fault)
	}
	if err != nil {
		close(stop)
		collect()
		return r, err
	}
	var tDown time.Time
	if ev, ok := find("web", be, "down", t0, 20*time.Second); ok {
		tDown = ev.Time
		r.Detect = ev.Time.Sub(t0).Seconds()
		r.Reason = ev.Reason
	}
	time.Sleep(3 * time.Second)
	if fault == "loss" {
		// Loss lasts a fixed 20 s: its flaps are counted over that.
		time.Sleep(time.Until(t0.Add(20 * time.Second)))
	}
	t1 := time.Now()
	r.FaultSeconds = t1.Sub(t0).Seconds()
	switch fault {
	case "kill":
		_, err = e.t.Start(be, nil, abs(*echoBin), "-name", "backend-2", "-listen", topo.Backends[victim]+":8080")
	case "stop":
		err = srv.Process.Signal(syscall.SIGCONT)
	case "503":
		err = srv.Process.Signal(syscall.SIGUSR1)
	case "loss":
		err = e.t.Run(ctx, be, "nft", "delete", "table", "inet", "xlbloss")
	}
	_ = ns
	if err != nil {
		close(stop)
		collect()
		return r, err
	}
	if ev, ok := find("web", be, "up", t1, 20*time.Second); ok {
		r.Recover = ev.Time.Sub(t1).Seconds()
	}
	time.Sleep(3 * time.Second)
	for _, ev := range all() {
		if ev.Kind != events.KindHealth || ev.Farm != "web" {
			continue
		}
		switch {
		case ev.Backend != be:
			r.OtherTransitions++
		case !ev.Time.Before(t0) && ev.Time.Before(t1):
			r.VictimTransitions++
		}
	}
	close(stop)
	for _, s := range collect() {
		r.Requests++
		if s.ok {
			continue
		}
		switch {
		case !s.start.Before(t1):
			r.FailRecovered++
		case !tDown.IsZero() && !s.start.Before(tDown):
			r.FailAfter++
		case !s.start.Before(t0):
			r.FailBefore++
		}
	}
	return r, nil
}

// procCPU returns the user and system CPU time of a process and its
// threads.
func procCPU(pid int) (user, sys time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut) * time.Second / 100, time.Duration(st) * time.Second / 100 // USER_HZ 100
}

// machineCPU returns the busy time of every CPU of the machine.
func machineCPU() time.Duration {
	b, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)[1:]
	var busy int64
	for i, v := range f {
		var n int64
		fmt.Sscan(v, &n)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100
}

func cpuRun(ctx context.Context, plane string) (cpuResult, error) {
	res := cpuResult{Plane: plane, Backends: *cpuBE, Seconds: *cpuSecs}
	e, err := newEnv(ctx, plane, 100)
	if err != nil {
		return res, err
	}
	defer e.close()
	// The daemon's pid: `ip netns exec` execs it.
	pid := e.daemon.Process.Pid
	if *steer {
		res.Steered = true
		if err := steerRPS(ctx, e.t); err != nil {
			return res, err
		}
		restore, err := bpfStats(ctx)
		if err != nil {
			return res, err
		}
		defer restore()
	}
	var lastBPF float64
	const perFarm = 1000
	farms := (*cpuBE + perFarm - 1) / perFarm
	put := func(check string) error {
		var b strings.Builder
		b.WriteString(`{"farms":[`)
		n := 0
		for f := range farms {
			if f > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"f%d","virtual-addr":"10.99.1.%d","virtual-ports":"80","check":%s,"backends":[`, f, f+1, check)
			for i := 0; i < perFarm && n < *cpuBE; i++ {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"name":"b%d","ip-addr":%q,"port":"8080"}`, i, topo.ExtraAddr(n%100))
				n++
			}
			b.WriteString("]}")
		}
		b.WriteString("]}")
		return e.c.PutFarms(ctx, []byte(b.String()))
	}
	checks := func() (uint64, uint64, error) {
		var total, failed uint64
		for f := range farms {
			raw, err := e.c.GetFarmJSON(ctx, fmt.Sprintf("f%d", f))
			if err != nil {
				return 0, 0, err
			}
			var doc struct {
				Farms []struct {
					Backends []struct {
						Last struct{ Checks, Failures string } `json:"last-check"`
					}
				}
			}
			if err := json.Unmarshal(raw, &doc); err != nil {
				return 0, 0, err
			}
			for _, b := range doc.Farms[0].Backends {
				var n, fl uint64
				fmt.Sscan(b.Last.Checks, &n)
				fmt.Sscan(b.Last.Failures, &fl)
				total += n
				failed += fl
			}
		}
		return total, failed, nil
	}
	var lastUser float64
	sampleCPU := func() (float64, float64) {
		b0 := bpfRunTime(pid)
		u0, s0 := procCPU(pid)
		m0 := machineCPU()
		t0 := time.Now()
		time.Sleep(time.Duration(*cpuSecs) * time.Second)
		u1, s1 := procCPU(pid)
		m1 := machineCPU()
		b1 := bpfRunTime(pid)
		el := time.Since(t0).Seconds()
		lastUser = (u1 - u0).Seconds() / el
		lastBPF = (b1 - b0).Seconds() / el
		return (u1 - u0 + s1 - s0).Seconds() / el, (m1 - m0).Seconds() / el
	}
	kinds := map[string]string{
		"connect":   `{"type":"tcp","inter":"1s","timeout":"500ms","half-open":"off"}`,
		"half-open": `{"type":"tcp","inter":"1s","timeout":"500ms","half-open":"on"}`,
	}
	for _, k := range strings.Split(*cpuKinds, ",") {
		if kinds[k] == "" {
			return res, fmt.Errorf("-cpu-checks %q: allowed values are connect, half-open", k)
		}
		res.Variants = append(res.Variants, cpuVariant{Name: k, Check: kinds[k]})
	}
	for run := range *cpuRuns {
		if err := put("null"); err != nil {
			return res, err
		}
		time.Sleep(2 * time.Second)
		var perf *exec.Cmd
		if *perfIdle != "" && run == 0 {
			perf = exec.Command("perf", "record", "-q", "-g", "-p", fmt.Sprint(pid), "-o", *perfIdle+"."+plane, "--", "sleep", fmt.Sprint(*cpuSecs))
			if err := perf.Start(); err != nil {
				return res, fmt.Errorf("perf: %w", err)
			}
		}
		d, m := sampleCPU()
		if perf != nil {
			perf.Wait()
		}
		res.Idle, res.MachineId = append(res.Idle, d), append(res.MachineId, m)
		if *steer {
			res.IdleBPF = append(res.IdleBPF, lastBPF)
		}
		// The kinds take turns, in a different order each run.
		for j := range res.Variants {
			v := &res.Variants[(j+run)%len(res.Variants)]
			if err := put(v.Check); err != nil {
				return res, err
			}
			time.Sleep(3 * time.Second) // the first round spreads over a second
			n0, f0, err := checks()
			if err != nil {
				return res, err
			}
			t0 := time.Now()
			var perf *exec.Cmd
			if *perfOut != "" && run == 0 {
				perf = exec.Command("perf", "record", "-q", "-g", "-p", fmt.Sprint(pid), "-o", *perfOut+"."+plane+"."+v.Name, "--", "sleep", fmt.Sprint(*cpuSecs))
				if err := perf.Start(); err != nil {
					return res, fmt.Errorf("perf: %w", err)
				}
			}
			d, m := sampleCPU()
			if perf != nil {
				perf.Wait()
				if v.Perf, v.PerfSamples, err = perfShares(*perfOut + "." + plane + "." + v.Name); err != nil {
					return res, err
				}
				log.Printf("perf %s %s: %d samples, shares %v", plane, v.Name, v.PerfSamples, v.Perf)
			}
			n1, f1, err := checks()
			if err != nil {
				return res, err
			}
			el := time.Since(t0).Seconds()
			v.Checked, v.MachineCk, v.User = append(v.Checked, d), append(v.MachineCk, m), append(v.User, lastUser)
			if *steer {
				v.BPF = append(v.BPF, lastBPF)
				log.Printf("cpu %s %s steered: daemon %.3f + its BPF programs %.3f = LB's own %.3f core (idle %.3f + %.3f)",
					plane, v.Name, d, lastBPF, d+lastBPF, res.Idle[len(res.Idle)-1], res.IdleBPF[len(res.IdleBPF)-1])
			}
			v.ChecksPS, v.FailPS = append(v.ChecksPS, float64(n1-n0)/el), append(v.FailPS, float64(f1-f0)/el)
			log.Printf("cpu %s %s: idle %.3f core, checking %d backends %.3f core (user %.3f; %.0f checks/s, %.0f failed/s); machine %.3f / %.3f cores",
				plane, v.Name, res.Idle[len(res.Idle)-1], *cpuBE, d, lastUser, v.ChecksPS[len(v.ChecksPS)-1], v.FailPS[len(v.FailPS)-1], m, res.MachineId[len(res.MachineId)-1])
		}
	}
	return res, nil
}

// flapRun checks 3 healthy backends with two checks (the bench's, and an
// aggressive one) for -flap-seconds with the machine idle, then as long
// with -flap-hogs busy loops running, and counts the down transitions:
// every one is a flap, as nothing is broken.
func flapRun(ctx context.Context, plane string) ([]flapResult, error) {
	e, err := newEnv(ctx, plane, 0)
	if err != nil {
		return nil, err
	}
	defer e.close()
	checks := []struct{ name, check string }{
		{"bench", fmt.Sprintf(`{"type":"http","path":"/","inter":%q,"timeout":%q,"rise":"%d","fall":"%d"}`, inter.String(), timeout.String(), rise, fall)},
		{"aggressive", `{"type":"tcp","inter":"100ms","timeout":"20ms","rise":"2","fall":"2"}`},
	}
	for i, c := range checks {
		farm := fmt.Sprintf(`{"name":"f%d","virtual-addr":"10.99.2.%d","virtual-ports":"80","check":%s,"backends":[`, i, i+1, c.check)
		for j, ip := range topo.Backends {
			if j > 0 {
				farm += ","
			}
			farm += fmt.Sprintf(`{"name":"be%d","ip-addr":%q,"port":"8080"}`, j+1, ip)
		}
		if err := e.c.PutFarm(ctx, fmt.Sprintf("f%d", i), []byte(farm+"]}")); err != nil {
			return nil, err
		}
	}
	var mu sync.Mutex
	var evs []events.Event
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go e.c.Events(wctx, 0, func(ev events.Event) error {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
		return nil
	})
	counts := func(farm string) (checks, fails uint64, err error) {
		raw, err := e.c.GetFarmJSON(ctx, farm)
		if err != nil {
			return 0, 0, err
		}
		var doc struct {
			Farms []struct {
				Backends []struct {
					Last struct{ Checks, Failures string } `json:"last-check"`
				}
			}
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return 0, 0, err
		}
		for _, b := range doc.Farms[0].Backends {
			var n, f uint64
			fmt.Sscan(b.Last.Checks, &n)
			fmt.Sscan(b.Last.Failures, &f)
			checks, fails = checks+n, fails+f
		}
		return checks, fails, nil
	}
	time.Sleep(3 * time.Second)
	out := make([]flapResult, len(checks))
	sample := func(loaded bool) error {
		var n0, f0 [2]uint64
		for i := range checks {
			var err error
			if n0[i], f0[i], err = counts(fmt.Sprintf("f%d", i)); err != nil {
				return err
			}
		}
		mu.Lock()
		first := len(evs)
		mu.Unlock()
		m0, t0 := machineCPU(), time.Now()
		var hogs []*exec.Cmd
		if loaded {
			for range *flapHogs {
				// Bounded: each loop ends after the sample.
				h := exec.Command("timeout", fmt.Sprint(*flapSecs), "sh", "-c", "while :; do :; done")
				// A group of its own, killed whole below: killing timeout
				// alone with SIGKILL left its shell spinning forever.
				h.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := h.Start(); err != nil {
					return err
				}
				hogs = append(hogs, h)
			}
		}
		time.Sleep(time.Duration(*flapSecs) * time.Second)
		for _, h := range hogs {
			syscall.Kill(-h.Process.Pid, syscall.SIGKILL)
			h.Wait()
		}
		busy := (machineCPU() - m0).Seconds() / time.Since(t0).Seconds()
		mu.Lock()
		got := append([]events.Event(nil), evs[first:]...)
		mu.Unlock()
		for i := range checks {
			n1, f1, err := counts(fmt.Sprintf("f%d", i))
			if err != nil {
				return err
			}
			r := &out[i]
			r.Plane, r.Check, r.Backends, r.Seconds, r.Hogs = plane, checks[i].check, len(topo.Backends), *flapSecs, *flapHogs
			downs := 0
			var reasons []string
			for _, ev := range got {
				if ev.Kind == events.KindHealth && ev.State == "down" && ev.Farm == fmt.Sprintf("f%d", i) {
					downs++
					reasons = append(reasons, ev.Reason)
				}
			}
			if loaded {
				r.LoadChecks, r.LoadFails, r.LoadDowns, r.MachineLoaded, r.LoadReasons = n1-n0[i], f1-f0[i], downs, busy, reasons
			} else {
				r.IdleChecks, r.IdleFails, r.IdleDowns, r.MachineIdle = n1-n0[i], f1-f0[i], downs, busy
			}
		}
		return nil
	}
	if err := sample(false); err != nil {
		return nil, err
	}
	if err := sample(true); err != nil {
		return nil, err
	}
	for _, r := range out {
		log.Printf("flap %s %s: idle %d checks %d failed %d down (machine %.2f cores); %d hogs: %d checks %d failed %d down (machine %.2f cores)",
			plane, r.Check, r.IdleChecks, r.IdleFails, r.IdleDowns, r.MachineIdle, r.Hogs, r.LoadChecks, r.LoadFails, r.LoadDowns, r.MachineLoaded)
	}
	return out, nil
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Health checks: detection, client failures, CPU\n\n")
	if len(r.Runs) == 0 {
		fmt.Fprintf(&b, "`bench/health`, %s to %s UTC.\n", r.Started.Format("2006-01-02 15:04"), r.Finished.Format("15:04"))
	} else {
		fmt.Fprintf(&b, "`bench/health` (`make bench-health`), %s to %s UTC. Check: %s; bound fall × inter + timeout = %.1f s, target bound + 0.1 s. "+
			"Client: HTTP requests to the VIP at %d/s (new connection each, 2 s timeout), round robin over 3 backends; the fault hits be2. "+
			"Detection: from the fault to the daemon's `down` event (sent once the data plane has the change). "+
			"Failures are counted by when the request started: between the fault and its detection, after detection (until the repair), and after the repair. "+
			"Faults: kill (SIGKILL: connects refused), stop (SIGSTOP: requests hang), 503 (HTTP 503 while TCP connects), loss (30 %% of be2's outgoing packets dropped by an nft `numgen random` rule in its namespace, for 20 s: this kernel has no sch_netem). "+
			"Transitions: be2's health events while the fault lasted (1: one down; more: it came back and fell again, a flap), and the healthy backends' over the whole run (false alarms).\n\n",
			r.Started.Format("2006-01-02 15:04"), r.Finished.Format("15:04"), r.Check, r.Bound, *rate)
	}
	type key struct{ plane, fault string }
	var keys []key
	by := map[key][]runResult{}
	for _, x := range r.Runs {
		k := key{x.Plane, x.Fault}
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], x)
	}
	if len(keys) > 0 {
		b.WriteString("| plane | fault | runs | detection median (min-max) s | within bound+0.1 s | recovery median s | failed before detection | failed after detection | failed after repair | requests | transitions of be2 during the fault, per run | of the healthy backends | reason |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	}
	for _, k := range keys {
		xs := by[k]
		var det, rec []float64
		within, fb, fa, fr, n, missed, others := 0, 0, 0, 0, 0, 0, 0
		var victim []string
		reasons := map[string]bool{}
		for _, x := range xs {
			victim = append(victim, fmt.Sprint(x.VictimTransitions))
			others += x.OtherTransitions
			if x.Detect < 0 {
				missed++
			} else {
				det = append(det, x.Detect)
				if x.Detect <= r.Bound+0.1 {
					within++
				}
			}
			if x.Recover >= 0 {
				rec = append(rec, x.Recover)
			}
			fb, fa, fr, n = fb+x.FailBefore, fa+x.FailAfter, fr+x.FailRecovered, n+x.Requests
			if x.Reason != "" {
				reasons[x.Reason] = true
			}
		}
		ds, rs := stats.Summarize(det), stats.Summarize(rec)
		var rl []string
		for k := range reasons {
			rl = append(rl, k)
		}
		slices.Sort(rl)
		miss := ""
		if missed > 0 {
			miss = fmt.Sprintf(" (%d not detected in 20 s)", missed)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f (%.2f-%.2f)%s | %d/%d | %.2f | %d | %d | %d | %d | %s | %d | %s |\n",
			k.plane, k.fault, len(xs), ds.Median, ds.Min, ds.Max, miss, within, len(xs), rs.Median, fb, fa, fr, n, strings.Join(victim, ", "), others, strings.Join(rl, "; "))
	}
	if len(r.Flap) > 0 {
		fmt.Fprintf(&b, "\n## Flapping under CPU load\n\n3 healthy backends, checked for %d s with the machine otherwise as it was, then for %d s with %d busy-looping processes (on 2 cores). "+
			"Nothing is broken: every down transition is a flap.\n\n", r.Flap[0].Seconds, r.Flap[0].Seconds, r.Flap[0].Hogs)
		b.WriteString("| plane | check | idle: checks / failed / down | machine busy | loaded: checks / failed / down | machine busy | reasons under load |\n|---|---|---|---|---|---|---|\n")
		for _, f := range r.Flap {
			reasons := map[string]int{}
			for _, x := range f.LoadReasons {
				reasons[x]++
			}
			var rl []string
			for k, n := range reasons {
				rl = append(rl, fmt.Sprintf("%s (%d)", k, n))
			}
			slices.Sort(rl)
			fmt.Fprintf(&b, "| %s | `%s` | %d / %d / %d | %.2f | %d / %d / %d | %.2f | %s |\n", f.Plane, f.Check, f.IdleChecks, f.IdleFails, f.IdleDowns, f.MachineIdle,
				f.LoadChecks, f.LoadFails, f.LoadDowns, f.MachineLoaded, strings.Join(rl, "; "))
		}
	}
	for _, c := range r.CPU {
		id, mi := stats.Summarize(c.Idle), stats.Summarize(c.MachineId)
		fmt.Fprintf(&b, "\n## CPU of %d backends checked every second (tcp, %s plane)\n\n", c.Backends, c.Plane)
		fmt.Fprintf(&b, "The daemon's own CPU (user + system, /proc/PID/stat, which includes the softirq work the kernel does in the daemon's context: "+
			"on veth that is also the backends' side of each handshake) over %d s samples, %d samples of each kind taking turns, "+
			"with the same %d backends in farms without checks as the baseline; the machine's busy CPU (/proc/stat, in cores of 2) "+
			"includes the backends' server accepting the connections.\n\n", c.Seconds, len(c.Idle), c.Backends)
		b.WriteString("| check | daemon CPU, share of one core: median (min-max) | of which user space | µs of daemon CPU per check | machine busy, cores | checks/s | failed/s |\n|---|---|---|---|---|---|---|\n")
		fmt.Fprintf(&b, "| none (baseline) | %.3f (%.3f-%.3f) | | | %.2f | 0 | 0 |\n", id.Median, id.Min, id.Max, mi.Median)
		for _, v := range c.Variants {
			ck, us, mc := stats.Summarize(v.Checked), stats.Summarize(v.User), stats.Summarize(v.MachineCk)
			ps, fs := stats.Summarize(v.ChecksPS), stats.Summarize(v.FailPS)
			fmt.Fprintf(&b, "| %s | %.3f (%.3f-%.3f) | %.3f | %.1f | %.2f | %.0f | %.0f |\n", v.Name, ck.Median, ck.Min, ck.Max, us.Median,
				(ck.Median-id.Median)/max(ps.Median, 1)*1e6, mc.Median, ps.Median, fs.Median)
		}
	}
	return b.String()
}
