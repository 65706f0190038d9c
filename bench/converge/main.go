// Command converge measures how long it takes from an API call until traffic
// follows it, not just until the call returns: the time from POST /farms
// until a new connection to the farm's VIP reaches a backend, and from
// DELETE until new connections are no longer served, for a farm with 10, 50
// and 100 backends while 0, 1,000 and 10,000 other farms exist.
//
// Baseline in the same run: a script that loads the same balancer with
// `nft -f` (one table, a numgen map of the backends) and deletes the table,
// timed the same way (process start included, as a script pays it).
//
// The topology is bench/internal/topo's: the xlb daemon runs in the lb
// namespace and listens on the lb's client-side address; the measuring loop
// runs in the client namespace (this program re-executed as `converge inner`),
// so the API call and the probes share one clock and one process. A probe is
// a TCP connect to VIP:80 with a 50 ms timeout, repeated until it succeeds
// (add) or fails (delete), bounded to 10 s. xlb commits a farm in one nft
// transaction, so the first backend reached means all of them are in place.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/xlb-lb/xlb/bench/internal/apicall"
	"github.com/xlb-lb/xlb/bench/internal/results"
	"github.com/xlb-lb/xlb/bench/internal/stats"
	"github.com/xlb-lb/xlb/bench/internal/topo"
)

const (
	apiKey   = "bench-key-not-secret"
	apiPort  = "5590"
	maxBacks = 100 // backend addresses the topology provides
)

type params struct {
	Runs     int    `json:"runs"`
	Existing []int  `json:"existing"`
	Backends []int  `json:"backends"`
	LBNS     string `json:"lb_ns"` // for the nft -f baseline
}

