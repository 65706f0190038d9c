// Command kubebench measures xlb's Kubernetes service proxy against a real
// kube-apiserver and etcd: the time from one EndpointSlice change (the
// update call to the API server) until the controller has applied the
// Service's farm with the new endpoint to the kernel, with 1,000 and 10,000
// Services (10 endpoints each) present. This is kube-proxy's "network
// programming latency": watch delivery, translation, one engine transaction,
// one nftables batch and the state saved to disk.
//
// It must run inside a network namespace of its own (bench/kube.sh does
// that): it starts etcd and kube-apiserver on that namespace's loopback and
// programs that namespace's nftables.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
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
	"github.com/xlb-lb/xlb/internal/store"
)

var (
	sizesFlag = flag.String("services", "1000,10000", "Service counts present while one endpoint changes")
	endpoints = flag.Int("endpoints", 10, "endpoints per Service")
	runs      = flag.Int("runs", 30, "endpoint changes measured per size")
	tables    = flag.Int("nft-tables", nft.DefaultShards, "nft tables the farms are spread over, as xlb kube-proxy --nft-tables")
	out       = flag.String("out", "bench/results", "results directory")
	workers   = flag.Int("workers", 16, "parallel API calls while creating Services")
	kpModes   = flag.String("kube-proxy", "nftables", "kube-proxy modes measured side by side on the same API server (comma-separated; empty: none)")
)

const namespace = "bench"

func main() {
	flag.Parse()
	var sizes []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-services %q: want counts such as 1000,10000", *sizesFlag)
		}
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	if err := run(ctx, sizes); err != nil {
		log.Fatal(err)
	}
}

