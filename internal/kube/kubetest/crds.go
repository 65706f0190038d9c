package kubetest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates the CustomResourceDefinitions of a manifest file
// (deploy/crd/crds.yaml) and waits until the API server has established each
// (it refuses a schema that is not structural).
func (e *Env) InstallCRDs(tb testing.TB, path string) {
	tb.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
		if obj == nil {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := dyn.Resource(crdResource).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			tb.Fatalf("create CRD %s: %v", u.GetName(), err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !established(ctx, dyn, u.GetName()) {
			if time.Now().After(deadline) {
				tb.Fatalf("CRD %s not established after 30s", u.GetName())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func established(ctx context.Context, dyn dynamic.Interface, name string) bool {
	u, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
