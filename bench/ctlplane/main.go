// Command ctlplane measures xlb's control plane against a baseline measured in
// the same run, as the foundation issue asks:
//
//   - one API call that adds a farm with 100 backends, with 0, 1,000 and
//     10,000 farms present; baseline: one `nft -f` of the same farm's rules
//     (what a tool that drives the nft binary, as nftlb's scripts do, pays);
//   - one bulk POST of 1,000 farms x 4 backends; baseline: one `nft -f` of the
//     same 1,000 farms;
//   - `xlb dump`, `xlb list -n`, `xlb save` and `xlb restore` as whole
//     processes (hyperfine) for the patched ipvsadm's matrix of farms x
//     backends (-matrix: 1000x4, 2000x2, 8000x2, 16000x1, 100x100, and 8000
//     VIP + 8000 firewall-mark farms); baseline:
//     `nft list ruleset` of that state (xlb's tables: the namespace holds
//     nothing else), and for restore one `nft -f`
//     of the same farms.
//
// It must run inside a network namespace of its own (bench/run.sh does that):
// it starts an xlb daemon there and programs that namespace's nftables.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/xlb-lb/xlb/bench/internal/results"
	"github.com/xlb-lb/xlb/bench/internal/stats"
)

var (
	xlbBin  = flag.String("xlb", "bin/xlb", "xlb binary")
	out     = flag.String("out", "bench/results", "results directory")
	runs    = flag.Int("runs", 30, "samples per measurement")
	logLvl  = flag.String("daemon-log-level", "error", "the daemon's --log-level (debug: its phase timings of each change, on stderr)")
	sizes   = flag.String("existing", "0,1000,10000", "farm counts present while adding one farm")
	exBack  = flag.String("existing-backends", "1,4", "backends of each farm present while adding one farm (each value is its own set of rows)")
	dumpN   = flag.Int("dump-farms", 0, "deprecated: same as -matrix Nx1")
	matrix  = flag.String("matrix", "1000x4,2000x2,8000x2,16000x1,100x100,8000x1+8000fw", "farms x backends states for dump, list -n, save and restore; +Nfw adds N firewall-mark farms with as many backends")
	apiAddr = "127.0.0.1:5590"
	// sockPath is the daemon's API socket, in its state directory (set in main).
	sockPath string
	key      = "bench-key-not-secret"
)

type result struct {
	Name     string    `json:"name"`
	Unit     string    `json:"unit"`
	Samples  []float64 `json:"samples"`
	Median   float64   `json:"median"`
	P25      float64   `json:"p25"`
	P75      float64   `json:"p75"`
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	Baseline string    `json:"baseline,omitempty"`
	BaseMed  float64   `json:"baseline_median,omitempty"`
	Ratio    float64   `json:"ratio_to_baseline,omitempty"`
}

func summarize(name string, samples []float64) result {
	s := slices.Clone(samples)
	slices.Sort(s)
	q := func(p float64) float64 { return s[int(p*float64(len(s)-1)+0.5)] }
	return result{Name: name, Unit: "ms", Samples: samples, Median: q(0.5), P25: q(0.25), P75: q(0.75), Min: s[0], Max: s[len(s)-1]}
}

