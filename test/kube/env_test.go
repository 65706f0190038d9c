// Package kube_test runs xlb's Kubernetes service proxy against a real
// kube-apiserver and etcd (internal/kube/kubetest), with the nftables data
// plane in the LB namespace of a client -> lb -> backends topology and real
// traffic from the client namespace. Each test creates its own Kubernetes
// namespace, Node object and network namespaces, and removes them.
package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/ebpf"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/kube/kubetest"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
	"github.com/xlb-lb/xlb/internal/testutil"
)

var (
	apiOnce sync.Once
	apiEnv  *kubetest.Env
	apiErr  error
	apiDir  string
)

// apiserver returns the package's API server, started on first use and
// stopped by TestMain.
func apiserver(t testing.TB) *kubetest.Env {
	t.Helper()
	apiOnce.Do(func() {
		apiDir, apiErr = os.MkdirTemp("", "xlb-kube-test-")
		if apiErr != nil {
			return
		}
		start := time.Now()
		apiEnv, apiErr = kubetest.StartE(apiDir)
		t.Logf("etcd + kube-apiserver started in %s", time.Since(start).Round(time.Millisecond))
	})
	if apiErr != nil {
		t.Fatalf("start the API server: %v", apiErr)
	}
	return apiEnv
}

func TestMain(m *testing.M) {
	testutil.AskMain() // client processes of the node (Cgroup.Ask)
	code := m.Run()
	if apiEnv != nil {
		apiEnv.Stop()
	}
	if apiDir != "" {
		os.RemoveAll(apiDir)
	}
	if xlbPath != "" {
		os.RemoveAll(filepath.Dir(xlbPath))
	}
	os.Exit(code)
}

// env is one test's world: a Kubernetes namespace and Node, a topology, and
// a controller with the nft data plane in the LB namespace.
type env struct {
	*testutil.Topology
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	ns     string
	node   string
	eng    *engine.Engine
	ctl    *kube.Controller
	// cg: with the ebpf plane, the cgroup of the node's own processes
	// balanced at the socket (--socket-lb-cgroup).
	cg *testutil.Cgroup
	// configure, if set, changes the controller's configuration before
	// startController starts it.
	configure func(*kube.Config)
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// newEnv is newWorld with a controller running in the test process, on
// the nft data plane.
func newEnv(t *testing.T, backends int) *env {
	t.Helper()
	e := newWorld(t, backends)
	e.startController("nft")
	return e
}

// newWorld makes the Kubernetes namespace, the Node and the topology.
func newWorld(t *testing.T, backends int) *env {
	t.Helper()
	testutil.RequireRoot(t)
	api := apiserver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, client: api.Client}
	e.Topology = testutil.NewTopology(t, testutil.TopologyOptions{Backends: backends, IPv6: true, Hairpin: true})

	ns, err := e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "xlbt-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	e.ns = ns.Name
	t.Cleanup(func() {
		// Nothing finalizes a namespace without a controller-manager:
		// delete what the test made, then the namespace (it stays
		// Terminating until the API server stops).
		bg := context.Background()
		_ = e.client.DiscoveryV1().EndpointSlices(e.ns).DeleteCollection(bg, metav1.DeleteOptions{}, metav1.ListOptions{})
		svcs, _ := e.client.CoreV1().Services(e.ns).List(bg, metav1.ListOptions{})
		if svcs != nil {
			for _, s := range svcs.Items {
				_ = e.client.CoreV1().Services(e.ns).Delete(bg, s.Name, metav1.DeleteOptions{})
			}
		}
		_ = e.client.CoreV1().Namespaces().Delete(bg, e.ns, metav1.DeleteOptions{})
	})

	// The LB namespace plays the node: its client-side addresses serve
	// NodePorts.
	e.node = ns.Name + "-node"
	node, err := e.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() { _ = e.client.CoreV1().Nodes().Delete(context.Background(), e.node, metav1.DeleteOptions{}) })
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: e.LB.IPv4.String()},
		{Type: corev1.NodeInternalIP, Address: e.LB.IPv6.String()},
	}
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set node addresses: %v", err)
	}
	return e
}

