package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xlb-lb/xlb/internal/kube/kubetest"
)

const kpMetrics = "http://127.0.0.1:10249/metrics"

var kpSyncTimeout = flag.Duration("kube-proxy-sync-timeout", 5*time.Minute, "how long kube-proxy may take for its first full sync")

// measureKubeProxy runs the real kube-proxy (built by
// scripts/kube-binaries.sh kube-proxy) in mode against the same API server
// and times the same endpoint changes. kube-proxy measures them itself: its
// kubeproxy_network_programming_duration_seconds histogram observes, for
// each EndpointSlice change carrying the endpoints.kubernetes.io/
// last-change-trigger-time annotation, the time from that trigger time (set
// here just before the update call) until its rules were synced. One change
// at a time, so each change adds one observation and the sum's increase is
// its latency.
func measureKubeProxy(ctx context.Context, env *kubetest.Env, dir, mode string, services int) kpResult {
	r := kpResult{mode: mode}
	stop, err := startKubeProxy(ctx, env, dir, mode)
	if err != nil {
		r.err = err.Error()
		return r
	}
	defer stop()
	log.Printf("kube-proxy %s: synced %d Services", mode, services)
	time.Sleep(3 * time.Second) // let the start-up syncs settle

	for i := range *runs + 3 {
		svc := fmt.Sprintf("s%05d", (i*7919+17)%services)
		d, err := kubeProxyChange(ctx, env, svc, i)
		if err != nil {
			r.err = err.Error()
			return r
		}
		if i >= 3 {
			r.samples = append(r.samples, d)
		}
	}
	return r
}

// startKubeProxy runs kube-proxy in mode in this namespace against env's
// API server and waits for its first full sync. stop ends it and removes
// what it left in nftables (its iptables mode's rules are iptables-nft
// tables).
func startKubeProxy(ctx context.Context, env *kubetest.Env, dir, mode string) (stop func(), err error) {
	bin := filepath.Join(os.Getenv(kubetest.BinDirEnv), "kube-proxy")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("no kube-proxy binary (scripts/kube-binaries.sh kube-proxy): %v", err)
	}
	if mode == "iptables" {
		if _, err := exec.LookPath("iptables-restore"); err != nil {
			return nil, fmt.Errorf("iptables mode needs iptables (apt-get install iptables): %v", err)
		}
	}
	logf, err := os.Create(filepath.Join(dir, "kube-proxy-"+mode+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--kubeconfig", env.Kubeconfig, "--hostname-override", "bench-node",
		"--proxy-mode", mode, "--conntrack-max-per-core=0",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256", "--v=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		// Leave the namespace's nftables to the next proxy.
		flushRuleset()
	}
	// Ready: a full sync done with every Service.
	deadline := time.Now().Add(*kpSyncTimeout)
	for {
		m, err := scrape(ctx)
		if err == nil && m["kubeproxy_sync_proxy_rules_last_timestamp_seconds"] > 0 {
			break
		}
		select {
		case err := <-done:
			done <- err
			stop()
			return nil, fmt.Errorf("kube-proxy exited: %v (log %s)", err, logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("kube-proxy did not sync in %s (log %s)", *kpSyncTimeout, logf.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
	log.Printf("kube-proxy %s: first sync after %s", mode, time.Since(start).Round(time.Millisecond))
	return stop, nil
}

func kubeProxyChange(ctx context.Context, env *kubetest.Env, svc string, round int) (time.Duration, error) {
	api := env.Client.DiscoveryV1().EndpointSlices(namespace)
	cur, err := api.Get(ctx, svc, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	i, _ := strconv.Atoi(strings.TrimPrefix(svc, "s"))
	spare := max(16-*endpoints, 2)
	last := &cur.Endpoints[len(cur.Endpoints)-1]
	addr := endpointAddr(i, 16-spare+round%spare)
	if last.Addresses[0] == addr {
		addr = endpointAddr(i, 16-spare+(round+1)%spare)
	}
	last.Addresses = []string{addr}
	before, err := scrape(ctx)
	if err != nil {
		return 0, err
	}
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations["endpoints.kubernetes.io/last-change-trigger-time"] = time.Now().Format(time.RFC3339Nano)
	if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(30 * time.Second)
	const name = "kubeproxy_network_programming_duration_seconds"
	for time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		m, err := scrape(ctx)
		if err != nil {
			continue
		}
		if dn := m[name+"_count"] - before[name+"_count"]; dn >= 1 {
			return time.Duration((m[name+"_sum"] - before[name+"_sum"]) / dn * 1e9), nil
		}
	}
	return 0, fmt.Errorf("kube-proxy did not program the change of %s in 30s", svc)
}

// scrape reads kube-proxy's metrics, summed over their labels.
func scrape(ctx context.Context) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, kpMetrics, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "kubeproxy_") {
			continue
		}
		// Samples are labelled by ip_family: add the families up.
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			if j := strings.LastIndexByte(line, '}'); j > i {
				name, rest = line[:i], strings.TrimSpace(line[j+1:])
			}
		}
		if strings.Contains(name, "_bucket") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) >= 1 {
			v, _ := strconv.ParseFloat(f[0], 64)
			out[name] += v
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return out, sc.Err()
}
