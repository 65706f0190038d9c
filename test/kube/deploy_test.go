package kube_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// TestDeployManifests sends every object of deploy/*.yaml to the real API
// server as a server-side dry run, so its validation (schema, field values,
// references) checks the manifests.
func TestDeployManifests(t *testing.T) {
	api := apiserver(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	files, err := filepath.Glob("../../deploy/*.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("deploy manifests: %v %v", files, err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	kinds := map[string]int{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := yaml.NewYAMLReader(bufioReader(raw))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			json, err := yaml.ToJSON(doc)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(json, nil, nil)
			if err != nil {
				t.Fatalf("%s: decode: %v", f, err)
			}
			kinds[gvk.Kind]++
			switch o := obj.(type) {
			case *corev1.ServiceAccount:
				_, err = api.Client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, dry)
			case *rbacv1.ClusterRole:
				_, err = api.Client.RbacV1().ClusterRoles().Create(ctx, o, dry)
			case *rbacv1.ClusterRoleBinding:
				_, err = api.Client.RbacV1().ClusterRoleBindings().Create(ctx, o, dry)
			case *corev1.ConfigMap:
				_, err = api.Client.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, dry)
			case *appsv1.DaemonSet:
				_, err = api.Client.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, dry)
			default:
				t.Fatalf("%s: no check for kind %s", f, gvk.Kind)
			}
			if err != nil {
				t.Errorf("%s: %s: %v", f, gvk.Kind, err)
			}
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if kinds[k] != 1 {
			t.Errorf("deploy/ has %d %s objects, want 1", kinds[k], k)
		}
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
