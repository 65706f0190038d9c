// Command kubebench measures xlb's Kubernetes service proxy (on the nft and
// ebpf data planes) and kube-proxy (nftables and iptables modes) against a
// real kube-apiserver and etcd, one proxy after the other on the same API
// server:
//
//   - create/delete (kube-nftlb's method, createdelete.go): the time from
//     creating a Service and its EndpointSlice (10, 50, 100 endpoints) until a
//     new connection to its cluster IP reaches an endpoint, and from deleting
//     it until it is no longer served; real traffic through the node to real
//     listeners (topo.go). Writes kube-create-delete.{md,json}.
//   - endpoint change to live: the time from one EndpointSlice change (the
//     update call to the API server) until the proxy has applied it, with
//     1,000 and 10,000 Services (10 endpoints each) present: kube-proxy's
//     "network programming latency". Writes kube.{md,json}.
//
// It must run inside a network namespace of its own (bench/kube.sh does
// that): it starts etcd and kube-apiserver on that namespace's loopback,
// programs that namespace (the node), and adds a client and a pods
// namespace, which it removes.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/kube/kubetest"
	"github.com/xlb-lb/xlb/internal/model"
)

var (
	sizesFlag   = flag.String("services", "1000,10000", "Service counts present while one endpoint changes")
	endpoints   = flag.Int("endpoints", 10, "endpoints per Service")
	runs        = flag.Int("runs", 30, "endpoint changes measured per size")
	tables      = flag.Int("nft-tables", nft.DefaultShards, "nft tables the farms are spread over, as xlb kube-proxy --nft-tables")
	out         = flag.String("out", "bench/results", "results directory")
	workers     = flag.Int("workers", 16, "parallel API calls while creating Services")
	kpModes     = flag.String("kube-proxy", "nftables,iptables", "kube-proxy modes measured side by side on the same API server (comma-separated; empty: none)")
	planes      = flag.String("planes", "nft,ebpf", "xlb data planes measured (comma-separated)")
	netnsPrefix = flag.String("netns", fmt.Sprintf("xlb-kubebench-%d", os.Getpid()), "prefix of the client and pods network namespaces this creates (and removes)")
)

const namespace = "bench"

func main() {
	flag.Parse()
	var sizes []int
	for _, s := range splitList(*sizesFlag) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			log.Fatalf("-services %q: want counts such as 1000,10000", *sizesFlag)
		}
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Hour)
	defer cancel()
	if err := run(ctx, sizes); err != nil {
		log.Fatal(err)
	}
}

type result struct {
	services int
	setup    time.Duration
	load     string // /proc/loadavg after xlb's measurements
	xlb      []xlbResult
	kp       []kpResult
}

type xlbResult struct {
	plane   string
	samples []time.Duration // API update call -> farm applied
	syncAvg time.Duration   // controller's own part (translate, engine, kernel), mean
	full    time.Duration
	load    string
}

type kpResult struct {
	mode    string
	samples []time.Duration
	err     string
}

func run(ctx context.Context, sizes []int) error {
	dir, err := os.MkdirTemp("", "xlb-kubebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	env, err := kubetest.StartE(dir)
	if err != nil {
		return err
	}
	defer env.Stop()
	log.Printf("etcd + kube-apiserver ready in %s", time.Since(start).Round(time.Millisecond))
	c := env.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The node both proxies run as (kube-proxy waits for its Node).
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bench-node"}}, metav1.CreateOptions{}); err != nil {
		return err
	}

	tp, err := newTopo(*netnsPrefix, cdMaxEndpoints())
	if err != nil {
		return err
	}
	defer tp.close()

	if *cdSizes != "" {
		if err := createDelete(ctx, env, tp, dir); err != nil {
			return err
		}
	}
	if len(sizes) == 0 {
		return nil
	}

	var results []result
	created := 0
	for _, n := range sizes {
		r := result{services: n}
		t0 := time.Now()
		if err := createServices(ctx, c, created, n); err != nil {
			return err
		}
		created = n
		r.setup = time.Since(t0)
		log.Printf("%d Services x %d endpoints created in %s", n, *endpoints, r.setup.Round(time.Millisecond))
		for _, plane := range splitList(*planes) {
			xr, err := measureXLB(ctx, c, dir, plane, n)
			if err != nil {
				return err
			}
			r.xlb = append(r.xlb, xr)
		}
		r.load = loadavg()
		for _, mode := range splitList(*kpModes) {
			kr := measureKubeProxy(ctx, env, dir, mode, n)
			if kr.err != "" {
				log.Printf("kube-proxy %s: %s", kr.mode, kr.err)
			} else {
				log.Printf("%d Services: kube-proxy %s: endpoint change live in median %s", n, kr.mode, median(kr.samples))
			}
			r.kp = append(r.kp, kr)
		}
		results = append(results, r)
	}
	return report(results)
}

