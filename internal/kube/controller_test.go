package kube

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// These tests drive the controller with client-go's fake clientset and the
// fake data plane, to reach paths a real kernel and API server cannot be
// made to take on demand (kernel failures, stale saved state, clashes that
// fail a whole full reconcile). Everything about real behaviour is in
// test/kube, against a real API server and the nft data plane.

type ctlEnv struct {
	t      *testing.T
	client *k8sfake.Clientset
	plane  *fake.Plane
	st     store.Store
	eng    *engine.Engine
	ctl    *Controller
}

func newCtlEnv(t *testing.T, objs []runtime.Object, saved []model.Farm, plane *fake.Plane) *ctlEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &ctlEnv{t: t, client: k8sfake.NewClientset(objs...), plane: plane}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	st, err := store.OpenBolt(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(saved) > 0 {
		// A previous run's state: saved farms, already in the "kernel".
		var d plan.Diff
		for i := range saved {
			f := saved[i].Clone()
			f.Seal()
			d.Changes = append(d.Changes, plan.FarmChange{New: &f})
		}
		if err := st.Commit(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	e.st = st
	e.eng, err = engine.New(ctx, log, plane, st)
	if err != nil {
		t.Fatal(err)
	}
	e.ctl, err = New(Config{Client: e.client, Engine: e.eng, Log: log, NodeName: "node1", ErrorBackoffMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.ctl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("controller did not stop")
		}
		st.Close()
	})
	e.waitFor("first full reconcile", e.ctl.Ready)
	return e
}

func (e *ctlEnv) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *ctlEnv) hasFarm(name string) bool {
	_, ok := e.eng.Snapshot().Farm(name)
	return ok
}

func (e *ctlEnv) events(ns, reason string) []corev1.Event {
	l, err := e.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range l.Items {
		if ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

func testService(name, cip string, externalIPs ...string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: cip, ClusterIPs: []string{cip},
			ExternalIPs: externalIPs,
			Ports:       []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
}

func testSlice(svc string, addrs ...string) *discoveryv1.EndpointSlice {
	s := slice(discoveryv1.AddressTypeIPv4, 8080, "http", corev1.ProtocolTCP)
	s.Name = svc + "-1"
	s.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return s
}

// TestFullSyncRemovesStaleFarms: farms saved by a previous run whose
// Services no longer exist are deleted by the first full reconcile; the
// others are kept or updated.
func TestFullSyncRemovesStaleFarms(t *testing.T) {
	stale := model.NewFarm("shop.gone.http.cluster-10.96.0.99")
	stale.VirtualAddr = netip.MustParseAddr("10.96.0.99")
	stale.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
	e := newCtlEnv(t, []runtime.Object{testService("web", "10.96.0.10"), testSlice("web", "10.244.0.1")},
		[]model.Farm{stale}, fake.New())
	if e.hasFarm(stale.Name) {
		t.Errorf("stale farm %q survived the full reconcile", stale.Name)
	}
	f, ok := e.eng.Snapshot().Farm("shop.web.http.cluster-10.96.0.10")
	if !ok || len(f.Backends) != 1 {
		t.Fatalf("web's farm: %v %v", ok, f)
	}
	if e.eng.Snapshot().Len() != 1 {
		t.Errorf("%d farms, want 1", e.eng.Snapshot().Len())
	}
}

// TestFullSyncClash: two Services claim the same external IP and port. The
// one-transaction full reconcile fails on the clash and falls back to one
// transaction per Service: every other Service is programmed, exactly one
// of the two clashing ones is, and the other gets an XLBRejected Event.
func TestFullSyncClash(t *testing.T) {
	e := newCtlEnv(t, []runtime.Object{
		testService("a", "10.96.0.1", "198.51.100.1"), testSlice("a", "10.244.0.1"),
		testService("b", "10.96.0.2", "198.51.100.1"), testSlice("b", "10.244.0.2"),
		testService("c", "10.96.0.3"), testSlice("c", "10.244.0.3"),
	}, nil, fake.New())
	if !e.hasFarm("shop.c.http.cluster-10.96.0.3") {
		t.Error("service c was not programmed")
	}
	a, b := e.hasFarm("shop.a.http.external-198.51.100.1"), e.hasFarm("shop.b.http.external-198.51.100.1")
	if a == b {
		t.Errorf("external farms of a and b: %v %v, want exactly one", a, b)
	}
	e.waitFor("an XLBRejected event", func() bool { return len(e.events("shop", ReasonRejected)) == 1 })
	ev := e.events("shop", ReasonRejected)[0]
	loser := "b"
	if b {
		loser = "a"
	}
	if ev.InvolvedObject.Name != loser {
		t.Errorf("event on %s, want on %s: %s", ev.InvolvedObject.Name, loser, ev.Message)
	}
}

// TestKernelFailureThenFullSync: when the data plane fails a Service's
// change, the controller reconciles everything again (with backoff) and
// the change lands once the kernel works.
func TestKernelFailureThenFullSync(t *testing.T) {
	plane := fake.New()
	var fail atomic.Int32
	plane.FailApply = func(d plan.Diff) error {
		if fail.Load() > 0 {
			fail.Add(-1)
			return fake.ErrInjected
		}
		return nil
	}
	e := newCtlEnv(t, []runtime.Object{testService("web", "10.96.0.10"), testSlice("web", "10.244.0.1")}, nil, plane)
	fail.Store(2) // the Service's sync and the first full reconcile fail
	s := testSlice("web", "10.244.0.1", "10.244.0.2")
	if _, err := e.client.DiscoveryV1().EndpointSlices("shop").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the change after the kernel recovers", func() bool {
		f, ok := e.eng.Snapshot().Farm("shop.web.http.cluster-10.96.0.10")
		return ok && len(f.Backends) == 2
	})
	if fail.Load() != 0 {
		t.Errorf("%d injected failures left: the retries did not happen", fail.Load())
	}
}

