package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/xlb-lb/xlb/internal/kube/crd"
	"github.com/xlb-lb/xlb/internal/kube/kubetest"
	"github.com/xlb-lb/xlb/internal/testutil"
)

var (
	kubeDaemonOnce sync.Once
	kubeDaemonPath string
	kubeDaemonErr  error
)

// kubeDaemonBinary builds xlb-kube-daemon (cmd/xlb with -tags kubecrd),
// or takes XLB_E2E_KUBE_DAEMON_BIN.
func kubeDaemonBinary(t *testing.T) string {
	t.Helper()
	kubeDaemonOnce.Do(func() {
		if p := os.Getenv("XLB_E2E_KUBE_DAEMON_BIN"); p != "" {
			kubeDaemonPath = p
			return
		}
		dir, err := os.MkdirTemp("", "xlb-e2e-kube-daemon")
		if err != nil {
			kubeDaemonErr = err
			return
		}
		kubeDaemonPath = filepath.Join(dir, "xlb-kube-daemon")
		out, err := exec.Command("go", "build", "-tags", "kubecrd", "-o", kubeDaemonPath, "../../cmd/xlb").CombinedOutput()
		if err != nil {
			kubeDaemonErr = fmt.Errorf("go build -tags kubecrd: %v: %s", err, out)
		}
	})
	if kubeDaemonErr != nil {
		t.Fatal(kubeDaemonErr)
	}
	return kubeDaemonPath
}

// crdClient is the test's admin view of the custom resources.
type crdClient struct {
	t   *testing.T
	dyn dynamic.Interface
}

func (c crdClient) res(kind string) dynamic.NamespaceableResourceInterface {
	switch kind {
	case crd.KindTable:
		return c.dyn.Resource(crd.TableResource)
	case crd.KindCheck:
		return c.dyn.Resource(crd.CheckResource)
	}
	return c.dyn.Resource(crd.FarmResource)
}

func (c crdClient) apply(kind, name string, spec map[string]any) {
	c.t.Helper()
	ctx := context.Background()
	u, err := c.res(kind).Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		u.Object["spec"] = spec
		_, err = c.res(kind).Update(ctx, u, metav1.UpdateOptions{})
	} else {
		u = &unstructured.Unstructured{Object: map[string]any{"apiVersion": crd.Group + "/" + crd.Version, "kind": kind,
			"metadata": map[string]any{"name": name}, "spec": spec}}
		_, err = c.res(kind).Create(ctx, u, metav1.CreateOptions{})
	}
	if err != nil {
		c.t.Fatalf("%s %s: %v", kind, name, err)
	}
}

func (c crdClient) delete(kind, name string) {
	c.t.Helper()
	if err := c.res(kind).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("delete %s %s: %v", kind, name, err)
	}
}

// programmed returns node's Programmed condition of the object's current
// generation ("" while there is none) and its message.
func (c crdClient) programmed(kind, name, node string) (string, string) {
	u, err := c.res(kind).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", err.Error()
	}
	nodes, _, _ := unstructured.NestedSlice(u.Object, "status", "nodes")
	for _, n := range nodes {
		m := n.(map[string]any)
		if m["node"] != node || m["observedGeneration"] != u.GetGeneration() {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(m, "conditions")
		for _, cd := range cs {
			cm := cd.(map[string]any)
			if cm["type"] == "Programmed" {
				s, _ := cm["status"].(string)
				msg, _ := cm["message"].(string)
				return s, msg
			}
		}
	}
	return "", ""
}