// measureXLB starts xlb's controller on plane (its start is a full
// reconcile of every Service, measured too) and times -runs endpoint
// changes after 3 warm-up ones.
func measureXLB(ctx context.Context, c kubernetes.Interface, dir, plane string, n int) (xlbResult, error) {
	xr := xlbResult{plane: plane}
	x, err := startXLB(ctx, c, plane, dir)
	if err != nil {
		return xr, err
	}
	defer x.stop()
	xr.full = x.full
	log.Printf("xlb %s: controller start (informer sync + full reconcile of %d Services): %s, %d farms", plane, n, x.full.Round(time.Millisecond), x.eng.Snapshot().Len())
	var sum0, n0 float64
	for i := range *runs + 3 { // 3 warm-up changes
		if i == 3 {
			sum0, n0 = syncHistogram(x.reg)
		}
		svc := fmt.Sprintf("s%05d", (i*7919)%n)
		took, err := changeOne(ctx, c, x.synced, svc, i)
		if err != nil {
			return xr, err
		}
		if i >= 3 {
			xr.samples = append(xr.samples, took)
		}
	}
	xr.load = loadavg()
	sum1, n1 := syncHistogram(x.reg)
	if n1 > n0 {
		xr.syncAvg = time.Duration((sum1 - sum0) / (n1 - n0) * 1e9)
	}
	log.Printf("%d Services: xlb %s: endpoint change live in median %s (controller's part: mean %s)", n, plane, median(xr.samples), xr.syncAvg)
	return xr, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// syncHistogram returns the sum and count of the per-Service sync histogram.
func syncHistogram(reg *prometheus.Registry) (sum, count float64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "xlb_kubeproxy_sync_proxy_rules_duration_seconds" && len(mf.Metric) == 1 {
			h := mf.Metric[0].GetHistogram()
			return h.GetSampleSum(), float64(h.GetSampleCount())
		}
	}
	return 0, 0
}

type syncEvent struct {
	key string
	at  time.Time
	st  *engine.State
}