// TestServiceDeletedAndRecreated: deleting a Service removes its farms;
// syncs of one Service never touch another's farms.
func TestServiceDeletedAndRecreated(t *testing.T) {
	e := newCtlEnv(t, []runtime.Object{
		testService("a", "10.96.0.1"), testSlice("a", "10.244.0.1"),
		testService("b", "10.96.0.2"), testSlice("b", "10.244.0.2"),
	}, nil, fake.New())
	ctx := context.Background()
	before, _ := e.eng.Snapshot().Farm("shop.b.http.cluster-10.96.0.2")
	if err := e.client.CoreV1().Services("shop").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("a's farm to go", func() bool { return !e.hasFarm("shop.a.http.cluster-10.96.0.1") })
	if _, err := e.client.CoreV1().Services("shop").Create(ctx, testService("a", "10.96.0.7"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("a's new farm", func() bool { return e.hasFarm("shop.a.http.cluster-10.96.0.7") })
	if after, _ := e.eng.Snapshot().Farm("shop.b.http.cluster-10.96.0.2"); after != before {
		t.Error("b's farm was rebuilt by changes of a")
	}
}

// TestClashFarmByFarm: a Service created with an external IP another
// Service already serves gets every farm but the clashing one (one
// transaction per farm after the Service's transaction is refused), an
// XLBRejected Event naming the clash, and keeps following its endpoints.
func TestClashFarmByFarm(t *testing.T) {
	e := newCtlEnv(t, []runtime.Object{
		testService("a", "10.96.0.1", "198.51.100.1"), testSlice("a", "10.244.0.1"),
	}, nil, fake.New())
	ctx := context.Background()
	if _, err := e.client.CoreV1().Services("shop").Create(ctx, testService("b", "10.96.0.2", "198.51.100.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.DiscoveryV1().EndpointSlices("shop").Create(ctx, testSlice("b", "10.244.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("b's cluster farm with its endpoint", func() bool {
		f, ok := e.eng.Snapshot().Farm("shop.b.http.cluster-10.96.0.2")
		return ok && len(f.Backends) == 1
	})
	if e.hasFarm("shop.b.http.external-198.51.100.1") {
		t.Error("b's clashing external farm was programmed")
	}
	e.waitFor("an XLBRejected event on b", func() bool { return len(e.events("shop", ReasonRejected)) == 1 })
	if ev := e.events("shop", ReasonRejected)[0]; ev.InvolvedObject.Name != "b" || !strings.Contains(ev.Message, "198.51.100.1") {
		t.Errorf("event on %s: %s", ev.InvolvedObject.Name, ev.Message)
	}
	if _, err := e.client.DiscoveryV1().EndpointSlices("shop").Update(ctx, testSlice("b", "10.244.0.3"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("b's endpoint change", func() bool {
		f, ok := e.eng.Snapshot().Farm("shop.b.http.cluster-10.96.0.2")
		return ok && len(f.Backends) == 1 && f.Backends[0].Addr == netip.MustParseAddr("10.244.0.3")
	})
	if f, ok := e.eng.Snapshot().Farm("shop.a.http.external-198.51.100.1"); !ok || f.Backends[0].Addr != netip.MustParseAddr("10.244.0.1") {
		t.Errorf("a's external farm changed: %v", f)
	}
}

// TestRefusedAnnotationFallsBack: annotations whose farms the data plane
// refuses (here: a fake plane that refuses mode snat) give the Service its
// default farms, with the endpoints it has now, and an Event.
func TestRefusedAnnotationFallsBack(t *testing.T) {
	plane := fake.New()
	plane.Refuse = func(f *model.Farm) error {
		if f.Mode == model.ModeSNAT {
			return &model.FieldError{Object: "farm " + f.Name, Field: "mode", Value: "snat", Problem: "refused by the test"}
		}
		return nil
	}
	svc := testService("a", "10.96.0.1")
	svc.Annotations = map[string]string{"xlb.io/mode": "snat"}
	e := newCtlEnv(t, []runtime.Object{svc, testSlice("a", "10.244.0.1", "10.244.0.2")}, nil, plane)
	f, ok := e.eng.Snapshot().Farm("shop.a.http.cluster-10.96.0.1")
	if !ok || f.Mode != model.ModeDNAT || len(f.Backends) != 2 {
		t.Fatalf("farm %v %v, want the default (dnat) with both endpoints", ok, f)
	}
	e.waitFor("an XLBRejected event", func() bool { return len(e.events("shop", ReasonRejected)) == 1 })
	if ev := e.events("shop", ReasonRejected)[0]; !strings.Contains(ev.Message, "refused by the test") || !strings.Contains(ev.Message, "serving with the defaults") {
		t.Errorf("event: %s", ev.Message)
	}
}

// An xlb.io/check annotation adds the check to the Service's farms; one the
// model refuses once it meets the farm (a source address of the wrong
// family) falls back to the defaults, with a Warning event.
func TestCheckAnnotation(t *testing.T) {
	svc := testService("a", "10.96.0.1")
	svc.Annotations = map[string]string{"xlb.io/check": `{"type":"tcp","inter":"1s"}`}
	bad := testService("b", "10.96.0.2")
	bad.Annotations = map[string]string{"xlb.io/check": `{"type":"tcp","source-addr":"fd00::1"}`}
	e := newCtlEnv(t, []runtime.Object{svc, bad, testSlice("a", "10.244.0.1", "10.244.0.2"), testSlice("b", "10.244.0.3")}, nil, fake.New())
	f, ok := e.eng.Snapshot().Farm("shop.a.http.cluster-10.96.0.1")
	if !ok || f.Check == nil || f.Check.Type != model.CheckTCP || len(f.Backends) != 2 {
		t.Fatalf("farm a: %v %s", ok, f.AppendJSON(nil))
	}
	if c, ok := f.Resolve(0); !ok || c.Inter != time.Second {
		t.Errorf("a's backends are not checked: %+v", c)
	}
	g, ok := e.eng.Snapshot().Farm("shop.b.http.cluster-10.96.0.2")
	if !ok || g.Check != nil || len(g.Backends) != 1 {
		t.Fatalf("farm b: %v %s, want the defaults", ok, g.AppendJSON(nil))
	}
	e.waitFor("an XLBRejected event", func() bool { return len(e.events("shop", ReasonRejected)) == 1 })
	if ev := e.events("shop", ReasonRejected)[0]; !strings.Contains(ev.Message, "check.source-addr") || !strings.Contains(ev.Message, "serving with the defaults") {
		t.Errorf("event: %s", ev.Message)
	}
}