func withBaseline(r result, base result) result {
	r.Baseline = base.Name
	r.BaseMed = base.Median
	r.Ratio = r.Median / base.Median
	return r
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	state, err := os.MkdirTemp("", "xlb-bench-state")
	must(err)
	defer os.RemoveAll(state)

	sockPath = filepath.Join(state, "api.sock")
	daemon := exec.CommandContext(ctx, *xlbBin, "daemon", "--listen", apiAddr, "--socket", sockPath, "--state-dir", state, "--log-level", *logLvl)
	daemon.Env = append(os.Environ(), "XLB_KEY="+key)
	daemon.Stderr = os.Stderr
	must(daemon.Start())
	defer func() { daemon.Process.Kill(); daemon.Wait() }()
	waitReady()

	if *onlyNftlb {
		rs := nftlbResults()
		must(results.Write(*out, "nftlb-baseline", rs, markdown(rs)))
		return
	}

	var rs []result
	for _, eb := range parseInts(*exBack) {
		for _, n := range parseInts(*sizes) {
			if n == 0 && eb != parseInts(*exBack)[0] {
				continue // no farms present: the same row as the first population's
			}
			rs = append(rs, addRows(n, eb)...)
		}
	}

	restore(0, 1)
	var bulk, bulkBase []float64
	for range min(*runs, 7) {
		body := farmsJSON("bulk", 1000, 4, 300)
		t := time.Now()
		call("POST", "/farms", body)
		bulk = append(bulk, ms(time.Since(t)))
		restore(0, 1)
		bulkBase = append(bulkBase, nftBaseline("bulk", 1000, 4))
	}
	bb := summarize("nft -f: 1000 farms x 4 backends", bulkBase)
	rs = append(rs, withBaseline(summarize("API bulk POST 1000 farms x 4 backends", bulk), bb), bb)
	log.Printf("bulk 1000x4: median %.1f ms", rs[len(rs)-2].Median)

	m := *matrix
	if *dumpN > 0 {
		m = fmt.Sprintf("%dx1", *dumpN)
	}
	for _, e := range strings.Split(m, ",") {
		var n, b, fw int
		vip, mark, _ := strings.Cut(e, "+")
		if _, err := fmt.Sscanf(vip, "%dx%d", &n, &b); err != nil || n < 1 || b < 1 {
			log.Fatalf("-matrix: %q is not FARMSxBACKENDS[+MARKFARMSfw]", e)
		}
		if mark != "" {
			if _, err := fmt.Sscanf(mark, "%dfw", &fw); err != nil || fw < 1 {
				log.Fatalf("-matrix: %q is not FARMSxBACKENDS[+MARKFARMSfw]", e)
			}
		}
		restoreMixed(n, b, fw)
		rs = append(rs, hyperfine(n, b, fw)...)
	}
	restore(0, 1)
	rs = append(rs, nftlbResults()...)

	must(results.Write(*out, "control-plane", rs, markdown(rs)))
}

// addRows times the API call that adds a farm of 100 backends while n farms
// of eb backends each are present, against nft -f of the same rules.
func addRows(n, eb int) []result {
	restore(n, eb)
	present := fmt.Sprintf("%d farms present", n)
	if eb != 1 && n > 0 {
		present = fmt.Sprintf("%d farms of %d backends present", n, eb)
	}
	var xs, bs []float64
	for i := range *runs {
		body := farmsJSON(fmt.Sprintf("new%03d", i), 1, 100, 200)
		t := time.Now()
		call("POST", "/farms", body)
		xs = append(xs, ms(time.Since(t)))
		call("DELETE", "/farms/new"+fmt.Sprintf("%03d", i)+"00000", nil)
		bs = append(bs, nftBaseline(fmt.Sprintf("b%d", i), 1, 100))
	}
	base := summarize(fmt.Sprintf("nft -f: one farm x 100 backends (%s in xlb)", present), bs)
	r := withBaseline(summarize("API add farm x 100 backends, "+present, xs), base)
	log.Printf("add farm x100 at %s: median %.2f ms", present, r.Median)
	return []result{r, base}
}

func markdown(rs []result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s (2 cores), %d samples each unless noted.\n\n", time.Now().UTC().Format("2006-01-02"), kernel(), *runs)
	b.WriteString("| measurement | median ms | p25-p75 ms | min-max ms | baseline (same run) | baseline median ms | ratio | difference, 95 % conf. |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		if r.Baseline == "" {
			continue
		}
		conf := "n/a"
		for _, base := range rs {
			if base.Name != r.Baseline {
				continue
			}
			if d, ok := stats.Compare(r.Samples, base.Samples); ok {
				conf = fmt.Sprintf("%+.1f %% ± %.1f %%", d.Percent, d.PlusMinus)
				if !d.Significant {
					conf += " (no difference proven)"
				}
			}
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f-%.2f | %.2f-%.2f | %s | %.2f | %.3f | %s |\n", r.Name, r.Median, r.P25, r.P75, r.Min, r.Max, r.Baseline, r.BaseMed, r.Ratio, conf)
	}
	return b.String()
}

func kernel() string {
	out, _ := exec.Command("uname", "-r").Output()
	return "Linux " + strings.TrimSpace(string(out))
}

