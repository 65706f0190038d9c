// Package kubetest runs a real etcd and kube-apiserver for tests: on
// 127.0.0.1 only, in a temporary directory, stopped and removed in
// tb.Cleanup. The binaries come from scripts/kube-binaries.sh (built from the
// Go module proxy and cached under ~/.cache/xlb/kube/<version>/), or from
// the directory in XLB_KUBE_BIN_DIR.
//
// No controller-manager runs: tests create EndpointSlices themselves, and a
// deleted namespace stays Terminating (nothing finalizes it) until the API
// server is stopped.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// BinDirEnv names the environment variable that points at a directory
// holding etcd and kube-apiserver (skipping scripts/kube-binaries.sh).
const BinDirEnv = "XLB_KUBE_BIN_DIR"

// Service address ranges of the test API server.
const (
	ServiceCIDR4 = "10.96.0.0/16"
	ServiceCIDR6 = "fd00:96::/108"
)

// Users in the API server's token file.
const (
	AdminUser = "xlb-test-admin" // in system:masters
	ProxyUser = "xlb-test-proxy" // no groups: gets only what RBAC grants it
)

// Env is a running etcd + kube-apiserver.
type Env struct {
	// Config is an admin client configuration (system:masters).
	Config *rest.Config
	// ProxyConfig authenticates as ProxyUser, who has no permissions until
	// a test binds a role to it.
	ProxyConfig *rest.Config
	Client      kubernetes.Interface
	// Kubeconfig is a kubeconfig file for Config (for commands under test).
	Kubeconfig string
	// ProxyKubeconfig is a kubeconfig file for ProxyConfig.
	ProxyKubeconfig string
	Dir             string

	procs []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// BinDir returns the directory of the Kubernetes test binaries, building
// them with scripts/kube-binaries.sh if XLB_KUBE_BIN_DIR is not set (a warm
// run takes well under a second; a cold one about 8-10 minutes).
func BinDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "scripts", "kube-binaries.sh"), "etcd", "kube-apiserver")
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/kube-binaries.sh: %w: %s", err, lastLines(errb.String(), 20))
	}
	return strings.TrimSpace(out.String()), nil
}

func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("find the repository root: no caller information")
	}
	// internal/kube/kubetest/kubetest.go -> repository root.
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	if _, err := os.Stat(filepath.Join(root, "scripts", "kube-binaries.sh")); err != nil {
		return "", fmt.Errorf("find scripts/kube-binaries.sh from %s (set %s): %w", root, BinDirEnv, err)
	}
	return root, nil
}

// Start runs etcd and kube-apiserver and waits until the API server is
// ready. Everything is stopped and removed in tb.Cleanup.
func Start(tb testing.TB) *Env {
	tb.Helper()
	env, err := StartE(tb.TempDir())
	if err != nil {
		tb.Fatalf("start kube-apiserver: %v", err)
	}
	tb.Cleanup(env.Stop)
	return env
}

// StartE is Start for callers without a testing.TB (TestMain): the caller
// must call Stop. dir must exist and is left for the caller to remove.
func StartE(dir string) (*Env, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	env := &Env{Dir: dir}
	ok := false
	defer func() {
		if !ok {
			env.Stop()
		}
	}()
	// Ports: picked free, then bound by the children. Another process may
	// take one in between; then the child fails and the error says so.
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	if err := env.run("etcd", filepath.Join(bin, "etcd"),
		"--name=xlb-test",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=xlb-test="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn",
		"--quota-backend-bytes=4294967296",
	); err != nil {
		return nil, err
	}

	adminToken, proxyToken := randHex(16), randHex(16)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("%s,%s,%s-uid,\"system:masters\"\n%s,%s,%s-uid\n",
		adminToken, AdminUser, AdminUser, proxyToken, ProxyUser, ProxyUser)), 0o600); err != nil {
		return nil, err
	}
	saKey := filepath.Join(dir, "sa.key")
	saPub := filepath.Join(dir, "sa.pub")
	if err := writeKeyPair(saKey, saPub); err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	port := ports[2]
	if err := env.run("kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--cert-dir="+certDir,
		"--token-auth-file="+tokens,
		"--authorization-mode=RBAC",
		"--service-account-key-file="+saPub,
		"--service-account-signing-key-file="+saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range="+ServiceCIDR4+","+ServiceCIDR6,
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type=none",
		"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
		"--v=0",
	); err != nil {
		return nil, err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(port)
	cfg := func(token string) *rest.Config {
		return &rest.Config{
			Host:            host,
			BearerToken:     token,
			TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(certDir, "apiserver.crt")},
			QPS:             2000,
			Burst:           4000,
		}
	}
	env.Config = cfg(adminToken)
	env.ProxyConfig = cfg(proxyToken)
	if err := env.waitReady(60 * time.Second); err != nil {
		return nil, err
	}
	if env.Client, err = kubernetes.NewForConfig(env.Config); err != nil {
		return nil, err
	}
	if env.Kubeconfig, err = writeKubeconfig(dir, "admin", env.Config); err != nil {
		return nil, err
	}
	if env.ProxyKubeconfig, err = writeKubeconfig(dir, "proxy", env.ProxyConfig); err != nil {
		return nil, err
	}
	ok = true
	return env, nil
}

// run starts a child process whose output goes to <dir>/<name>.log.
func (e *Env) run(name, path string, args ...string) error {
	log, err := os.Create(filepath.Join(e.Dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Own process group, and SIGKILL if the test process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: log}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	e.procs = append(e.procs, p)
	return nil
}

// waitReady polls /readyz until it answers ok, a child exits, or timeout.
func (e *Env) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	var c *http.Client
	for time.Now().Before(deadline) {
		for _, p := range e.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited: %s", p.name, e.tail(p))
			default:
			}
		}
		if c == nil {
			// The API server writes its self-signed certificate at start.
			var err error
			if _, err = os.Stat(e.Config.TLSClientConfig.CAFile); err == nil {
				c, err = rest.HTTPClientFor(e.Config)
			}
			if err != nil {
				last = err.Error()
				time.Sleep(200 * time.Millisecond)
				continue
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.Config.Host+"/readyz", nil)
		resp, err := c.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %s (last: %s): %s", timeout, last, e.tail(e.procs[len(e.procs)-1]))
}

func (e *Env) tail(p *proc) string {
	b, _ := os.ReadFile(p.log.Name())
	return lastLines(string(b), 15)
}

// Stop stops kube-apiserver, then etcd (SIGTERM, then SIGKILL after 10 s).
func (e *Env) Stop() {
	for i := len(e.procs) - 1; i >= 0; i-- {
		p := e.procs[i]
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		p.log.Close()
	}
	e.procs = nil
}

var portMu sync.Mutex

func freePorts(n int) ([]int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func writeKeyPair(keyPath, pubPath string) error {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

func writeKubeconfig(dir, name string, c *rest.Config) (string, error) {
	path := filepath.Join(dir, name+".kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, c.Host, c.TLSClientConfig.CAFile, name, c.BearerToken, name)
	return path, os.WriteFile(path, []byte(body), 0o600)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
