package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// metricsAddr is where the daemon serves /metrics without a key, inside
// the LB namespace (its own loopback).
const metricsAddr = "127.0.0.1:9555"

// scrape fetches the daemon's /metrics from inside the LB namespace.
func (e *lbEnv) scrape() string {
	e.t.Helper()
	resp, err := testutil.HTTPClient(e.topo.LB.NS).Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		e.t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		e.t.Fatalf("scrape: %d %v: %s", resp.StatusCode, err, body)
	}
	return string(body)
}

// metricSum adds the values of the samples of name whose line contains
// every one of with.
func metricSum(t *testing.T, body, name string, with ...string) float64 {
	t.Helper()
	var sum float64
next:
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		for _, w := range with {
			if !strings.Contains(l, w) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// TestObserve runs the daemon on each data plane and checks what an
// operator sees: held connections in `xlb list -c` (and deleted by client),
// active connections and API requests in /metrics (which promtool accepts),
// and rates in `xlb list --rate`.
func TestObserve(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			var e *lbEnv
			if plane == "ebpf" {
				e, _ = newEBPFEnv(t, "--metrics-listen", metricsAddr)
			} else {
				e = newEnvWith(t, []string{"--metrics-listen", metricsAddr})
			}
			vip := netip.AddrPortFrom(testutil.VIP4(31), 80)
			e.addWebFarm(vip.Addr())
			const held = 3
			for range held {
				c, err := testutil.DialTCP(e.topo.Client.NS, vip, testutil.DefaultTimeout)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				if _, err := testutil.ReadLine(c, testutil.DefaultTimeout); err != nil {
					t.Fatal(err)
				}
			}
			list := e.mustCLI("list", "-c", "--farm", "web")
			t.Logf("xlb list -c:\n%s", list)
			if n := strings.Count(list, "ESTABLISHED "+e.topo.Client.IPv4.String()+":"); n != held {
				t.Errorf("xlb list -c shows %d established connections of the client, want %d", n, held)
			}
			if !strings.HasPrefix(list, "IPVS connection entries\npro expire state") {
				t.Errorf("xlb list -c does not start with ipvsadm -Lc's header")
			}

			// xlb list --conns: ipvsadm's ActiveConn per backend.
			counts := e.mustCLI("list", "-n", "--conns")
			active := 0
			for _, line := range strings.Split(counts, "\n") {
				if f := strings.Fields(line); len(f) >= 4 && f[0] == "->" {
					for i := range f[:len(f)-1] {
						if f[i] == "active" {
							n, _ := strconv.Atoi(f[i+1])
							active += n
						}
					}
				}
			}
			if active != held {
				t.Errorf("xlb list --conns shows %d active connections, want %d:\n%s", active, held, counts)
			}

			body := e.scrape()
			if got := metricSum(t, body, "xlb_backend_connections_active", `farm="web"`); got != held {
				t.Errorf("xlb_backend_connections_active of web sums to %v, want %d", got, held)
			}
			if got := metricSum(t, body, "xlb_api_requests_total", `route="/farms/{name}/backends"`); got < 3 {
				t.Errorf("xlb_api_requests_total of /farms/{name}/backends = %v, want the 3 backend adds", got)
			}
			cmd := exec.Command("promtool", "check", "metrics")
			cmd.Stdin = strings.NewReader(body)
			if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("promtool check metrics: %v\n%s", err, out)
			}

			// Deleting the client's connections: the daemon says how many.
			out := e.mustCLI("connections", "delete", "web", "--client", e.topo.Client.IPv4.String())
			if strings.TrimSpace(out) != fmt.Sprintf("%d connections deleted", held) {
				t.Errorf("xlb connections delete: %q, want %d deleted", out, held)
			}
			if list := e.mustCLI("list", "-c", "--farm", "web"); strings.Contains(list, "ESTABLISHED") {
				t.Errorf("connections left after deletion:\n%s", list)
			}

			// Rates: a steady loop of new connections for 5 s; the
			// estimate (IPVS's, 2 s ticks) must show them.
			l := startLoop(e, vip, 5000, 5*time.Second)
			time.Sleep(4500 * time.Millisecond)
			rates := e.mustCLI("list", "-n", "--rate")
			l.finish(t, 1)
			t.Logf("xlb list -n --rate:\n%s", rates)
			var cps int
			for _, line := range strings.Split(rates, "\n") {
				if f := strings.Fields(line); len(f) == 7 && f[1] == vip.String() {
					cps, _ = strconv.Atoi(f[2])
				}
			}
			if cps <= 0 {
				t.Errorf("xlb list --rate shows %d CPS for a farm taking new connections", cps)
			}
		})
	}
}
