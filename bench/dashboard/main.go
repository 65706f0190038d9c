// Command dashboard draws a picture of the Grafana dashboard
// (deploy/grafana/xlb-dashboard.json) from real data, where no Grafana can
// be installed (Debian has none): it runs xlb on the eBPF data plane in
// namespaces (client -> lb -> 3 backends) with --metrics-listen, a
// Prometheus server (Debian's) scraping it every 2 s, and a scenario of
// a few minutes (steady requests to two farms, a farm without backends
// refusing connections, a backend answering HTTP 503 for a minute, weight
// changes through the API). Then it runs every panel's queries against
// that Prometheus over the scenario's span and draws the panels where the
// dashboard's gridPos puts them, with gnuplot. The picture is the
// dashboard's layout, queries and units over real data; its look is
// gnuplot's, not Grafana's.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/bench/internal/topo"
	"github.com/xlb-lb/xlb/internal/client"
)

var (
	xlbBin    = flag.String("xlb", "bin/xlb", "xlb binary")
	echoBin   = flag.String("echo", "bin/xlb-echo", "xlb-echo binary")
	dashboard = flag.String("dashboard", "deploy/grafana/xlb-dashboard.json", "Grafana dashboard to draw")
	out       = flag.String("out", "docs/img/dashboard.png", "PNG to write")
	prefix    = flag.String("prefix", fmt.Sprintf("xlbdash-%d", os.Getpid()), "namespace name prefix")
	span      = flag.Duration("duration", 4*time.Minute, "length of the scenario")
)

const key = "dashboard-key"

func main() {
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the scenario creates network namespaces")
	}
	for _, tool := range []string{"prometheus", "gnuplot"} {
		if _, err := exec.LookPath(tool); err != nil {
			log.Fatalf("%s not found (Debian packages prometheus and gnuplot-nox)", tool)
		}
	}
	ctx := context.Background()
	d, err := readDashboard(*dashboard)
	if err != nil {
		log.Fatal(err)
	}
	t, err := topo.New(ctx, topo.Options{Prefix: *prefix, Echo: abs(*echoBin)})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	state, err := os.MkdirTemp("", "xlb-dashboard-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(state)
	pin := "/sys/fs/bpf/" + t.Name("lb")
	defer os.RemoveAll(pin)
	if _, err := t.Start("lb", []string{"XLB_KEY=" + key}, abs(*xlbBin), "daemon", "--listen", "127.0.0.1:5555",
		"--state-dir", state, "--dataplane", "ebpf", "--pin-path", pin, "--interfaces", "eth0,br0",
		"--metrics-listen", "127.0.0.1:9555"); err != nil {
		log.Fatal(err)
	}
	c := client.New("unix:"+filepath.Join(state, "api.sock"), key, nil)
	waitFor(ctx, func() error { _, err := c.Version(ctx); return err })
	cfg := filepath.Join(state, "prometheus.yml")
	os.WriteFile(cfg, []byte("global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\nscrape_configs:\n  - job_name: xlb\n    static_configs:\n      - targets: ['127.0.0.1:9555']\n"), 0o644)
	if _, err := t.Start("lb", nil, "prometheus", "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(state, "tsdb"),
		"--web.listen-address=127.0.0.1:9090", "--log.level=warn"); err != nil {
		log.Fatal(err)
	}
	lb, err := netns.GetFromName(t.Name("lb"))
	if err != nil {
		log.Fatal(err)
	}
	prom := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := inNS(lb, func() error { var err error; conn, err = net.Dial(network, addr); return err })
		return conn, err
	}}}
	waitFor(ctx, func() error { _, err := prom.Get("http://127.0.0.1:9090/-/ready"); return err })

	start, end := scenario(ctx, t, c)
	time.Sleep(5 * time.Second) // the last scrapes
	log.Printf("scenario %s .. %s; querying Prometheus", start.Format(time.TimeOnly), end.Format(time.TimeOnly))
	data := map[int][][]series{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			s, err := queryRange(prom, expand(tg.Expr), start, end)
			if err != nil {
				log.Fatalf("panel %q: %v", p.Title, err)
			}
			for i := range s {
				s[i].label = legend(tg.LegendFormat, s[i].metric)
			}
			data[p.ID] = append(data[p.ID], s)
		}
	}
	if err := draw(d, data, start, end, *out); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s", *out)
}

