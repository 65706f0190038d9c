package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/kube/kubetest"
)

var (
	cdSizes = flag.String("create-delete", "10,50,100", "endpoints per Service of the create/delete benchmark (empty: skip it)")
	cdRuns  = flag.Int("create-delete-runs", 30, "Services created and deleted per size and proxy")
	cdDebug = flag.Bool("debug", false, "log each create/delete run")
	cdProbe = flag.Duration("probe-timeout", 200*time.Millisecond, "how long one probe connection may take")
	cdEvery = flag.Duration("probe-every", 2*time.Millisecond, "how often a probe connection is opened")
)

// cdNamespace holds the create/delete benchmark's Services, apart from the
// endpoint-change benchmark's.
const cdNamespace = "cd"

func cdEndpointCounts() []int {
	var out []int
	for _, f := range splitList(*cdSizes) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 1000 {
			log.Fatalf("-create-delete %q: want endpoint counts of 1 to 1000 such as 10,50,100", *cdSizes)
		}
		out = append(out, n)
	}
	return out
}

func cdMaxEndpoints() int {
	m := 1
	for _, n := range cdEndpointCounts() {
		m = max(m, n)
	}
	return m
}

type cdResult struct {
	Proxy     string    `json:"proxy"`
	Op        string    `json:"op"` // create or delete
	Endpoints int       `json:"endpoints"`
	Samples   []float64 `json:"until_traffic_ms"`
	Load      string    `json:"load"`
	Error     string    `json:"error,omitempty"`
}

// createDelete is kube-nftlb's benchmark: for each proxy in turn (xlb on
// each of -planes, kube-proxy in each of -kube-proxy's modes), on the same
// API server, -create-delete-runs times per endpoint count: create a
// Service and its EndpointSlice and time until a new connection from the
// client to the cluster IP reaches an endpoint (create); delete them and
// time until a new connection is no longer served (delete).
func createDelete(ctx context.Context, env *kubetest.Env, tp *topo, dir string) error {
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cdNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	var results []cdResult
	seq := 0
	measure := func(proxy string) {
		for _, n := range cdEndpointCounts() {
			cr := cdResult{Proxy: proxy, Op: "create", Endpoints: n}
			dr := cdResult{Proxy: proxy, Op: "delete", Endpoints: n}
			for i := range *cdRuns + 2 { // 2 warm-up runs
				seq++
				c, d, err := createDeleteOne(ctx, env, tp, fmt.Sprintf("cd%05d", seq), n)
				if err != nil {
					cr.Error, dr.Error = err.Error(), err.Error()
					log.Printf("create/delete, %s, %d endpoints: %v", proxy, n, err)
					break
				}
				if i >= 2 {
					cr.Samples = append(cr.Samples, float64(c)/1e6)
					dr.Samples = append(dr.Samples, float64(d)/1e6)
				}
			}
			cr.Load, dr.Load = loadavg(), loadavg()
			log.Printf("create/delete, %s, %d endpoints: create median %.1f ms, delete median %.1f ms", proxy, n, medianF(cr.Samples), medianF(dr.Samples))
			results = append(results, cr, dr)
		}
	}
	for _, plane := range splitList(*planes) {
		x, err := startXLB(ctx, env.Client, plane, dir)
		if err != nil {
			return err
		}
		measure("xlb " + plane)
		x.stop()
	}
	for _, mode := range splitList(*kpModes) {
		stop, err := startKubeProxy(ctx, env, dir, mode)
		if err != nil {
			log.Printf("kube-proxy %s: %v", mode, err)
			for _, n := range cdEndpointCounts() {
				for _, op := range []string{"create", "delete"} {
					results = append(results, cdResult{Proxy: "kube-proxy " + mode, Op: op, Endpoints: n, Error: err.Error()})
				}
			}
			continue
		}
		time.Sleep(2 * time.Second) // let the start-up syncs settle
		measure("kube-proxy " + mode)
		stop()
	}
	return cdReport(results)
}

