package kube_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestFreshNodeThroughClusterIP: a fresh node (empty tables, no saved
// state) whose proxy reaches the API server the way the in-cluster
// configuration does, through the kubernetes Service's cluster IP, with
// KUBERNETES_SERVICE_HOST set as the kubelet sets it. The API server is "on
// another machine": backend b0 forwards its port 6443 to it, and the
// kubernetes EndpointSlice names b0:6443 (as the API server's own endpoint
// reconciler would; the test API server runs without one).
//
// Without --apiserver-endpoints nothing serves the cluster IP: the proxy
// waits, /healthz answers 503, and the log says why and what to do. With
// --apiserver-endpoints b0:6443 it programs the kubernetes Service first,
// reaches the API server through the cluster IP, does its first sync
// (which replaces that farm with the one the Service and its EndpointSlice
// make) and serves Services.
func TestFreshNodeThroughClusterIP(t *testing.T) {
	e := newWorld(t, 2)
	api := apiserver(t)
	bin := xlbBinary(t)
	e.startServers()
	k, err := e.client.CoreV1().Services("default").Get(e.ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the API server's kubernetes Service: %v", err)
	}
	kip := netip.MustParseAddr(k.Spec.ClusterIP)
	apiEP := netip.AddrPortFrom(e.Backends[0].IPv4, 6443)
	e.forwardAPIAt(e.Backends[0], apiEP.String(), api.Config.Host)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "kubernetes-" + e.ns, Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](6443), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{apiEP.Addr().String()}}},
	}
	if _, err := e.client.DiscoveryV1().EndpointSlices("default").Create(e.ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.DiscoveryV1().EndpointSlices("default").Delete(context.Background(), slice.Name, metav1.DeleteOptions{})
	})
	// A node has a default route; the cluster IP leaves by it unless a
	// rule takes it.
	testutil.Run(t, e.LB.Name, "ip", "route", "add", "default", "via", e.Client.IPv4.String())

	// The in-cluster configuration: the cluster IP, the service account's
	// token and the cluster's CA (here: the proxy user's token).
	e.bindProxyRole()
	kubeconfig := filepath.Join(t.TempDir(), "in-cluster.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: "https://%s", certificate-authority: %q}}]
users: [{name: p, user: {token: %q}}]
contexts: [{name: t, context: {cluster: t, user: p}}]
current-context: t
`, netip.AddrPortFrom(kip, 443), api.ProxyConfig.TLSClientConfig.CAFile, api.ProxyConfig.BearerToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"KUBERNETES_SERVICE_HOST=" + kip.String(), "KUBERNETES_SERVICE_PORT=443"}

	// 1. Nothing serves the cluster IP: the proxy waits and says why.
	p := e.startProxyEnv(env, bin, kubeconfig, t.TempDir())
	e.waitFor("the proxy to log why it waits", func() bool {
		return strings.Contains(p.log.String(), "waiting for the API server") && strings.Contains(p.log.String(), "--apiserver-endpoints")
	})
	if code, _, err := e.httpGet("http://127.0.0.1:10256/healthz"); err != nil || code != 503 {
		t.Errorf("/healthz while waiting: %d %v, want 503", code, err)
	}
	p.stop(t)

	// 2. With the API server's real address: first sync through the
	// cluster IP.
	p = e.startProxyEnv(env, bin, kubeconfig, t.TempDir(), "--apiserver-endpoints", apiEP.String())
	e.waitHealthy()
	if !strings.Contains(p.log.String(), "kubernetes Service programmed before the first sync") {
		t.Errorf("the proxy does not log the bootstrap:\n%s", p.log.String())
	}
	svc := e.createService(service("web", corev1.ServiceTypeClusterIP))
	e.setEndpoints("web", false, ready(0, 1))
	e.waitBothEndpoints(netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80))
	// The kubernetes Service's farm is now the first sync's (from its
	// EndpointSlice), and the proxy keeps talking through it: an Event
	// for a bad annotation arrives.
	e.annotate("web", map[string]string{"xlb.io/mode": "nope"})
	e.waitEvent("web", kube.ReasonInvalidAnnotation)
	p.stop(t)
}