// TestCRDNodes: two xlb daemons (--kube-crd, in two LB namespaces behind
// BIRD's ECMP) watch the same custom resources on a real kube-apiserver.
// A Farm, its policy Table and its Check reach both kernels: both nodes
// announce the VIP and carry its connections; a Table change blocks the
// client on both; a bad Farm is refused on each node with a condition
// naming the field and changes nothing; deleting the Farm removes it from
// both (both withdraw the VIP). The daemons' APIs refuse writes.
func TestCRDNodes(t *testing.T) {
	testutil.RequireRoot(t)
	bin := kubeDaemonBinary(t)
	topo := testutil.NewHATopology(t, testutil.HAOptions{LBs: 2, Backends: 2})
	bird := topo.StartBIRD(t, testutil.BIRDOptions{Peers: 2})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bird routes:\n%s", bird.Show("route", "all"))
		}
	})
	for i, b := range topo.Backends {
		testutil.StartTCPServer(t, b.NS, netip.AddrPortFrom(b.IPv4, 8080), fmt.Sprintf("backend-%d", i+1))
	}
	api := kubetest.Start(t)
	api.InstallCRDs(t, "../../deploy/crd/crds.yaml")
	dyn, err := dynamic.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	kc := crdClient{t: t, dyn: dyn}

	// Each node reaches the API server at the address of its certificate
	// (127.0.0.1) through a forwarder in its namespace.
	target := strings.TrimPrefix(api.Config.Host, "https://")
	var nodes []*haNode
	for _, lb := range topo.LBs {
		testutil.ForwardTCP(t, lb.Host, target, target)
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: t, context: {cluster: t, user: u}}]
current-context: t
`, api.Config.Host, api.Config.TLSClientConfig.CAFile, api.Config.BearerToken)), 0o600); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, newHANodeBin(t, topo, lb, bin, "--kube-crd", "--kubeconfig", kubeconfig, "--kube-node-name", lb.Name))
	}
	vip := testutil.VIP4(1)

	kc.apply(crd.KindTable, "blocked", map[string]any{"type": "addr", "verdict": "deny",
		"entries": []any{map[string]any{"key": "192.0.2.0/24"}}})
	backends := []any{}
	for i, b := range topo.Backends {
		backends = append(backends, map[string]any{"name": fmt.Sprintf("be%d", i+1), "ip-addr": b.IPv4.String(), "port": "8080"})
	}
	web := map[string]any{"virtual-addr": vip.String(), "virtual-ports": "80", "protocol": "tcp", "mode": "snat",
		"scheduler": "maglev", "backends": backends, "policies": []any{map[string]any{"name": "blocked"}}}
	kc.apply(crd.KindFarm, "web", web)
	kc.apply(crd.KindCheck, "web", map[string]any{"farm": "web", "type": "tcp", "inter": "500ms", "timeout": "200ms"})
	for _, n := range nodes {
		for _, o := range [][2]string{{crd.KindFarm, "web"}, {crd.KindTable, "blocked"}, {crd.KindCheck, "web"}} {
			waitFor(t, fmt.Sprintf("%s %s programmed on %s", o[0], o[1], n.lb.Name), 20*time.Second, func() bool {
				s, _ := kc.programmed(o[0], o[1], n.lb.Name)
				return s == "True"
			})
		}
	}
	// Both kernels hold the farm: both nodes announce it, both carry
	// connections (snat: the backend sees the node's address).
	topo.WaitNextHops(t, vip, 2, 20*time.Second)
	if via := lbsUsed(t, topo, vip, 40); len(via) != 2 {
		t.Fatalf("40 connections went through %v, want both LBs", via)
	}
	for _, n := range nodes {
		out := n.mustCLI("farm", "list")
		if !strings.Contains(out, "web") {
			t.Fatalf("%s: xlb farm list:\n%s", n.lb.Name, out)
		}
		if out, err := n.cli("farm", "add", "x", "--vip", "10.99.0.9", "--ports", "80"); err == nil || !strings.Contains(out, "custom resources") {
			t.Fatalf("%s: a write through the API of a --kube-crd daemon: %v %s", n.lb.Name, err, out)
		}
		if out := n.mustCLI("farm", "show", "web"); !strings.Contains(out, `"check"`) {
			t.Fatalf("%s: web has no check:\n%s", n.lb.Name, out)
		}
	}

	// The table reaches both kernels: the client's address in it blocks
	// the client on every path; out of it, the client passes again.
	kc.apply(crd.KindTable, "blocked", map[string]any{"type": "addr", "verdict": "deny",
		"entries": []any{map[string]any{"key": "192.0.2.0/24"}, map[string]any{"key": topo.Client.IPv4.String()}}})
	waitFor(t, "the client blocked through both nodes", 20*time.Second, func() bool {
		for range 20 {
			if _, err := askWithin(topo, vip, 300*time.Millisecond); err == nil {
				return false
			}
		}
		return true
	})
	kc.apply(crd.KindTable, "blocked", map[string]any{"type": "addr", "verdict": "deny",
		"entries": []any{map[string]any{"key": "192.0.2.0/24"}}})
	waitFor(t, "the client passes again", 20*time.Second, func() bool {
		_, err := askWithin(topo, vip, time.Second)
		return err == nil
	})

	// A bad farm: refused on each node, named; the others go on.
	kc.apply(crd.KindFarm, "bad", map[string]any{"virtual-addr": vip.String(), "virtual-ports": "80-70"})
	for _, n := range nodes {
		var msg string
		waitFor(t, "bad refused on "+n.lb.Name, 20*time.Second, func() bool {
			var s string
			s, msg = kc.programmed(crd.KindFarm, "bad", n.lb.Name)
			return s == "False"
		})
		if !strings.Contains(msg, "virtual-ports") || !strings.Contains(msg, "80-70") {
			t.Fatalf("%s: %q does not name the field and value", n.lb.Name, msg)
		}
		if out := n.mustCLI("farm", "list"); strings.Contains(out, "bad") {
			t.Fatalf("%s: the bad farm is in the state:\n%s", n.lb.Name, out)
		}
	}
	if via := lbsUsed(t, topo, vip, 20); len(via) != 2 {
		t.Fatalf("after the bad farm: 20 connections went through %v, want both LBs", via)
	}

	// Deleting the farm removes it from both kernels: both withdraw.
	kc.delete(crd.KindFarm, "web")
	topo.WaitNextHops(t, vip, 0, 20*time.Second)
	for _, n := range nodes {
		waitFor(t, "web gone from "+n.lb.Name, 10*time.Second, func() bool {
			out, err := n.cli("farm", "list")
			return err == nil && !strings.Contains(out, "web")
		})
	}
}

// askWithin connects to vip:80 from the client and reads the greeting,
// within timeout each.
func askWithin(topo *testutil.HATopology, vip netip.Addr, timeout time.Duration) (string, error) {
	c, err := testutil.DialTCP(topo.Client.NS, netip.AddrPortFrom(vip, 80), timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return testutil.ReadLine(c, timeout)
}