// result is one measurement's samples in ms.
type result struct {
	System   string        `json:"system"` // xlb or nft -f
	Op       string        `json:"op"`     // add or delete
	Existing int           `json:"existing_farms"`
	Backends int           `json:"backends"`
	Traffic  []float64     `json:"until_traffic_ms"`
	API      []float64     `json:"until_call_returns_ms,omitempty"`
	Sum      stats.Summary `json:"until_traffic"`
	SumAPI   stats.Summary `json:"until_call_returns"`
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("converge: ")
	if len(os.Args) > 1 && os.Args[1] == "inner" {
		if err := inner(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	xlb := flag.String("xlb", "bin/xlb", "xlb binary")
	echo := flag.String("echo", "bin/xlb-echo", "backend HTTP server binary")
	out := flag.String("out", "bench/results", "results directory")
	runs := flag.Int("runs", 30, "samples per measurement")
	existing := flag.String("existing", "0,1000,10000", "other farms present")
	backs := flag.String("backends", "10,50,100", "backends of the farm added and deleted")
	prefix := flag.String("prefix", fmt.Sprintf("xlbb-%d", os.Getpid()), "prefix of the namespaces it creates")
	flag.Parse()
	p := params{Runs: *runs, Existing: ints(*existing), Backends: ints(*backs)}
	for _, b := range p.Backends {
		if b < 1 || b > maxBacks {
			log.Fatalf("-backends: %d is not in 1..%d", b, maxBacks)
		}
	}
	if p.Runs < 1 {
		log.Fatal("-runs must be >= 1")
	}
	if os.Geteuid() != 0 {
		log.Fatal("run as root: it creates network namespaces")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *xlb, *echo, *out, *prefix, p); err != nil {
		log.Print(err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, xlb, echo, out, prefix string, p params) error {
	xlb, _ = filepath.Abs(xlb)
	echo, _ = filepath.Abs(echo)
	t, err := topo.New(ctx, topo.Options{Prefix: prefix, Echo: echo, ExtraAddrs: maxBacks})
	if err != nil {
		return err
	}
	defer t.Close()
	p.LBNS = t.Name("lb")
	// A probe to a VIP that is not (or no longer) balanced must fail at once,
	// not after its timeout: route the VIPs towards the backends and reset
	// every connection that reaches forwarding still addressed to a VIP
	// (balanced ones were rewritten at prerouting). A reset, unlike ICMP
	// unreachable, is not rate limited.
	if err := t.Run(ctx, "lb", "ip", "route", "add", "10.99.0.0/24", "dev", "br0"); err != nil {
		return err
	}
	reject := "table ip convprobe {\n\tchain probe {\n\t\ttype filter hook forward priority 0; policy accept;\n\t\tip daddr 10.99.0.0/24 meta l4proto tcp reject with tcp reset\n\t}\n}\n"
	if err := t.RunInput(ctx, "lb", reject, "nft", "-f", "-"); err != nil {
		return err
	}
	state, err := os.MkdirTemp("", "xlb-converge-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	if _, err := t.Start("lb", []string{"XLB_KEY=" + apiKey}, xlb, "daemon", "--listen", topo.LBClient+":"+apiPort,
		"--state-dir", state, "--log-level", "warn"); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	js, _ := json.Marshal(p)
	start := time.Now()
	raw, err := t.Output(ctx, "client", self, "inner", string(js))
	if err != nil {
		return err
	}
	var rs []result
	if err := json.Unmarshal(raw, &rs); err != nil {
		return fmt.Errorf("inner output: %w", err)
	}
	for i := range rs {
		rs[i].Sum = stats.Summarize(rs[i].Traffic)
		rs[i].SumAPI = stats.Summarize(rs[i].API)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	doc := map[string]any{
		"date":    time.Now().UTC().Format(time.RFC3339),
		"machine": machine(),
		"runs":    p.Runs,
		"notes": []string{
			"until_traffic: from just before the API call (or the nft process start) until a new TCP connection to the VIP is accepted by a backend (add) or is no longer served (delete); probes are connects with a 50 ms timeout, back to back, from the client namespace.",
			"until_call_returns: from the API call until its response (xlb only).",
			"nft -f baseline: `ip netns exec <lb> nft -f` of one table with a numgen map of the same backends (add), `nft delete table` (delete); the xlb farms present stay in the kernel meanwhile, and nft reads them into its cache on every start (with the default 32 tables, even at 0 farms: 32 tables, 512 maps), so the baseline pays for xlb's objects as well as its own; a script-driven balancer holding N farms of its own would pay for those instead.",
			fmt.Sprintf("wall time %s.", time.Since(start).Round(time.Second)),
		},
		"results": rs,
	}
	return results.Write(out, "converge", doc, markdown(rs, doc["notes"].([]string)))
}

func markdown(rs []result, notes []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Control plane: time until traffic follows the change\n\nMeasured %s on %s.\n\n", time.Now().UTC().Format("2006-01-02"), machine())
	b.WriteString("| op | farms present | backends | xlb until traffic, median ms (min-max) | xlb call returns, median ms | nft -f until traffic, median ms (min-max) | ratio xlb / nft -f | xlb vs nft -f, 95 % conf. |\n|---|---|---|---|---|---|---|---|\n")
	find := func(sys, op string, e, n int) *result {
		for i := range rs {
			if rs[i].System == sys && rs[i].Op == op && rs[i].Existing == e && rs[i].Backends == n {
				return &rs[i]
			}
		}
		return nil
	}
	for _, r := range rs {
		if r.System != "xlb" {
			continue
		}
		base := find("nft -f", r.Op, r.Existing, r.Backends)
		if base == nil {
			continue
		}
		conf := "n/a"
		if d, ok := stats.Compare(r.Traffic, base.Traffic); ok {
			conf = fmt.Sprintf("%+.1f %% ± %.1f %%", d.Percent, d.PlusMinus)
			if !d.Significant {
				conf += " (no difference proven)"
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.2f (%.2f-%.2f) | %.2f | %.2f (%.2f-%.2f) | %.3f | %s |\n",
			r.Op, r.Existing, r.Backends, r.Sum.Median, r.Sum.Min, r.Sum.Max, r.SumAPI.Median,
			base.Sum.Median, base.Sum.Min, base.Sum.Max, r.Sum.Median/base.Sum.Median, conf)
	}
	b.WriteString("\n")
	for _, n := range notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// inner runs in the client namespace: every measurement, results as JSON on
// stdout.
func inner(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: converge inner PARAMS-JSON")
	}
	var p params
	if err := json.Unmarshal([]byte(args[0]), &p); err != nil {
		return err
	}
	api := "http://" + topo.LBClient + ":" + apiPort
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := waitReady(ctx, api); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "xlb-converge-nft-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var rs []result
	for _, e := range p.Existing {
		if err := call(ctx, api, "PUT", "/state", others(e)); err != nil {
			return err
		}
		for _, n := range p.Backends {
			xa := result{System: "xlb", Op: "add", Existing: e, Backends: n}
			xd := result{System: "xlb", Op: "delete", Existing: e, Backends: n}
			na := result{System: "nft -f", Op: "add", Existing: e, Backends: n}
			nd := result{System: "nft -f", Op: "delete", Existing: e, Backends: n}
			body := farm(n)
			rules := filepath.Join(tmp, "add.nft")
			if err := os.WriteFile(rules, []byte(nftRules(n)), 0o644); err != nil {
				return err
			}
			for range p.Runs {
				// xlb add, then delete.
				t0 := time.Now()
				if err := call(ctx, api, "POST", "/farms", body); err != nil {
					return err
				}
				tAPI := time.Since(t0)
				if err := probe(ctx, true); err != nil {
					return fmt.Errorf("xlb add, %d backends, %d farms: %w", n, e, err)
				}
				xa.Traffic = append(xa.Traffic, ms(time.Since(t0)))
				xa.API = append(xa.API, ms(tAPI))

				t0 = time.Now()
				if err := call(ctx, api, "DELETE", "/farms/conv", nil); err != nil {
					return err
				}
				tAPI = time.Since(t0)
				if err := probe(ctx, false); err != nil {
					return fmt.Errorf("xlb delete, %d backends, %d farms: %w", n, e, err)
				}
				xd.Traffic = append(xd.Traffic, ms(time.Since(t0)))
				xd.API = append(xd.API, ms(tAPI))

				// The same with nft -f.
				t0 = time.Now()
				if err := nft(ctx, p.LBNS, "-f", rules); err != nil {
					return err
				}
				if err := probe(ctx, true); err != nil {
					return fmt.Errorf("nft -f add, %d backends: %w", n, err)
				}
				na.Traffic = append(na.Traffic, ms(time.Since(t0)))
				t0 = time.Now()
				if err := nft(ctx, p.LBNS, "delete", "table", "ip", "convbase"); err != nil {
					return err
				}
				if err := probe(ctx, false); err != nil {
					return fmt.Errorf("nft delete, %d backends: %w", n, err)
				}
				nd.Traffic = append(nd.Traffic, ms(time.Since(t0)))
			}
			rs = append(rs, xa, xd, na, nd)
			fmt.Fprintf(os.Stderr, "converge: %d farms, %d backends: xlb add %.1f ms (call %.1f), delete %.1f ms; nft -f add %.1f ms, delete %.1f ms (medians)\n",
				e, n, stats.Summarize(xa.Traffic).Median, stats.Summarize(xa.API).Median, stats.Summarize(xd.Traffic).Median,
				stats.Summarize(na.Traffic).Median, stats.Summarize(nd.Traffic).Median)
		}
	}
	return json.NewEncoder(os.Stdout).Encode(rs)
}

// probe connects to VIP:80 back to back until a connection is accepted
// (want true) or fails (want false), for at most 10 s.
func probe(ctx context.Context, want bool) error {
	d := net.Dialer{Timeout: 50 * time.Millisecond}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := d.DialContext(ctx, "tcp4", topo.VIP+":80")
		if err == nil {
			// Reset rather than close: no TIME_WAIT pile-up over many probes.
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		if (err == nil) == want {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(200 * time.Microsecond)
	}
	if want {
		return errors.New("no connection reached a backend within 10 s")
	}
	return errors.New("connections were still served 10 s after the delete")
}

func nft(ctx context.Context, lbns string, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", lbns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// farm is the POST body of farm "conv" on the VIP with n backends.
func farm(n int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"farms":[{"name":"conv","virtual-addr":%q,"virtual-ports":"80","mode":"snat","scheduler":"rr","backends":[`, topo.VIP)
	for k := range n {
		if k > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"b%d","ip-addr":%q,"port":"8080"}`, k, topo.ExtraAddr(k))
	}
	b.WriteString("]}]}")
	return b.Bytes()
}

// nftRules is the baseline balancer for the same n backends.
func nftRules(n int) string {
	var m []string
	for k := range n {
		m = append(m, fmt.Sprintf("%d : %s . 8080", k, topo.ExtraAddr(k)))
	}
	return fmt.Sprintf(`table ip convbase {
	chain pre {
		type nat hook prerouting priority dstnat - 1; policy accept;
		ip daddr %s tcp dport 80 dnat ip addr . port to numgen inc mod %d map { %s }
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		ip daddr 10.200.0.0/24 ct status dnat masquerade
	}
}
`, topo.VIP, n, strings.Join(m, ", "))
}

// others is the state of e farms x 1 backend on other VIPs (10.64.0.0/16).
func others(e int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"farms":[`)
	for i := range e {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"o%05d","virtual-addr":"10.64.%d.%d","virtual-ports":"80","backends":[{"name":"b0","ip-addr":"172.16.%d.%d","port":"8080"}]}`,
			i, i>>8, i&255, i/250, i%250+1)
	}
	b.WriteString("]}")
	return b.Bytes()
}

var client = &http.Client{Timeout: 5 * time.Minute}

func call(ctx context.Context, api, method, path string, body []byte) error {
	return apicall.Client{HTTP: client, Base: api, Key: apiKey}.Call(ctx, method, path, body)
}

func waitReady(ctx context.Context, api string) error {
	return apicall.Client{HTTP: client, Base: api, Key: apiKey}.WaitReady(ctx)
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscan(f, &n); err != nil || n < 0 {
			log.Fatalf("%q is not a count", f)
		}
		out = append(out, n)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func machine() string {
	k, _ := exec.Command("uname", "-r").Output()
	n, _ := exec.Command("nproc").Output()
	return fmt.Sprintf("Linux %s, %s CPUs", strings.TrimSpace(string(k)), strings.TrimSpace(string(n)))
}