// startController runs the controller with data plane "nft" or "ebpf"
// (attached to every interface of the LB namespace, pinned in a bpffs the
// test mounts, balancing the sockets of e.cg) in the LB namespace, stopped
// in t.Cleanup.
func (e *env) startController(planeName string) {
	t, ctx := e.t, e.ctx
	api := apiserver(t)
	w := &testWriter{t: t}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var plane dataplane.Dataplane
	var err error
	switch planeName {
	case "nft":
		plane, err = nft.New(ctx, log, nft.Options{NetNS: e.LB.NS, PoliciesOnOutput: true}) // as xlb kube-proxy
	case "ebpf":
		e.cg = testutil.NewCgroup(t)
		plane, err = ebpf.New(ctx, log, ebpf.Options{NetNS: e.LB.NS, PinPath: mountBPFFS(t), ConnTableSize: 16384, SocketCgroup: e.cg.Dir,
			PoliciesOnOutput: true}) // as xlb kube-proxy
	default:
		t.Fatalf("data plane %q", planeName)
	}
	if err != nil {
		t.Fatalf("%s plane: %v", planeName, err)
	}
	bolt, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewWriteBehind(bolt, log)
	e.eng, err = engine.New(ctx, log, plane, st)
	if err != nil {
		t.Fatal(err)
	}
	kc := kube.Config{Client: api.Client, Engine: e.eng, Log: log, NodeName: e.node,
		Flows: plane.(dataplane.FlowFlusher), // as xlb kube-proxy does
		Listen: func(network, addr string) (net.Listener, error) {
			var ln net.Listener
			err := testutil.Do(e.LB.NS, func() error {
				var err error
				ln, err = net.Listen(network, addr)
				return err
			})
			return ln, err
		}}
	if e.configure != nil {
		e.configure(&kc)
	}
	e.ctl, err = kube.New(kc)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.ctl.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("controller did not stop in 30s")
		}
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
		plane.Close()
		st.Close()
	})
	e.waitFor("the controller's first full reconcile", e.ctl.Ready)
}

// mountBPFFS mounts a bpf file system of the test's own on a temporary
// directory and unmounts it (dropping every pin, which detaches the
// program) at cleanup; it returns the pin path below it.
func mountBPFFS(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "xlb-kube-bpffs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		t.Fatalf("mount bpffs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return filepath.Join(dir, "xlb")
}

// waitFor polls cond every 10 ms for up to 15 s.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after 15s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFarm waits until the engine holds farm name and ok(farm) holds (a nil
// ok means "the farm is gone").
func (e *env) waitFarm(name string, ok func(f *model.Farm) bool) *model.Farm {
	e.t.Helper()
	var got *model.Farm
	e.waitFor(fmt.Sprintf("farm %q", name), func() bool {
		f, exists := e.eng.Snapshot().Farm(name)
		if ok == nil {
			return !exists
		}
		got = f
		return exists && ok(f)
	})
	return got
}

func hasBackends(n int) func(f *model.Farm) bool {
	return func(f *model.Farm) bool { return len(f.Backends) == n }
}

// startServers runs a TCP and a UDP server answering "b<i>" on port 8080 of
// every backend.
func (e *env) startServers() {
	for i, b := range e.Backends {
		name := fmt.Sprintf("b%d", i)
		testutil.StartTCPServer(e.t, b.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080), name)
		testutil.StartUDPServer(e.t, b.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080), name)
	}
}

// createService creates a Service in the test namespace.
func (e *env) createService(s *corev1.Service) *corev1.Service {
	e.t.Helper()
	out, err := e.client.CoreV1().Services(e.ns).Create(e.ctx, s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create service %s: %v", s.Name, err)
	}
	return out
}

