package kubetest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestStart starts a real API server, creates a Service (which gets a
// cluster IP from the configured range) and checks that the proxy user is
// authenticated but has no permissions until RBAC grants them.
func TestStart(t *testing.T) {
	start := time.Now()
	env := Start(t)
	t.Logf("etcd + kube-apiserver ready in %s", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kubetest-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := env.Client.CoreV1().Services(ns.Name).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP[:6] != "10.96." {
		t.Errorf("cluster IP %q is not from %s", svc.Spec.ClusterIP, ServiceCIDR4)
	}
	proxy, err := kubernetes.NewForConfig(env.ProxyConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proxy.CoreV1().Services("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("proxy user listing services without RBAC: got %v, want Forbidden", err)
	}
	if err := env.Client.CoreV1().Services(ns.Name).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
