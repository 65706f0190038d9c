package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/kube/kubetest"
	"github.com/xlb-lb/xlb/internal/testutil"
)

var (
	buildOnce sync.Once
	xlbPath   string
	buildErr  error
)

// xlbBinary builds cmd/xlb once per test run, with xlb-kube-proxy next to
// it (what `xlb kube-proxy` runs).
func xlbBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "xlb-kube-bin")
		if err != nil {
			buildErr = err
			return
		}
		xlbPath = filepath.Join(dir, "xlb")
		for _, b := range [][2]string{{xlbPath, "../../cmd/xlb"}, {filepath.Join(dir, "xlb-kube-proxy"), "../../cmd/xlb-kube-proxy"}} {
			out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %v: %s", b[1], err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return xlbPath
}

// bindProxyRole creates the ClusterRole of deploy/rbac.yaml (under a test
// name) and binds it to kubetest.ProxyUser, so the command runs with exactly
// the permissions the manifest grants.
func (e *env) bindProxyRole() {
	e.t.Helper()
	raw, err := os.ReadFile("../../deploy/rbac.yaml")
	if err != nil {
		e.t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var role *rbacv1.ClusterRole
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			e.t.Fatalf("deploy/rbac.yaml: %v", err)
		}
		if obj["kind"] == "ClusterRole" {
			j, _ := json.Marshal(obj)
			role = &rbacv1.ClusterRole{}
			if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(j), 4096).Decode(role); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	if role == nil {
		e.t.Fatal("deploy/rbac.yaml has no ClusterRole")
	}
	role.Name = e.ns + "-proxy"
	role.ResourceVersion = ""
	rb := e.client.RbacV1()
	if _, err := rb.ClusterRoles().Create(e.ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create cluster role: %v", err)
	}
	e.t.Cleanup(func() { _ = rb.ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{}) })
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubetest.ProxyUser}},
	}
	if _, err := rb.ClusterRoleBindings().Create(e.ctx, binding, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create cluster role binding: %v", err)
	}
	e.t.Cleanup(func() {
		_ = rb.ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
}

// forwardAPI listens on 127.0.0.1:port inside the LB namespace and forwards
// each connection to the API server on the host's 127.0.0.1, so a command
// running in the LB namespace reaches the API server at the same address
// (its certificate is for 127.0.0.1).
func (e *env) forwardAPI(host string) string {
	e.t.Helper()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(host, "https://"))
	e.forwardAPIAt(e.LB, "127.0.0.1:"+port, host)
	return "https://127.0.0.1:" + port
}

// forwardAPIAt listens on listen inside h's namespace and forwards each
// connection to the API server at host (on the host's 127.0.0.1).
func (e *env) forwardAPIAt(h testutil.Host, listen, host string) {
	e.t.Helper()
	testutil.ForwardTCP(e.t, h, listen, strings.TrimPrefix(host, "https://"))
}