// endpoint describes one endpoint of a test EndpointSlice: backend index
// and conditions.
type endpoint struct {
	backend     int
	ready       bool
	serving     bool
	terminating bool
	otherNode   bool
}

func ready(backends ...int) []endpoint {
	out := make([]endpoint, len(backends))
	for i, b := range backends {
		out[i] = endpoint{backend: b, ready: true, serving: true}
	}
	return out
}

// slice builds the EndpointSlice of Service svc for one address family,
// port name "p" (TCP and UDP) -> 8080.
func (e *env) slice(svc string, v6 bool, eps []endpoint) *discoveryv1.EndpointSlice {
	at := discoveryv1.AddressTypeIPv4
	if v6 {
		at = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   svc + "-" + strings.ToLower(string(at)),
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "xlb-test"},
		},
		AddressType: at,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("tcp"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("udp"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolUDP)},
		},
		Endpoints: []discoveryv1.Endpoint{},
	}
	for _, ep := range eps {
		node := e.node
		if ep.otherNode {
			node = "elsewhere"
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{e.Backends[ep.backend].Addr(v6).String()},
			NodeName:  ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr.To(ep.ready), Serving: ptr.To(ep.serving), Terminating: ptr.To(ep.terminating),
			},
		})
	}
	return s
}

// setEndpoints creates or replaces the EndpointSlice of a Service.
func (e *env) setEndpoints(svc string, v6 bool, eps []endpoint) {
	e.t.Helper()
	s := e.slice(svc, v6, eps)
	api := e.client.DiscoveryV1().EndpointSlices(e.ns)
	cur, err := api.Get(e.ctx, s.Name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(e.ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(e.ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		e.t.Fatalf("set endpoints of %s: %v", svc, err)
	}
}

// service returns a Service with ports tcp/80 and udp/80 -> 8080.
func service(name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type: typ,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP},
				{Name: "udp", Port: 80, Protocol: corev1.ProtocolUDP},
			},
		},
	}
}

// spread asks addr n times over TCP (or UDP) from the client and counts the
// answers by backend name. Every request must be answered.
func (e *env) spread(addr netip.AddrPort, udp bool, n int) map[string]int {
	e.t.Helper()
	out, err := e.trySpread(addr, udp, n)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// spreadNow is spread for a waitFor condition: a failed ask is "not yet"
// (a Service whose endpoints are not programmed yet refuses, as
// kube-proxy's REJECT does), not a failure of the test.
func (e *env) spreadNow(addr netip.AddrPort, udp bool, n int) map[string]int {
	e.t.Helper()
	out, err := e.trySpread(addr, udp, n)
	if err != nil {
		return nil
	}
	return out
}

// trySpread asks n times and counts the answers per endpoint.
func (e *env) trySpread(addr netip.AddrPort, udp bool, n int) (map[string]int, error) {
	out := map[string]int{}
	for range n {
		ask := testutil.AskTCP
		if udp {
			// Each ask from a source port no earlier ask used: a port
			// the kernel picks again would match the earlier ask's UDP
			// conntrack entry (alive 30 s) and reach that backend
			// without a turn of round robin.
			local := netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(udpSourcePort.Add(1)))
			if addr.Addr().Is6() {
				local = netip.AddrPortFrom(netip.IPv6Unspecified(), local.Port())
			}
			ask = func(ns netns.NsHandle, to netip.AddrPort) (string, error) { return testutil.AskUDPFrom(ns, local, to) }
		}
		got, err := ask(e.Client.NS, addr)
		if err != nil {
			return nil, fmt.Errorf("ask %s (udp=%v): %w", addr, udp, err)
		}
		name, _, err := testutil.ParseReply(got)
		if err != nil {
			return nil, err
		}
		out[name]++
	}
	return out, nil
}

// udpSourcePort hands out client source ports below the kernel's ephemeral
// range, each once per test process.
var udpSourcePort atomic.Int32

func init() { udpSourcePort.Store(20000) }

func keys(m map[string]int) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return strings.Join(sorted(out), ",")
}

func sorted(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}