// farmsJSON builds n farms named prefix+index with b backends each.
func farmsJSON(prefix string, n, b, net int) []byte {
	var buf bytes.Buffer
	buf.WriteString(`{"farms":[`)
	for i := range n {
		if i > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(&buf, `{"name":"%s%05d","virtual-addr":"10.%d.%d.%d","virtual-ports":"80","backends":[`, prefix, i, net%256, i>>8, i&255)
		for j := range b {
			if j > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"name":"b%d","ip-addr":"172.%d.%d.%d","port":"8080"}`, j, 16+j>>8, j&255, i%250+1)
		}
		buf.WriteString("]}")
	}
	buf.WriteString("]}")
	return buf.Bytes()
}

// restore replaces the whole state with n farms x b backends.
func restore(n, b int) {
	body := []byte(`{"farms":[]}`)
	if n > 0 {
		body = farmsJSON("g", n, b, 64)
	}
	call("PUT", "/state", body)
}

// restoreMixed replaces the whole state with n farms x b backends on VIPs
// and fw firewall-mark farms (marks 1..fw, protocol all) x b backends.
func restoreMixed(n, b, fw int) {
	if fw == 0 {
		restore(n, b)
		return
	}
	body := farmsJSON("g", n, b, 64)
	var s bytes.Buffer
	s.Write(body[:len(body)-2]) // without the closing "]}"
	for i := range fw {
		fmt.Fprintf(&s, `,{"name":"m%05d","mark":"0x%x","protocol":"all","backends":[`, i, i+1)
		for j := range b {
			if j > 0 {
				s.WriteByte(',')
			}
			fmt.Fprintf(&s, `{"name":"b%d","ip-addr":"172.%d.%d.%d"}`, j, 16+j>>8, j&255, i%250+1)
		}
		s.WriteString("]}")
	}
	s.WriteString("]}")
	call("PUT", "/state", s.Bytes())
}

// nftBaseline times one `nft -f` that creates n farms x b backends the way a
// script-driven balancer would, in a table of its own, then removes it.
func nftBaseline(tag string, n, b int) float64 {
	d, _ := nftBaselineLimit(tag, n, b, 0)
	return d
}

// nftBaselineLimit is nftBaseline stopped after limit (0: none): a killed
// `nft -f` applies nothing (one transaction), and the sample is then limit,
// a lower bound, with timedOut set.
func nftBaselineLimit(tag string, n, b int, limit time.Duration) (d float64, timedOut bool) {
	var s strings.Builder
	fmt.Fprintf(&s, "table ip bench_%s {\n map svc { type ipv4_addr . inet_proto . inet_service : verdict; }\n", tag)
	for i := range n {
		fmt.Fprintf(&s, " chain f%d { meta l4proto tcp dnat ip addr . port to numgen inc mod %d map { ", i, b)
		for j := range b {
			if j > 0 {
				s.WriteString(", ")
			}
			fmt.Fprintf(&s, "%d : 172.%d.%d.%d . 8080", j, 16+j>>8, j&255, i%250+1)
		}
		s.WriteString(" }; }\n")
	}
	s.WriteString(" chain pre { type nat hook prerouting priority dstnat; ip daddr . meta l4proto . th dport vmap @svc; }\n}\n")
	for i := range n {
		fmt.Fprintf(&s, "add element ip bench_%s svc { 10.250.%d.%d . tcp . 80 : goto f%d }\n", tag, i>>8, i&255, i)
	}
	f, err := os.CreateTemp("", "nftbase-*.nft")
	must(err)
	defer os.Remove(f.Name())
	f.WriteString(s.String())
	f.Close()
	ctx := context.Background()
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	t := time.Now()
	if out, err := exec.CommandContext(ctx, "nft", "-f", f.Name()).CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			exec.Command("nft", "delete", "table", "ip", "bench_"+tag).Run()
			return ms(limit), true
		}
		log.Fatalf("baseline nft -f: %v: %s", err, out)
	}
	d = ms(time.Since(t))
	exec.Command("nft", "delete", "table", "ip", "bench_"+tag).Run()
	return d, false
}

func hyperfine(n, b, fw int) []result {
	env := os.Environ()
	env = append(env, "XLB_KEY="+key, "XLB_API=http://"+apiAddr)
	tmp, err := os.MkdirTemp("", "hf")
	must(err)
	defer os.RemoveAll(tmp)
	runOne := func(name, cmd string, runs int, prepare string) result {
		js := filepath.Join(tmp, "out.json")
		args := []string{"-N", "--warmup", "3", "--runs", fmt.Sprint(runs), "--export-json", js, "--output", "null"}
		if prepare != "" {
			// Each run rebuilds a whole state: no warm-up runs.
			args = append(args, "--prepare", prepare)
			args[2] = "0"
		}
		hf := exec.Command("hyperfine", append(args, cmd)...)
		hf.Env = env
		if out, err := hf.CombinedOutput(); err != nil {
			log.Fatalf("hyperfine %s: %v: %s", cmd, err, out)
		}
		var doc struct {
			Results []struct {
				Times []float64 `json:"times"`
			} `json:"results"`
		}
		raw, err := os.ReadFile(js)
		must(err)
		must(json.Unmarshal(raw, &doc))
		var samples []float64
		for _, t := range doc.Results[0].Times {
			samples = append(samples, t*1000)
		}
		return summarize(name, samples)
	}
	abs, _ := filepath.Abs(*xlbBin)
	size := fmt.Sprintf("%d farms x %d backends", n, b)
	if fw > 0 {
		// The restore baseline below builds VIP farms only: n+fw of them.
		size = fmt.Sprintf("%d VIP + %d fwmark farms x %d backends", n, fw, b)
	}
	base := runOne(fmt.Sprintf("nft list ruleset (%s)", size), "nft list ruleset", *runs, "")
	dump := runOne(fmt.Sprintf("xlb dump, %s (whole process)", size), abs+" dump", *runs, "")
	list := runOne(fmt.Sprintf("xlb list -n, %s (whole process)", size), abs+" list -n", *runs, "")
	// The same over the daemon's Unix socket (what the CLI uses on the
	// daemon's machine by default).
	sockDump := runOne(fmt.Sprintf("xlb dump over the Unix socket, %s (whole process)", size), abs+" --api unix:"+sockPath+" dump", *runs, "")
	sockList := runOne(fmt.Sprintf("xlb list -n over the Unix socket, %s (whole process)", size), abs+" --api unix:"+sockPath+" list -n", *runs, "")
	saved := filepath.Join(tmp, "state.json")
	save := runOne(fmt.Sprintf("xlb save -f, %s (whole process)", size), abs+" save -f "+saved, *runs, "")

	// restore: from an empty state each time (--prepare), so every run
	// creates the whole state. Baseline: one nft -f of the same farms in a
	// table of its own (nftBaseline; the listing of table xlb does not load
	// back: nft prints its numgen-keyed maps with "type 0").
	empty := filepath.Join(tmp, "empty.json")
	must(os.WriteFile(empty, []byte(`{"farms":[]}`), 0o644))
	//
	// Both are slow at the top of the matrix (on a 2-core box, xlb restore
	// of 16,000 farms took ~35 s and emptying them ~20 s; nft -f of 16,000
	// chains with their maps over 2 minutes), so: fewer runs there, and the
	// baseline stops at 60 s and at its first sample over 10 s.
	rruns := min(*runs, 5)
	if (n+fw)*b >= 8000 {
		rruns = min(rruns, 2)
	}
	var nb []float64
	baseName := fmt.Sprintf("nft -f (restore baseline): %s", size)
	for i := range rruns {
		d, timedOut := nftBaselineLimit(fmt.Sprintf("r%d", i), n+fw, b, time.Minute)
		nb = append(nb, d)
		if timedOut {
			baseName += " (timed out at 60 s: a lower bound)"
			break
		}
		if d > 10000 {
			break
		}
	}
	nftRestore := summarize(baseName, nb)
	rest := runOne(fmt.Sprintf("xlb restore -f, %s (whole process, from empty)", size), abs+" restore -f "+saved, rruns, abs+" restore -f "+empty)
	log.Printf("%s: dump %.1f ms, list -n %.1f ms, save %.1f ms, nft list %.1f ms; restore %.1f ms, nft -f %.1f ms",
		size, dump.Median, list.Median, save.Median, base.Median, rest.Median, nftRestore.Median)
	return []result{withBaseline(dump, base), withBaseline(list, base), withBaseline(sockDump, base), withBaseline(sockList, base),
		withBaseline(save, base), base, withBaseline(rest, nftRestore), nftRestore}
}

var client = &http.Client{Timeout: 5 * time.Minute}

func call(method, path string, body []byte) []byte {
	req, err := http.NewRequest(method, "http://"+apiAddr+path, bytes.NewReader(body))
	must(err)
	req.Header.Set("Key", key)
	resp, err := client.Do(req)
	must(err)
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if resp.StatusCode >= 300 {
		log.Fatalf("%s %s: %s: %s", method, path, resp.Status, buf.Bytes())
	}
	return buf.Bytes()
}

func waitReady() {
	for range 100 {
		req, _ := http.NewRequest("GET", "http://"+apiAddr+"/farms", nil)
		req.Header.Set("Key", key)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	log.Fatal("daemon did not become ready")
}

func parseInts(s string) []int {
	var out []int
	for _, p := range strings.Split(s, ",") {
		var n int
		fmt.Sscan(p, &n)
		out = append(out, n)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