// proxyProcess is `xlb kube-proxy` running in the LB namespace.
type proxyProcess struct {
	cmd  *exec.Cmd
	done chan error
	log  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (e *env) startProxy(bin, kubeconfig, stateDir string, extra ...string) *proxyProcess {
	e.t.Helper()
	return e.startProxyEnv(nil, bin, kubeconfig, stateDir, extra...)
}

// startProxyEnv is startProxy with more environment variables (NAME=value).
func (e *env) startProxyEnv(env []string, bin, kubeconfig, stateDir string, extra ...string) *proxyProcess {
	e.t.Helper()
	args := append([]string{"--kubeconfig", kubeconfig, "--hostname-override", e.node, "--state-dir", stateDir,
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256"}, extra...)
	return e.startProxyArgs(env, bin, args...)
}

// startProxyArgs runs `xlb kube-proxy args...` in the LB namespace with
// more environment variables (NAME=value), killed at cleanup.
func (e *env) startProxyArgs(env []string, bin string, args ...string) *proxyProcess {
	e.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", e.LB.Name, bin, "kube-proxy"}, args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	p := &proxyProcess{cmd: cmd, done: make(chan error, 1), log: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	e.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
		if e.t.Failed() {
			e.t.Logf("xlb kube-proxy log:\n%s", p.log.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proxyProcess) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("xlb kube-proxy exited with %v; log:\n%s", err, p.log.String())
		}
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("xlb kube-proxy did not stop in 20s after SIGTERM")
	}
}

// httpGet fetches a URL from inside the LB namespace.
func (e *env) httpGet(url string) (int, string, error) {
	resp, err := testutil.HTTPClient(e.LB.NS).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// proxyKubeconfig binds deploy/rbac.yaml's ClusterRole to the proxy user
// and writes a kubeconfig of that user that reaches the API server from the
// LB namespace.
func (e *env) proxyKubeconfig(api *kubetest.Env) string {
	e.t.Helper()
	e.bindProxyRole()
	server := e.forwardAPI(api.ProxyConfig.Host)
	kubeconfig := filepath.Join(e.t.TempDir(), "proxy.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: p, user: {token: %q}}]
contexts: [{name: t, context: {cluster: t, user: p}}]
current-context: t
`, server, api.ProxyConfig.TLSClientConfig.CAFile, api.ProxyConfig.BearerToken)), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return kubeconfig
}

// TestKubeProxyCommand runs the real `xlb kube-proxy` command in the LB
// namespace as a user with only deploy/rbac.yaml's ClusterRole: it programs
// a Service, records an Event for an invalid annotation, serves /healthz and
// /metrics, and on SIGTERM exits leaving the rules in place; a restart picks
// up a change made while it was down.
func TestKubeProxyCommand(t *testing.T) {
	e := newWorld(t, 2)
	api := apiserver(t)
	bin := xlbBinary(t)
	e.startServers()
	kubeconfig := e.proxyKubeconfig(api)
	stateDir := t.TempDir()
	p := e.startProxy(bin, kubeconfig, stateDir)
	e.waitHealthy()

	svc := e.createService(service("web", corev1.ServiceTypeClusterIP))
	e.setEndpoints("web", false, ready(0, 1))
	addr := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	e.waitBothEndpoints(addr)

	// The proxy user may write Events.
	e.annotate("web", map[string]string{"xlb.io/scheduler": "fastest"})
	ev := e.waitEvent("web", kube.ReasonInvalidAnnotation)
	if ev.Source.Component != "xlb-kube-proxy" || ev.Source.Host != e.node {
		t.Errorf("event source %+v", ev.Source)
	}

	code, body, err := e.httpGet("http://127.0.0.1:10249/metrics")
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	for _, m := range []string{
		"xlb_kubeproxy_sync_proxy_rules_duration_seconds_count",
		"xlb_kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"xlb_kubeproxy_sync_proxy_rules_pending_changes",
		"xlb_kubeproxy_network_programming_duration_seconds_bucket",
		"xlb_kubeproxy_rejected_changes_total 1",
		// kube-proxy's own names, for existing dashboards and alerts.
		"kubeproxy_sync_proxy_rules_duration_seconds_bucket",
		"kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
		"kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
		"kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"}",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total",
		"kubeproxy_sync_proxy_rules_service_changes_total",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending",
		"kubeproxy_sync_proxy_rules_service_changes_pending",
		// xlb's own families, the same names as xlb daemon's (docs/observability.md).
		"xlb_farms ",
		"xlb_backend_weight{farm=",
		"xlb_backend_connections_active{farm=",
		"xlb_engine_change_duration_seconds_count",
	} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics has no %q", m)
		}
	}
	if n := metricValue(body, "xlb_kubeproxy_sync_proxy_rules_duration_seconds_count"); n < 2 {
		t.Errorf("sync count %v, want at least 2", n)
	}
	// One Service created, its slice created, its annotation changed.
	if n := metricValue(body, "kubeproxy_sync_proxy_rules_service_changes_total"); n < 2 {
		t.Errorf("kubeproxy service changes %v, want at least 2", n)
	}
	if n := metricValue(body, "kubeproxy_sync_proxy_rules_endpoint_changes_total"); n < 1 {
		t.Errorf("kubeproxy endpoint changes %v, want at least 1", n)
	}

	old := e.createService(service("old", corev1.ServiceTypeClusterIP))
	e.setEndpoints("old", false, ready(0))
	oldAddr := netip.AddrPortFrom(netip.MustParseAddr(old.Spec.ClusterIP), 80)
	e.waitFor("traffic to service old", func() bool {
		_, err := testutil.AskTCP(e.Client.NS, oldAddr)
		return err == nil
	})

	// Stop: the rules stay and traffic keeps flowing.
	p.stop(t)
	if got := e.spread(addr, false, 6); keys(got) != "b0,b1" {
		t.Errorf("after stop: answers %v", got)
	}
	if got := e.spread(oldAddr, false, 2); keys(got) != "b0" {
		t.Errorf("service old after stop: answers %v", got)
	}
	// Changes while the proxy is down are applied at restart: an endpoint
	// change, and a Service deleted.
	e.annotate("web", nil)
	e.setEndpoints("web", false, ready(1))
	if err := e.client.DiscoveryV1().EndpointSlices(e.ns).Delete(e.ctx, "old-ipv4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().Services(e.ns).Delete(e.ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startProxy(bin, kubeconfig, stateDir)
	e.waitFor("only b1 answers after the restart", func() bool {
		got := e.spread(addr, false, 4)
		return keys(got) == "b1"
	})
	e.waitFor("the deleted service's address to stop answering", func() bool {
		_, err := testutil.AskTCP(e.Client.NS, oldAddr)
		return err != nil
	})
}

var metricLine = regexp.MustCompile(`(?m)^(\S+) (\S+)$`)

func metricValue(body, name string) float64 {
	for _, m := range metricLine.FindAllStringSubmatch(body, -1) {
		if m[1] == name {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// TestKubeProxyCommandEBPF runs `xlb kube-proxy --dataplane ebpf` (default
// interfaces: every one of the LB namespace but loopback; pins in a bpffs
// the test mounts): a Service's traffic is spread over its endpoints, and
// it keeps flowing after the proxy exits (the program and maps stay
// pinned); a Service without endpoints is refused.
func TestKubeProxyCommandEBPF(t *testing.T) {
	e := newWorld(t, 2)
	api := apiserver(t)
	bin := xlbBinary(t)
	e.startServers()
	kubeconfig := e.proxyKubeconfig(api)
	p := e.startProxy(bin, kubeconfig, t.TempDir(), "--dataplane", "ebpf", "--pin-path", mountBPFFS(t), "--conn-table-size", "4096")
	e.waitHealthy()
	svc := e.createService(service("web", corev1.ServiceTypeClusterIP))
	e.setEndpoints("web", false, ready(0, 1))
	addr := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	e.waitBothEndpoints(addr)
	empty := e.createService(service("empty", corev1.ServiceTypeClusterIP))
	eaddr := netip.AddrPortFrom(netip.MustParseAddr(empty.Spec.ClusterIP), 80)
	e.waitFor("the Service without endpoints refused", func() bool {
		c, err := testutil.DialTCP(e.Client.NS, eaddr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return errors.Is(err, syscall.ECONNREFUSED)
	})
	if !strings.Contains(p.log.String(), "dataplane=ebpf") {
		t.Errorf("the proxy does not log its data plane:\n%s", p.log.String())
	}
	p.stop(t)
	if got := e.spread(addr, false, 4); keys(got) != "b0,b1" {
		t.Errorf("after the proxy exited: answers %v, want b0 and b1", got)
	}
}

// waitHealthy waits until the proxy's /healthz answers 200.
func (e *env) waitHealthy() {
	e.t.Helper()
	e.waitFor("/healthz ok", func() bool {
		code, _, err := e.httpGet("http://127.0.0.1:10256/healthz")
		return err == nil && code == 200
	})
}

// waitBothEndpoints waits until new TCP connections to addr reach both
// endpoints, b0 and b1.
func (e *env) waitBothEndpoints(addr netip.AddrPort) {
	e.t.Helper()
	e.waitFor("traffic to both endpoints", func() bool {
		seen := map[string]bool{}
		for range 6 {
			got, err := testutil.AskTCP(e.Client.NS, addr)
			if err != nil {
				return false
			}
			name, _, _ := testutil.ParseReply(got)
			seen[name] = true
		}
		return seen["b0"] && seen["b1"]
	})
}
