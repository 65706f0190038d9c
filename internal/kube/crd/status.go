package crd

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// outcome is what this node did with one generation of an object.
type outcome struct {
	generation int64
	ok         bool
	reason     string
	message    string
	// since is when the condition last changed status.
	since time.Time
}

func (o outcome) same(p outcome) bool {
	return o.generation == p.generation && o.ok == p.ok && o.reason == p.reason && o.message == p.message
}

var eventResource = schema.GroupVersionResource{Version: "v1", Resource: "events"}

func resourceOf(kind string) schema.GroupVersionResource {
	switch kind {
	case KindTable:
		return TableResource
	case KindCheck:
		return CheckResource
	}
	return FarmResource
}

// maxMessage bounds a condition's and an Event's message.
const maxMessage = 1024

// report writes each object's outcome that changed into its status entry
// for this node (server-side apply of status.nodes[node], this node's
// field manager: other nodes' entries are theirs), and a Warning Event for
// each new refusal. It returns true if a write failed (tried again).
func (c *Controller) report(ctx context.Context, d *desired) (failed bool) {
	for k := range c.reported {
		if _, ok := d.exists[k]; !ok {
			delete(c.reported, k)
		}
	}
	for k, o := range d.out {
		u := d.exists[k]
		prev, had := c.reported[k]
		if had && o.same(prev) {
			continue
		}
		o.since = time.Now()
		if had && prev.ok == o.ok {
			o.since = prev.since
		}
		if len(o.message) > maxMessage {
			o.message = o.message[:maxMessage-3] + "..."
		}
		if err := c.applyStatus(ctx, k, o); err != nil {
			if !apierrors.IsNotFound(err) {
				c.cfg.Log.Warn("write the status of a custom resource", "object", k.String(), "err", err)
				failed = true
			}
			continue
		}
		c.reported[k] = o
		if o.ok {
			c.cfg.Log.Info("custom resource programmed", "object", k.String(), "generation", o.generation)
			continue
		}
		c.cfg.Log.Warn("custom resource refused", "object", k.String(), "generation", o.generation, "reason", o.reason, "err", o.message)
		c.event(ctx, k, u, o)
	}
	return failed
}

func (c *Controller) applyStatus(ctx context.Context, k objKey, o outcome) error {
	status := "False"
	if o.ok {
		status = "True"
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       k.kind,
		"metadata":   map[string]any{"name": k.name},
		"status": map[string]any{"nodes": []any{map[string]any{
			"node":               c.cfg.Node,
			"observedGeneration": o.generation,
			"conditions": []any{map[string]any{
				"type":               "Programmed",
				"status":             status,
				"reason":             o.reason,
				"message":            o.message,
				"observedGeneration": o.generation,
				"lastTransitionTime": o.since.UTC().Format(time.RFC3339),
			}},
		}}},
	}}
	_, err := c.cfg.Client.Resource(resourceOf(k.kind)).ApplyStatus(ctx, k.name, obj,
		metav1.ApplyOptions{FieldManager: c.fieldManager(), Force: true})
	return err
}

// fieldManager is this node's name for server-side apply (at most 128
// bytes).
func (c *Controller) fieldManager() string {
	m := "xlb-node-" + c.cfg.Node
	if len(m) > 128 {
		m = m[:128]
	}
	return m
}

// event records a Warning Event on the object (namespace default, as
// for every cluster-scoped object). A failure is logged, not retried.
func (c *Controller) event(ctx context.Context, k objKey, u *unstructured.Unstructured, o outcome) {
	now := time.Now().UTC().Format(time.RFC3339)
	ev := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Event",
		"metadata":   map[string]any{"generateName": k.name + ".", "namespace": metav1.NamespaceDefault},
		"involvedObject": map[string]any{
			"apiVersion":      Group + "/" + Version,
			"kind":            k.kind,
			"name":            k.name,
			"uid":             string(u.GetUID()),
			"resourceVersion": u.GetResourceVersion(),
		},
		"reason":             o.reason,
		"message":            "node " + c.cfg.Node + ": " + o.message,
		"type":               "Warning",
		"source":             map[string]any{"component": "xlb", "host": c.cfg.Node},
		"reportingComponent": "xlb",
		"reportingInstance":  c.cfg.Node,
		"firstTimestamp":     now,
		"lastTimestamp":      now,
		"count":              int64(1),
	}}
	if _, err := c.cfg.Client.Resource(eventResource).Namespace(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		c.cfg.Log.Warn("record an Event", "object", k.String(), "err", err)
	}
}