// createDeleteOne creates Service name with n endpoints, waits for
// traffic, deletes it and waits until it is no longer served. A run's time
// is from the API call until the first probe connection that was served
// (create) or not served (delete) was opened: probes run back to back from
// the moment the cluster IP is known, while the EndpointSlice is created
// (deleted) next to them.
func createDeleteOne(ctx context.Context, env *kubetest.Env, tp *topo, name string, n int) (create, del time.Duration, err error) {
	svcs := env.Client.CoreV1().Services(cdNamespace)
	eps := env.Client.DiscoveryV1().EndpointSlices(cdNamespace)
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for i := range n {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{podAddr(i).String()},
			NodeName: ptr.To("bench-node"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	// probeUntil opens a probe connection to addr every -probe-every,
	// each in its own goroutine, until one has the outcome wanted (served,
	// or refused at once: a probe that times out says nothing, it may be
	// the machine's load), and returns the earliest time after t0 at which
	// a probe with that outcome was opened (waiting for the probes opened
	// before it to finish). Probes overlap, so a slow or lost probe does
	// not delay the next.
	probeUntil := func(addr netip.AddrPort, t0 time.Time, served bool) (time.Duration, error) {
		type outcome struct {
			start time.Time
			ok    bool
			err   error
		}
		results := make(chan outcome, 4096)
		deadline := t0.Add(30 * time.Second)
		inflight := 0
		var best time.Time
		var lastErr error
		tick := time.NewTicker(*cdEvery)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if !best.IsZero() || time.Now().After(deadline) {
					break
				}
				inflight++
				go func(start time.Time) {
					got, err := tp.probe(ctx, addr, *cdProbe)
					if err == nil && !strings.HasPrefix(got, "10.129.") {
						err = fmt.Errorf("%s answered %q, not from an endpoint", addr, got)
						results <- outcome{start: start, err: err}
						return
					}
					results <- outcome{start: start, ok: err == nil, err: err}
				}(time.Now())
			case o := <-results:
				inflight--
				if o.err != nil && strings.Contains(o.err.Error(), "not from an endpoint") {
					return 0, o.err
				}
				want := o.ok == served
				if !served && !o.ok && errors.Is(o.err, os.ErrDeadlineExceeded) {
					want = false // a timeout is not a refusal
				}
				if want && (best.IsZero() || o.start.Before(best)) {
					best = o.start
				}
				if !want {
					lastErr = o.err
				}
			}
			if !best.IsZero() && inflight == 0 {
				if *cdDebug {
					log.Printf("%s served=%v after %s", addr, served, best.Sub(t0))
				}
				return best.Sub(t0), nil
			}
			if best.IsZero() && inflight == 0 && time.Now().After(deadline) {
				return 0, fmt.Errorf("%s: served=%v not reached 30s after the call (last probe: %v)", addr, served, lastErr)
			}
		}
	}
	t0 := time.Now()
	svc, err := svcs.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("create service %s: %w", name, err)
	}
	addr := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	slErr := make(chan error, 1)
	go func() {
		_, err := eps.Create(ctx, sl, metav1.CreateOptions{})
		slErr <- err
	}()
	create, err = probeUntil(addr, t0, true)
	if serr := <-slErr; serr != nil {
		return 0, 0, fmt.Errorf("create endpointslice %s: %w", name, serr)
	}
	if err != nil {
		return 0, 0, err
	}
	time.Sleep(20 * time.Millisecond)

	// Probing starts before the delete call: the rules may be gone before
	// the call returns.
	t0 = time.Now()
	type res struct {
		d   time.Duration
		err error
	}
	gone := make(chan res, 1)
	go func() {
		d, err := probeUntil(addr, t0, false)
		gone <- res{d, err}
	}()
	if err := svcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, fmt.Errorf("delete service %s: %w", name, err)
	}
	// As the garbage collector would (there is no controller-manager).
	if err := eps.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, fmt.Errorf("delete endpointslice %s: %w", name, err)
	}
	r := <-gone
	if r.err != nil {
		return 0, 0, r.err
	}
	time.Sleep(50 * time.Millisecond)
	return create, r.d, nil
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return quantileF(sortedF(v), 0.5)
}

func sortedF(v []float64) []float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s
}

func quantileF(s []float64, q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo+1 >= len(s) {
		return s[lo]
	}
	return s[lo] + (pos-float64(lo))*(s[lo+1]-s[lo])
}

