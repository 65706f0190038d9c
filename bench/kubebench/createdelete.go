package main

import (
	"context"
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
	cdProbe = flag.Duration("probe-timeout", 50*time.Millisecond, "how long one probe connection may take")
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
// traffic, deletes it and waits until it is no longer served.
func createDeleteOne(ctx context.Context, env *kubetest.Env, tp *topo, name string, n int) (create, del time.Duration, err error) {
	svcs := env.Client.CoreV1().Services(cdNamespace)
	slices_ := env.Client.DiscoveryV1().EndpointSlices(cdNamespace)
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for i := range n {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{podAddr(i).String()},
			NodeName: ptr.To("bench-node"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	t0 := time.Now()
	svc, err := svcs.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("create service %s: %w", name, err)
	}
	if _, err := slices_.Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return 0, 0, fmt.Errorf("create endpointslice %s: %w", name, err)
	}
	addr := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	deadline := t0.Add(30 * time.Second)
	for {
		got, err := tp.probe(ctx, addr, *cdProbe)
		if err == nil {
			if !strings.HasPrefix(got, "10.129.") {
				return 0, 0, fmt.Errorf("%s answered %q, not from an endpoint", addr, got)
			}
			create = time.Since(t0)
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("%s (%s) not served 30s after its creation: %v", name, addr, err)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	t0 = time.Now()
	if err := svcs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, fmt.Errorf("delete service %s: %w", name, err)
	}
	// As the garbage collector would (there is no controller-manager).
	if err := slices_.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, fmt.Errorf("delete endpointslice %s: %w", name, err)
	}
	deadline = t0.Add(30 * time.Second)
	for {
		if _, err := tp.probe(ctx, addr, *cdProbe); err != nil {
			del = time.Since(t0)
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("%s (%s) still served 30s after its deletion", name, addr)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	return create, del, nil
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
	fmt.Fprintf(&b, "(followed at once by its EndpointSlice's) until a new TCP connection from a\n")
	fmt.Fprintf(&b, "client namespace to the cluster IP is answered by an endpoint; **delete** is the\n")
	fmt.Fprintf(&b, "time from the Service delete call (followed by its EndpointSlice's, as the\n")
	fmt.Fprintf(&b, "garbage collector would) until a new connection is no longer answered. The\n")
	fmt.Fprintf(&b, "endpoints are real: every endpoint address is on one pods namespace, behind\n")
	fmt.Fprintf(&b, "the node namespace the proxies program, with a listener answering on all of\n")
	fmt.Fprintf(&b, "them. A probe is one new connection (%s timeout), repeated every\n", *cdProbe)
	fmt.Fprintf(&b, "millisecond. Real kube-apiserver and etcd (v1.37.2, etcd --unsafe-no-fsync) on\n")
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