// scenario drives traffic and faults for -duration and returns its span.
func scenario(ctx context.Context, t *topo.Topology, c *client.Client) (time.Time, time.Time) {
	farm := func(name, port, sched string, backends bool) string {
		f := fmt.Sprintf(`{"name":%q,"virtual-addr":%q,"virtual-ports":%q,"scheduler":%q,"mode":"snat",
			"check":{"type":"http","path":"/","inter":"1s","timeout":"500ms","rise":"2","fall":"2"},"backends":[`, name, topo.VIP, port, sched)
		for i, ip := range topo.Backends {
			if !backends {
				break
			}
			if i > 0 {
				f += ","
			}
			f += fmt.Sprintf(`{"name":"be%d","ip-addr":%q,"port":"8080","weight":"%d"}`, i+1, ip, i+1)
		}
		return f + "]}"
	}
	must := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	must(c.PutFarm(ctx, "web", []byte(farm("web", "80", "weight", true))))
	must(c.PutFarm(ctx, "api", []byte(farm("api", "8000", "rr", true))))
	must(c.PutFarm(ctx, "staging", []byte(farm("staging", "9000", "rr", false))))
	cl, err := netns.GetFromName(t.Name("client"))
	must(err)
	start := time.Now()
	end := start.Add(*span)
	var wg sync.WaitGroup
	load := func(port string, every time.Duration) {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for now := range tick.C {
			if now.After(end) {
				return
			}
			get(cl, topo.VIP+":"+port)
		}
	}
	wg.Add(4)
	go load("80", 8*time.Millisecond) // about 125 requests a second
	go load("80", 11*time.Millisecond)
	go load("8000", 25*time.Millisecond)
	go load("9000", 500*time.Millisecond) // refused: no backends
	// Held connections: 30 to web, opened over the first minute,
	// closed a minute before the end.
	go func() {
		var held []net.Conn
		for i := 0; i < 30 && time.Now().Before(end); i++ {
			var conn net.Conn
			if inNS(cl, func() error {
				var err error
				conn, err = net.DialTimeout("tcp", topo.VIP+":80", time.Second)
				return err
			}) == nil {
				held = append(held, conn)
			}
			time.Sleep(2 * time.Second)
		}
		time.Sleep(time.Until(end.Add(-time.Minute)))
		for _, conn := range held {
			conn.Close()
		}
	}()
	// A backend answers 503 for a minute (SIGUSR1 toggles xlb-echo).
	at := func(frac float64, fn func()) {
		time.AfterFunc(time.Duration(frac*float64(*span)), fn)
	}
	at(0.35, func() { t.Servers[1].Process.Signal(syscall.SIGUSR1); log.Print("be2 answers 503") })
	at(0.6, func() { t.Servers[1].Process.Signal(syscall.SIGUSR1); log.Print("be2 answers 200") })
	// Weight changes through the API (engine changes, API requests).
	go func() {
		for w := 1; time.Now().Before(end); w = w%5 + 1 {
			body := fmt.Sprintf(`{"backends":[{"name":"be3","ip-addr":%q,"port":"8080","weight":"%d"}]}`, topo.Backends[2], w+2)
			if err := c.PutBackends(ctx, "api", []byte(body)); err != nil {
				log.Printf("weight change: %v", err)
			}
			time.Sleep(3 * time.Second)
		}
	}()
	wg.Wait()
	return start, end
}

// get sends one HTTP request from the client namespace.
func get(ns netns.NsHandle, addr string) {
	var conn net.Conn
	if inNS(ns, func() error { var err error; conn, err = net.DialTimeout("tcp", addr, time.Second); return err }) != nil {
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.0\r\n\r\n")
	bufio.NewReader(conn).ReadString('\n')
}

func inNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	defer netns.Set(orig)
	return fn()
}

func waitFor(ctx context.Context, fn func() error) {
	var err error
	for range 200 {
		if err = fn(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	log.Fatalf("not ready after 20 s: %v", err)
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// The dashboard, as much of it as the picture needs.
type dashboardJSON struct {
	Title  string `json:"title"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos struct {
			X, Y, W, H int
		} `json:"gridPos"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
		Targets []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(path string) (*dashboardJSON, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d dashboardJSON
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &d, nil
}

// expand replaces the dashboard's variables as Grafana would here: every
// farm, and $__rate_interval for a 2 s scrape interval (4 scrapes).
func expand(expr string) string {
	return strings.NewReplacer("$farm", ".*", "$__rate_interval", "8s").Replace(expr)
}

type series struct {
	metric map[string]string
	label  string
	t, v   []float64
}

func queryRange(c *http.Client, expr string, start, end time.Time) ([]series, error) {
	q := url.Values{"query": {expr}, "start": {strconv.FormatInt(start.Unix(), 10)},
		"end": {strconv.FormatInt(end.Unix(), 10)}, "step": {"2"}}
	resp, err := c.Get("http://127.0.0.1:9090/api/v1/query_range?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, r.Error)
	}
	var out []series
	for _, res := range r.Data.Result {
		s := series{metric: res.Metric}
		for _, v := range res.Values {
			ts, _ := v[0].(float64)
			str, _ := v[1].(string)
			f, err := strconv.ParseFloat(str, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				continue
			}
			s.t = append(s.t, ts-float64(start.Unix()))
			s.v = append(s.v, f)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i].metric) < fmt.Sprint(out[j].metric) })
	return out, nil
}

// legend fills a Grafana legend format ("{{farm}}/{{backend}}").
func legend(format string, m map[string]string) string {
	if format == "" {
		return ""
	}
	s := format
	for k, v := range m {
		s = strings.ReplaceAll(s, "{{"+k+"}}", v)
	}
	return s
}
