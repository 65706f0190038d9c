package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
)

// A proxy started with the in-cluster configuration reaches the API server
// through the kubernetes Service's cluster IP (KUBERNETES_SERVICE_HOST),
// and on a fresh node nothing serves that address before the proxy's own
// first sync: it would wait forever. kube-proxy avoids this with a
// kubeconfig naming the API server's real address (kubeadm's kube-proxy
// ConfigMap). xlb does that too (--kubeconfig), and can also program the
// kubernetes Service first, from addresses it is given
// (--apiserver-endpoints), before it talks to the API server at all; the
// first full reconcile then replaces that farm with the one the Service and
// its EndpointSlice make. On a restart the saved state holds the farm
// already.

// APIServiceAddr returns the address and port a client configuration's
// host names, when it is an IP address (the in-cluster configuration's
// https://<cluster IP>:443).
func APIServiceAddr(host string) (netip.AddrPort, bool) {
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		return netip.AddrPort{}, false
	}
	h, p := u.Hostname(), u.Port()
	a, err := netip.ParseAddr(h)
	if err != nil {
		return netip.AddrPort{}, false
	}
	if p == "" {
		p = "443"
		if u.Scheme == "http" {
			p = "80"
		}
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(n)), true
}

// BootstrapAPIFarm programs the farm of the kubernetes Service (default/
// kubernetes, port https) on svc with the API server's real addresses as
// backends, so a client reaching the API server through the cluster IP
// works before the first sync. The farm has the name the Service's own
// farm has, so the first full reconcile replaces it.
func BootstrapAPIFarm(ctx context.Context, eng *engine.Engine, svc netip.AddrPort, endpoints []netip.AddrPort) error {
	f := model.NewFarm(FarmName("default", "kubernetes", "https", KindCluster, svc.Addr()))
	f.VirtualAddr = svc.Addr()
	f.Family = model.FamilyIPv4
	if svc.Addr().Is6() {
		f.Family = model.FamilyIPv6
	}
	f.VirtualPorts = []model.PortRange{{First: svc.Port(), Last: svc.Port()}}
	f.Protocol = model.ProtoTCP
	f.Mode = model.ModeDNAT
	for _, ep := range endpoints {
		if ep.Addr().Is6() != svc.Addr().Is6() {
			continue
		}
		b := model.NewBackend(BackendName(ep.Addr(), ep.Port()))
		b.Addr, b.Port = ep.Addr(), ep.Port()
		f.Backends = append(f.Backends, b)
	}
	if len(f.Backends) == 0 {
		return fmt.Errorf("--apiserver-endpoints: none of %v is of the family of the API server's service address %s", endpoints, svc)
	}
	_, err := eng.Change(ctx, func(tx *engine.Txn) error { return tx.Put(f) })
	if err != nil {
		return fmt.Errorf("program the kubernetes Service %s: %w", svc, err)
	}
	return nil
}

// waitLogger says, while the informer caches are not synced, why: every
// interval it asks the API server for its version and logs the error with
// hint (what to do), so a proxy stuck on a fresh node says so instead of
// answering 503 in silence.
func waitLogger(ctx context.Context, log *slog.Logger, client kubernetes.Interface, host, hint string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, interval)
		_, err := client.Discovery().RESTClient().Get().AbsPath("/version").Do(cctx).Raw()
		cancel()
		if ctx.Err() != nil {
			return
		}
		args := []any{"api", host}
		if err != nil {
			args = append(args, "err", err)
		}
		if hint != "" {
			args = append(args, "hint", hint)
		}
		log.Warn("waiting for the API server: informer caches not synced yet", args...)
	}
}

// FreshNodeHint is the hint logged while waiting when the client reaches
// the API server at a cluster IP with no farm programmed for it.
func FreshNodeHint(svc netip.AddrPort) string {
	return fmt.Sprintf("the API server is reached through the cluster IP %s (the kubernetes Service), which nothing serves on a fresh node before this proxy's first sync; give --apiserver-endpoints with the API server's real address:port, or a --kubeconfig naming it (as kubeadm's kube-proxy ConfigMap does)", net.JoinHostPort(svc.Addr().String(), strconv.Itoa(int(svc.Port()))))
}