func waitFull(ctx context.Context, ch <-chan syncEvent) error {
	deadline := time.After(30 * time.Minute)
	for {
		select {
		case ev := <-ch:
			if ev.key == "" {
				return nil
			}
		case <-deadline:
			return fmt.Errorf("no full reconcile after 30 minutes")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drain discards sync events until none came for quiet.
func drain(ctx context.Context, ch <-chan syncEvent, quiet time.Duration) error {
	deadline := time.After(30 * time.Minute)
	for {
		select {
		case <-ch:
		case <-time.After(quiet):
			return nil
		case <-deadline:
			return fmt.Errorf("syncs did not settle in 30 minutes")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func endpointAddr(svc, ep int) string {
	// 10.128.0.0/9: svc*16 + ep, unique per Service and endpoint.
	v := 10<<24 | 1<<23 | (svc*16+ep)&0x7fffff
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

func sliceFor(svc int, eps []string) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("s%05d", svc)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, a := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

// createServices creates Services s<from>..s<to-1>, each with one
// EndpointSlice of -endpoints ready endpoints, with -workers parallel calls.
func createServices(ctx context.Context, c kubernetes.Interface, from, to int) error {
	jobs := make(chan int)
	errs := make(chan error, *workers)
	var wg sync.WaitGroup
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				name := fmt.Sprintf("s%05d", i)
				eps := make([]string, *endpoints)
				for j := range eps {
					eps[j] = endpointAddr(i, j)
				}
				err := retry(ctx, func() error {
					_, err := c.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
						ObjectMeta: metav1.ObjectMeta{Name: name},
						Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
					}, metav1.CreateOptions{})
					return err
				})
				if err == nil {
					err = retry(ctx, func() error {
						_, err := c.DiscoveryV1().EndpointSlices(namespace).Create(ctx, sliceFor(i, eps), metav1.CreateOptions{})
						return err
					})
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("create service %s: %w", name, err):
					default:
					}
					return
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		select {
		case jobs <- i:
		case err := <-errs:
			close(jobs)
			wg.Wait()
			return err
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// retry runs a create up to 10 times: on a loaded machine etcd can time
// out a request that may or may not have been applied (AlreadyExists then
// means it was).
func retry(ctx context.Context, create func() error) error {
	var err error
	for attempt := range 10 {
		err = create()
		if err == nil || (attempt > 0 && apierrors.IsAlreadyExists(err)) {
			return nil
		}
		if apierrors.IsAlreadyExists(err) || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
	}
	return err
}

// changeOne replaces the last endpoint of a Service with a new address and
// waits until the controller reports the farm applied with it.
func changeOne(ctx context.Context, c kubernetes.Interface, ch <-chan syncEvent, svc string, round int) (time.Duration, error) {
	i, _ := strconv.Atoi(strings.TrimPrefix(svc, "s"))
	s, err := c.CoreV1().Services(namespace).Get(ctx, svc, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	farm := kube.FarmName(namespace, svc, "80", kube.KindCluster, netip.MustParseAddr(s.Spec.ClusterIP))
	cur, err := c.DiscoveryV1().EndpointSlices(namespace).Get(ctx, svc, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	// A new address each round: the Service's block has 16 slots; the
	// first -endpoints are the initial ones, the rest take turns.
	spare := 16 - *endpoints
	if spare < 2 {
		spare = 2
	}
	last := &cur.Endpoints[len(cur.Endpoints)-1]
	newAddr := endpointAddr(i, 16-spare+round%spare)
	if last.Addresses[0] == newAddr {
		newAddr = endpointAddr(i, 16-spare+(round+1)%spare)
	}
	last.Addresses = []string{newAddr}
	key := namespace + "/" + svc
	want := netip.MustParseAddr(newAddr)
	start := time.Now()
	if _, err := c.DiscoveryV1().EndpointSlices(namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev := <-ch:
			if ev.key != key {
				continue
			}
			if f, ok := ev.st.Farm(farm); ok && slices.ContainsFunc(f.Backends, func(b model.Backend) bool { return b.Addr == want }) {
				return ev.at.Sub(start), nil
			}
		case <-deadline:
			return 0, fmt.Errorf("endpoint change of %s not applied in 30s", svc)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return quantile(s, 0.5)
}

// quantile of sorted samples (linear interpolation).
func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo+1 >= len(s) {
		return s[lo]
	}
	frac := pos - float64(lo)
	return s[lo] + time.Duration(frac*float64(s[lo+1]-s[lo]))
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }

// proxyRow is one proxy's samples at one size, for the report.
type proxyRow struct {
	name    string
	samples []time.Duration
	syncAvg time.Duration // xlb only
	full    time.Duration // xlb only
	err     string
}

func rowsOf(r result) []proxyRow {
	var out []proxyRow
	for _, x := range r.xlb {
		out = append(out, proxyRow{name: "xlb " + x.plane, samples: x.samples, syncAvg: x.syncAvg, full: x.full})
	}
	for _, k := range r.kp {
		out = append(out, proxyRow{name: "kube-proxy " + k.mode, samples: k.samples, err: k.err})
	}
	return out
}

func report(rs []result) error {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# xlb kube-proxy: endpoint change to live\n\n")
	fmt.Fprintf(&b, "Measured by `bench/kube.sh` (bench/kubebench) on %s, %s, %d cores.\n\n", host, time.Now().UTC().Format("2006-01-02 15:04 MST"), numCPU())
	fmt.Fprintf(&b, "What is timed: from the EndpointSlice update call to the API server until the\n")
	fmt.Fprintf(&b, "proxy has applied that Service's rules with the new endpoint. xlb (its\n")
	fmt.Fprintf(&b, "controller in the benchmark's process, as `xlb kube-proxy` runs it): until the\n")
	fmt.Fprintf(&b, "Service's farm is in the kernel (watch delivery, translation, one engine\n")
	fmt.Fprintf(&b, "transaction, one nftables batch over %d tables with `nft`, or the eBPF maps'\n", *tables)
	fmt.Fprintf(&b, "updates with `ebpf`; the state is saved to bbolt behind it). kube-proxy\n")
	fmt.Fprintf(&b, "(v1.37.2, default flags plus --conntrack-max-per-core=0, running alone): its own\n")
	fmt.Fprintf(&b, "kubeproxy_network_programming_duration_seconds from the change's trigger time,\n")
	fmt.Fprintf(&b, "set just before the update call, to its rules synced. Real kube-apiserver and\n")
	fmt.Fprintf(&b, "etcd (v1.37.2, etcd --unsafe-no-fsync) on the same machine; %d endpoints per\n", *endpoints)
	fmt.Fprintf(&b, "Service; one ClusterIP farm per Service; %d changes per size and proxy after 3\n", *runs)
	fmt.Fprintf(&b, "warm-up changes, each on a different Service; the proxies one after the other\n")
	fmt.Fprintf(&b, "on the same API server and Services. Target: < 10 ms at 1,000 and < 20 ms at\n10,000 Services.\n\n")
	fmt.Fprintf(&b, "| Services | proxy | runs | median ms | p25 ms | p75 ms | p90 ms | min ms | max ms | ratio to xlb nft (median) | controller's part, mean ms | start (full reconcile) |\n")
	fmt.Fprintf(&b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	type jrow struct {
		Services  int       `json:"services"`
		Proxy     string    `json:"proxy"`
		Samples   []float64 `json:"samples_ms"`
		Median    float64   `json:"median_ms"`
		SyncAvgMS float64   `json:"controller_part_mean_ms,omitempty"`
		Error     string    `json:"error,omitempty"`
	}
	var js []jrow
	for _, r := range rs {
		var base time.Duration
		for _, p := range rowsOf(r) {
			if p.err != "" || len(p.samples) == 0 {
				fmt.Fprintf(&b, "| %d | %s | - | not measured: %s | | | | | | | | |\n", r.services, p.name, p.err)
				js = append(js, jrow{Services: r.services, Proxy: p.name, Error: p.err})
				continue
			}
			x := slices.Clone(p.samples)
			slices.Sort(x)
			med := quantile(x, 0.5)
			if base == 0 {
				base = med
			}
			part, full := "", ""
			if p.full > 0 {
				part, full = ms(p.syncAvg), p.full.Round(time.Millisecond).String()
			}
			fmt.Fprintf(&b, "| %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.services, p.name, len(x),
				ms(med), ms(quantile(x, 0.25)), ms(quantile(x, 0.75)), ms(quantile(x, 0.9)), ms(x[0]), ms(x[len(x)-1]),
				ratio(med, base), part, full)
			jr := jrow{Services: r.services, Proxy: p.name, Median: float64(med) / 1e6, SyncAvgMS: float64(p.syncAvg) / 1e6}
			for _, d := range p.samples {
				jr.Samples = append(jr.Samples, float64(d)/1e6)
			}
			js = append(js, jr)
		}
	}
	fmt.Fprintf(&b, "\nLoad average (1/5/15 min) after xlb's measurements: ")
	for i, r := range rs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%d Services: %s", r.services, r.load)
	}
	fmt.Fprintf(&b, ".\n\nThe controller's part is the mean of xlb_kubeproxy_sync_proxy_rules_duration_seconds\n")
	fmt.Fprintf(&b, "over the measured changes: translation, the engine transaction, the data plane's\n")
	fmt.Fprintf(&b, "update (the bbolt write happens behind it); the rest is the API server, etcd and the watch.\n")
	fmt.Fprintf(&b, "\nSamples (ms, in run order):\n\n")
	for _, r := range rs {
		for _, p := range rowsOf(r) {
			if p.err != "" {
				continue
			}
			parts := make([]string, len(p.samples))
			for i, d := range p.samples {
				parts[i] = ms(d)
			}
			fmt.Fprintf(&b, "- %d Services, %s: %s\n", r.services, p.name, strings.Join(parts, " "))
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(*out, "kube.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(*out, "kube.json"), map[string]any{
		"machine": machine(), "date": time.Now().UTC().Format(time.RFC3339), "endpoints": *endpoints, "runs": *runs, "results": js,
	}); err != nil {
		return err
	}
	fmt.Print(b.String())
	log.Printf("wrote %s and kube.json", path)
	return nil
}

// ratio is a/b to two significant figures ("1" for the baseline itself).
func ratio(a, b time.Duration) string {
	if a == b {
		return "1"
	}
	r := float64(a) / float64(b)
	if r >= 10 {
		return strconv.FormatFloat(r, 'f', 0, 64)
	}
	return strconv.FormatFloat(r, 'f', 1, 64)
}

func writeJSON(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

func machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s, %d cores", host, numCPU())
}

func numCPU() int { return runtime.NumCPU() }

// loadavg returns the 1, 5 and 15 minute load averages: the machine is
// shared, and a load above the core count shows in every figure.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " / ")
}