func f2(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func cdReport(rs []cdResult) error {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# xlb kube-proxy: Service create and delete until traffic\n\n")
	fmt.Fprintf(&b, "Measured by `bench/kube.sh` (bench/kubebench) on %s, %s, %d cores.\n\n", host, time.Now().UTC().Format("2006-01-02 15:04 MST"), numCPU())
	fmt.Fprintf(&b, "kube-nftlb's method: **create** is the time from the Service create call\n")
	fmt.Fprintf(&b, "(its EndpointSlice is created as soon as the call returns) until a new TCP\n")
	fmt.Fprintf(&b, "connection from a client namespace to the cluster IP is answered by an endpoint;\n")
	fmt.Fprintf(&b, "**delete** is the time from the Service delete call (its EndpointSlice's follows,\n")
	fmt.Fprintf(&b, "as the garbage collector's would) until a new connection is no longer answered.\n")
	fmt.Fprintf(&b, "Both count until the first probe with that outcome was opened. The\n")
	fmt.Fprintf(&b, "endpoints are real: every endpoint address is on one pods namespace, behind\n")
	fmt.Fprintf(&b, "the node namespace the proxies program, with a listener answering on all of\n")
	fmt.Fprintf(&b, "them. A probe is one new connection (%s timeout); one is opened every %s\n", *cdProbe, *cdEvery)
	fmt.Fprintf(&b, "from the create call's return (the delete call) on, each in its own goroutine, so a\n")
	fmt.Fprintf(&b, "slow one does not hold the next back. The node refuses cluster IPs no proxy serves\n")
	fmt.Fprintf(&b, "(a prohibit route), so an unserved probe fails at once; a probe that times out counts\n")
	fmt.Fprintf(&b, "as neither served nor refused. Real kube-apiserver and etcd (v1.37.2, etcd --unsafe-no-fsync) on\n")
	fmt.Fprintf(&b, "the same machine; the proxies run one after the other on the same API server,\n")
	fmt.Fprintf(&b, "each alone, with no other Service present: xlb's controller in the benchmark's\n")
	fmt.Fprintf(&b, "process as `xlb kube-proxy` runs it (nft: %d tables; ebpf: attached to the\n", *tables)
	fmt.Fprintf(&b, "node's two interfaces), kube-proxy v1.37.2 with default flags plus\n")
	fmt.Fprintf(&b, "--conntrack-max-per-core=0. %d runs per row after 2 warm-up runs, a new Service\n", *cdRuns)
	fmt.Fprintf(&b, "(and cluster IP) each.\n\n")
	fmt.Fprintf(&b, "| endpoints | op | proxy | runs | median ms | p25 ms | p75 ms | min ms | max ms | ratio to xlb nft (median) | load average after (1/5/15 min) |\n")
	fmt.Fprintf(&b, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, n := range cdEndpointCounts() {
		for _, op := range []string{"create", "delete"} {
			var base float64
			for _, r := range rs {
				if r.Endpoints != n || r.Op != op {
					continue
				}
				if r.Error != "" || len(r.Samples) == 0 {
					fmt.Fprintf(&b, "| %d | %s | %s | - | not measured: %s | | | | | | |\n", n, op, r.Proxy, r.Error)
					continue
				}
				s := sortedF(r.Samples)
				med := quantileF(s, 0.5)
				if base == 0 {
					base = med
				}
				rat := "1"
				if med != base {
					rat = ratio(time.Duration(med*1e6), time.Duration(base*1e6))
				}
				fmt.Fprintf(&b, "| %d | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", n, op, r.Proxy, len(s),
					f2(med), f2(quantileF(s, 0.25)), f2(quantileF(s, 0.75)), f2(s[0]), f2(s[len(s)-1]), rat, r.Load)
			}
		}
	}
	fmt.Fprintf(&b, "\n![boxplots](kube-create-delete.png)\n\nSamples (ms, in run order):\n\n")
	for _, r := range rs {
		if r.Error != "" {
			continue
		}
		parts := make([]string, len(r.Samples))
		for i, v := range r.Samples {
			parts[i] = f2(v)
		}
		fmt.Fprintf(&b, "- %s, %s, %d endpoints: %s\n", r.Proxy, r.Op, r.Endpoints, strings.Join(parts, " "))
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(*out, "kube-create-delete.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(*out, "kube-create-delete.json"), map[string]any{
		"machine": machine(), "date": time.Now().UTC().Format(time.RFC3339), "runs": *cdRuns,
		"probe_timeout_ms": float64(*cdProbe) / 1e6, "results": rs,
	}); err != nil {
		return err
	}
	fmt.Print(b.String())
	log.Printf("wrote %s and kube-create-delete.json", path)
	return nil
}