type result struct {
	services int
	samples  []time.Duration // API update call -> farm applied
	syncAvg  time.Duration   // controller's own part (translate, engine, kernel, disk), mean
	setup    time.Duration
	full     time.Duration
	load     string // /proc/loadavg while measuring
	kp       []kpResult
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

	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// As `xlb kube-proxy` runs it: farms spread over nft.DefaultShards tables.
	plane, err := nft.Open(ctx, quiet, nft.Options{Table: "xlb-kubebench", Shards: *tables})
	if err != nil {
		return err
	}
	defer plane.Close()
	bolt, err := store.OpenBolt(filepath.Join(dir, "state"))
	if err != nil {
		return err
	}
	st := kube.NewWriteBehind(bolt, quiet) // as xlb kube-proxy does
	defer st.Close()
	eng, err := engine.New(ctx, quiet, plane, st)
	if err != nil {
		return err
	}

	var results []result
	created := 0
	var ctl *kube.Controller
	var synced chan syncEvent
	stop := func() {}
	defer func() { stop() }()
	for _, n := range sizes {
		r := result{services: n}
		t0 := time.Now()
		if err := createServices(ctx, c, created, n); err != nil {
			return err
		}
		created = n
		r.setup = time.Since(t0)
		log.Printf("%d Services x %d endpoints created in %s", n, *endpoints, r.setup.Round(time.Millisecond))

		// A fresh controller per size: its start is a full reconcile of
		// every Service (measured too).
		stop()
		synced = make(chan syncEvent, 1<<16)
		reg := prometheus.NewRegistry()
		ctl, err = kube.New(kube.Config{Client: c, Engine: eng, Log: quiet, NodeName: "bench-node", Metrics: kube.NewMetrics(reg)})
		if err != nil {
			return err
		}
		ctl.OnSynced(func(key string, st *engine.State) {
			select {
			case synced <- syncEvent{key: key, at: time.Now(), st: st}:
			default:
			}
		})
		cctx, ccancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		t0 = time.Now()
		go func() { done <- ctl.Run(cctx) }()
		stop = func() {
			ccancel()
			<-done
		}
		if err := waitFull(ctx, synced); err != nil {
			return err
		}
		r.full = time.Since(t0)
		log.Printf("controller start (informer sync + full reconcile of %d Services): %s, %d farms", n, r.full.Round(time.Millisecond), eng.Snapshot().Len())
		// Drain the per-Service syncs the informers' initial adds queued.
		if err := drain(ctx, synced, 3*time.Second); err != nil {
			return err
		}

		var sum0, n0 float64
		for i := range *runs + 3 { // 3 warm-up changes
			if i == 3 {
				sum0, n0 = syncHistogram(reg)
			}
			svc := fmt.Sprintf("s%05d", (i*7919)%n)
			took, err := changeOne(ctx, c, synced, svc, i)
			if err != nil {
				return err
			}
			if i >= 3 {
				r.samples = append(r.samples, took)
			}
		}
		r.load = loadavg()
		sum1, n1 := syncHistogram(reg)
		if n1 > n0 {
			r.syncAvg = time.Duration((sum1 - sum0) / (n1 - n0) * 1e9)
		}
		log.Printf("%d Services: endpoint change live in median %s (controller's part: mean %s)", n, median(r.samples), r.syncAvg)
		if *kpModes != "" {
			stop() // kube-proxy runs alone
			stop = func() {}
			for _, mode := range strings.Split(*kpModes, ",") {
				kr := measureKubeProxy(ctx, env, dir, strings.TrimSpace(mode), n)
				if kr.err != "" {
					log.Printf("kube-proxy %s: %s", kr.mode, kr.err)
				} else {
					log.Printf("%d Services: kube-proxy %s: endpoint change live in median %s", n, kr.mode, median(kr.samples))
				}
				r.kp = append(r.kp, kr)
			}
		}
		results = append(results, r)
	}
	return report(results)
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

// retry runs a create up to 5 times: on a loaded machine etcd can time out
// a request that may or may not have been applied (AlreadyExists then
// means it was).
func retry(ctx context.Context, create func() error) error {
	var err error
	for attempt := range 5 {
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

func report(rs []result) error {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# xlb kube-proxy: endpoint change to live\n\n")
	fmt.Fprintf(&b, "Measured by `bench/kube.sh` (bench/kubebench) on %s, %s, %d cores.\n\n", host, time.Now().UTC().Format("2006-01-02 15:04 MST"), numCPU())
	fmt.Fprintf(&b, "What is timed: from the EndpointSlice update call to the API server until the\n")
	fmt.Fprintf(&b, "controller has applied that Service's farm with the new endpoint (watch\n")
	fmt.Fprintf(&b, "delivery, translation, one engine transaction, one nftables batch in the\n")
	fmt.Fprintf(&b, "kernel; the state is saved to bbolt behind it, as `xlb kube-proxy` does). Real kube-apiserver and etcd\n")
	fmt.Fprintf(&b, "(v1.37.2, etcd --unsafe-no-fsync) on the same machine; %d endpoints per\n", *endpoints)
	fmt.Fprintf(&b, "Service; one ClusterIP farm per Service; %d changes per size after 3 warm-up\n", *runs)
	fmt.Fprintf(&b, "changes, each on a different Service. Target: < 10 ms at 1,000 and < 20 ms at\n10,000 Services.\n\n")
	fmt.Fprintf(&b, "| Services | runs | median ms | p25 ms | p75 ms | p90 ms | min ms | max ms | controller's part, mean ms | controller start (full reconcile) | load average (1/5/15 min) |\n")
	fmt.Fprintf(&b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rs {
		s := slices.Clone(r.samples)
		slices.Sort(s)
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.services, len(s),
			ms(quantile(s, 0.5)), ms(quantile(s, 0.25)), ms(quantile(s, 0.75)), ms(quantile(s, 0.9)),
			ms(s[0]), ms(s[len(s)-1]), ms(r.syncAvg), r.full.Round(time.Millisecond), r.load)
	}
	if hasKP(rs) {
		fmt.Fprintf(&b, "\nSide by side, the same changes on the same API server (kube-proxy %s, default\n", "v1.37.2")
		fmt.Fprintf(&b, "flags plus --conntrack-max-per-core=0, running alone; its own\n")
		fmt.Fprintf(&b, "kubeproxy_network_programming_duration_seconds from the change's trigger time, set\n")
		fmt.Fprintf(&b, "just before the update call, to its rules synced):\n\n")
		fmt.Fprintf(&b, "| Services | proxy | runs | median ms | p25 ms | p75 ms | min ms | max ms | ratio to xlb (median) |\n")
		fmt.Fprintf(&b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rs {
			x := slices.Clone(r.samples)
			slices.Sort(x)
			fmt.Fprintf(&b, "| %d | xlb (nft) | %d | %s | %s | %s | %s | %s | 1 |\n", r.services, len(x),
				ms(quantile(x, 0.5)), ms(quantile(x, 0.25)), ms(quantile(x, 0.75)), ms(x[0]), ms(x[len(x)-1]))
			for _, k := range r.kp {
				if k.err != "" {
					fmt.Fprintf(&b, "| %d | kube-proxy %s | - | not measured: %s | | | | | |\n", r.services, k.mode, k.err)
					continue
				}
				y := slices.Clone(k.samples)
				slices.Sort(y)
				fmt.Fprintf(&b, "| %d | kube-proxy %s | %d | %s | %s | %s | %s | %s | %.0f |\n", r.services, k.mode, len(y),
					ms(quantile(y, 0.5)), ms(quantile(y, 0.25)), ms(quantile(y, 0.75)), ms(y[0]), ms(y[len(y)-1]),
					float64(quantile(y, 0.5))/float64(quantile(x, 0.5)))
			}
		}
	}
	fmt.Fprintf(&b, "\nThe controller's part is the mean of xlb_kubeproxy_sync_proxy_rules_duration_seconds\n")
	fmt.Fprintf(&b, "over the measured changes: translation, the engine transaction, the nftables batch\n")
	fmt.Fprintf(&b, "(the bbolt write happens behind it); the rest is the API server, etcd and the watch.\n")
	fmt.Fprintf(&b, "\nSamples (ms, in run order):\n\n")
	for _, r := range rs {
		parts := make([]string, len(r.samples))
		for i, d := range r.samples {
			parts[i] = ms(d)
		}
		fmt.Fprintf(&b, "- %d Services: %s\n", r.services, strings.Join(parts, " "))
	}
	for _, r := range rs {
		for _, k := range r.kp {
			if k.err == "" {
				parts := make([]string, len(k.samples))
				for i, d := range k.samples {
					parts[i] = ms(d)
				}
				fmt.Fprintf(&b, "- %d Services, kube-proxy %s: %s\n", r.services, k.mode, strings.Join(parts, " "))
			}
		}
	}
	fmt.Fprintf(&b, "\nEarlier measurement on this machine (the issue's): kube-proxy ~760 ms (nftables\n")
	fmt.Fprintf(&b, "mode) and ~1,070 ms (iptables mode) at 1,000 Services x 10 endpoints. iptables mode\n")
	fmt.Fprintf(&b, "is not measured here: the machine has no iptables (apt-get install iptables).\n")
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(*out, "kube.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Print(b.String())
	log.Printf("wrote %s", path)
	return nil
}

func hasKP(rs []result) bool {
	for _, r := range rs {
		if len(r.kp) > 0 {
			return true
		}
	}
	return false
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
