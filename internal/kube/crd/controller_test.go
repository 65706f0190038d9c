package crd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/xlb-lb/xlb/internal/dataplane/fake"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/kube/crd"
	"github.com/xlb-lb/xlb/internal/kube/kubetest"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/store"
)

// TestCRDsCurrent: deploy/crd/crds.yaml is what the generator makes of
// api/openapi.yaml today (go generate ./internal/kube/crd).
func TestCRDsCurrent(t *testing.T) {
	doc, err := os.ReadFile("../../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := crd.Manifests(doc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../../deploy/crd/crds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/crd/crds.yaml is stale: run go generate ./internal/kube/crd")
	}
}

// TestCRDsCoverModel: every farm and backend field the model's codec
// takes is in the Farm CRD's schema, so no field can be set through the
// REST API but not through the resource.
func TestCRDsCoverModel(t *testing.T) {
	crds := loadCRDs(t)
	spec := crds["farms.xlb.io"].specSchema(t)
	props := func(s map[string]any) map[string]any { m, _ := s["properties"].(map[string]any); return m }
	farm := props(spec)
	backend := props(farm["backends"].(map[string]any)["items"].(map[string]any))
	for obj, fields := range map[string]map[string]any{"farm": farm, "backend": backend} {
		for name := range model.FieldTypes(obj) {
			if obj == "farm" && (name == "name" || name == "newname") {
				continue // metadata.name; a rename is a new resource
			}
			if _, ok := fields[name]; !ok {
				t.Errorf("the Farm CRD has no %s field %q", obj, name)
			}
		}
	}
	for _, f := range []string{"check", "policies", "sessions", "addresses"} {
		if _, ok := farm[f]; !ok {
			t.Errorf("the Farm CRD has no %q", f)
		}
	}
	if _, ok := props(crds["checks.xlb.io"].specSchema(t))["farm"]; !ok {
		t.Error("the Check CRD has no farm")
	}
}

type crdDoc map[string]any

func (c crdDoc) specSchema(t *testing.T) map[string]any {
	t.Helper()
	v := c["spec"].(map[string]any)["versions"].([]any)[0].(map[string]any)
	s := v["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
	return s["properties"].(map[string]any)["spec"].(map[string]any)
}

func loadCRDs(t *testing.T) map[string]crdDoc {
	t.Helper()
	raw, err := os.ReadFile("../../../deploy/crd/crds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]crdDoc{}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/crd/crds.yaml: %v", err)
		}
		if obj == nil {
			continue
		}
		out[obj["metadata"].(map[string]any)["name"].(string)] = obj
	}
	return out
}

// bindRole creates deploy/crd/rbac.yaml's ClusterRole and binds it to
// kubetest.ProxyUser: the controllers run with exactly these permissions.
func bindRole(t *testing.T, env *kubetest.Env) {
	t.Helper()
	raw, err := os.ReadFile("../../../deploy/crd/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var role *rbacv1.ClusterRole
	for {
		var r rbacv1.ClusterRole
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/crd/rbac.yaml: %v", err)
		}
		if r.Kind == "ClusterRole" {
			role = &r
		}
	}
	if role == nil {
		t.Fatal("deploy/crd/rbac.yaml has no ClusterRole")
	}
	ctx := context.Background()
	rb := env.Client.RbacV1()
	if _, err := rb.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rb.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubetest.ProxyUser}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// node is one xlb node: an engine over the fake data plane and the
// controller, as the proxy user.
type node struct {
	name string
	eng  *engine.Engine
	c    *crd.Controller
	stop func()
}

func startNode(t *testing.T, env *kubetest.Env, name string, st store.Store) *node {
	t.Helper()
	if st == nil {
		var err error
		if st, err = store.OpenBolt(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
	}
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(context.Background(), log, fake.New(), st)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.ProxyConfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := crd.New(crd.Config{Log: log, Client: dyn, Engine: eng, Node: name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	n := &node{name: name, eng: eng, c: c, stop: func() { cancel(); <-done }}
	t.Cleanup(n.stop)
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 20s waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type world struct {
	t   *testing.T
	env *kubetest.Env
	dyn dynamic.Interface // admin
}

func (w *world) res(kind string) dynamic.NamespaceableResourceInterface {
	switch kind {
	case crd.KindTable:
		return w.dyn.Resource(crd.TableResource)
	case crd.KindCheck:
		return w.dyn.Resource(crd.CheckResource)
	}
	return w.dyn.Resource(crd.FarmResource)
}

func (w *world) create(kind, name string, spec map[string]any) {
	w.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": crd.Group + "/" + crd.Version, "kind": kind,
		"metadata": map[string]any{"name": name}, "spec": spec}}
	if _, err := w.res(kind).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("create %s %s: %v", kind, name, err)
	}
}

func (w *world) update(kind, name string, spec map[string]any) {
	w.t.Helper()
	u, err := w.res(kind).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	u.Object["spec"] = spec
	if _, err := w.res(kind).Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		w.t.Fatalf("update %s %s: %v", kind, name, err)
	}
}

func (w *world) delete(kind, name string) {
	w.t.Helper()
	if err := w.res(kind).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		w.t.Fatalf("delete %s %s: %v", kind, name, err)
	}
}

// cond is a node's Programmed condition of an object.
type cond struct {
	Status, Reason, Message string
	Generation              int64
}

func (w *world) condition(kind, name, node string) (cond, bool) {
	u, err := w.res(kind).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return cond{}, false
	}
	nodes, _, _ := unstructured.NestedSlice(u.Object, "status", "nodes")
	for _, n := range nodes {
		m := n.(map[string]any)
		if m["node"] != node {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(m, "conditions")
		for _, c := range cs {
			cm := c.(map[string]any)
			if cm["type"] == "Programmed" {
				g, _ := cm["observedGeneration"].(int64)
				s, _ := cm["status"].(string)
				r, _ := cm["reason"].(string)
				msg, _ := cm["message"].(string)
				return cond{s, r, msg, g}, true
			}
		}
	}
	return cond{}, false
}

// waitCondition waits until node's condition on the object's current
// generation has status and reason, and returns it.
func (w *world) waitCondition(kind, name, node, status, reason string) cond {
	w.t.Helper()
	var c cond
	waitFor(w.t, fmt.Sprintf("%s %s on %s: Programmed %s %s", kind, name, node, status, reason), func() bool {
		u, err := w.res(kind).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		var ok bool
		c, ok = w.condition(kind, name, node)
		return ok && c.Generation == u.GetGeneration() && c.Status == status && c.Reason == reason
	})
	return c
}

func (w *world) events(name string) []string {
	list, err := w.env.Client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Source.Host+" "+e.Type+" "+e.Reason+": "+e.Message)
		}
	}
	return out
}

func farmSpec(vip, mode string) map[string]any {
	return map[string]any{"virtual-addr": vip, "virtual-ports": "80", "protocol": "tcp", "mode": mode, "scheduler": "maglev",
		"backends": []any{
			map[string]any{"name": "be1", "ip-addr": "10.200.0.11", "port": "8080"},
			map[string]any{"name": "be2", "ip-addr": "10.200.0.12", "port": 8080, "weight": 2},
		},
		"policies": []any{map[string]any{"name": "deny"}}}
}

// TestCRDController: two nodes watching the same resources on a real
// kube-apiserver program the same farms, tables and checks into their
// engines, each reporting in the objects' status; an invalid object and
// one the engine refuses change nothing, say why (status and a Warning
// Event) and hold back no other; a refused update keeps the previous
// generation; deleting a resource removes its object on both nodes; a node
// restarted after a deletion removes what it missed.
func TestCRDController(t *testing.T) {
	env := kubetest.Start(t)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, env: env, dyn: dyn}
	env.InstallCRDs(t, "../../../deploy/crd/crds.yaml")
	bindRole(t, env)
	stA, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stA.Close() })
	a, b := startNode(t, env, "lb-a", stA), startNode(t, env, "lb-b", nil)
	nodes := []*node{a, b}

	w.create(crd.KindTable, "deny", map[string]any{"type": "addr", "verdict": "deny", "entries": []any{map[string]any{"key": "192.0.2.0/24"}}})
	w.create(crd.KindFarm, "web", farmSpec("10.99.0.1", "snat"))
	w.create(crd.KindCheck, "web-tcp", map[string]any{"farm": "web", "type": "tcp", "inter": "1s", "fall": "2"})
	w.create(crd.KindCheck, "web-be2", map[string]any{"farm": "web", "backend": "be2", "type": "none"})
	for _, n := range nodes {
		for _, o := range [][2]string{{crd.KindTable, "deny"}, {crd.KindFarm, "web"}, {crd.KindCheck, "web-tcp"}, {crd.KindCheck, "web-be2"}} {
			w.waitCondition(o[0], o[1], n.name, "True", crd.ReasonProgrammed)
		}
		f, ok := n.eng.Snapshot().Farm("web")
		if !ok || f.Mode != model.ModeSNAT || f.Check == nil || f.Check.Type != model.CheckTCP || len(f.Backends) != 2 ||
			f.Backends[1].Weight != 2 || f.Backends[1].Check == nil || f.Backends[1].Check.Type != model.CheckNone || len(f.Policies) != 1 {
			t.Fatalf("%s: farm web %+v, %v", n.name, f, ok)
		}
		tb, ok := n.eng.Snapshot().Table("deny")
		if !ok || tb.Len() != 1 {
			t.Fatalf("%s: table deny %+v, %v", n.name, tb, ok)
		}
	}

	// The first sync is done: the gate of BGP announcements is open.
	for _, n := range nodes {
		if ok, why := n.c.Ready(); !ok {
			t.Fatalf("%s: not ready after its first sync: %s", n.name, why)
		}
	}

	// Invalid on its own: refused by the model's validator, named, and
	// nothing changes; an Event says so.
	w.create(crd.KindFarm, "bad", map[string]any{"virtual-addr": "10.99.0.300", "virtual-ports": "80"})
	for _, n := range nodes {
		c := w.waitCondition(crd.KindFarm, "bad", n.name, "False", crd.ReasonInvalid)
		if !strings.Contains(c.Message, "virtual-addr") || !strings.Contains(c.Message, "10.99.0.300") {
			t.Fatalf("%s: message %q does not name the field and value", n.name, c.Message)
		}
		if _, ok := n.eng.Snapshot().Farm("bad"); ok {
			t.Fatalf("%s: an invalid farm was programmed", n.name)
		}
	}
	waitFor(t, "a Warning Event on bad from each node", func() bool {
		evs := w.events("bad")
		return len(evs) == 2 && strings.Contains(evs[0], "Warning Invalid") && strings.Contains(evs[1], "Warning Invalid")
	})

	// Valid on its own, refused against another farm (the same VIP and
	// port): the first keeps serving.
	w.create(crd.KindFarm, "web-twin", farmSpec("10.99.0.1", "dnat"))
	w.create(crd.KindFarm, "other", farmSpec("10.99.0.2", "dnat"))
	for _, n := range nodes {
		w.waitCondition(crd.KindFarm, "web-twin", n.name, "False", crd.ReasonRefused)
		w.waitCondition(crd.KindFarm, "other", n.name, "True", crd.ReasonProgrammed)
		if f, _ := n.eng.Snapshot().Farm("web"); f.Mode != model.ModeSNAT {
			t.Fatalf("%s: web changed: %+v", n.name, f)
		}
	}
	w.delete(crd.KindFarm, "web-twin")

	// A refused update keeps the previous generation programmed.
	bad := farmSpec("10.99.0.1", "snat")
	bad["scheduler"] = "fastest"
	w.update(crd.KindFarm, "web", bad)
	for _, n := range nodes {
		c := w.waitCondition(crd.KindFarm, "web", n.name, "False", crd.ReasonInvalid)
		if !strings.Contains(c.Message, "scheduler") || c.Generation != 2 {
			t.Fatalf("%s: %+v", n.name, c)
		}
		if f, _ := n.eng.Snapshot().Farm("web"); f.Scheduler != model.SchedMaglev {
			t.Fatalf("%s: a refused update changed web: %+v", n.name, f)
		}
	}
	w.update(crd.KindFarm, "web", farmSpec("10.99.0.1", "dnat"))
	for _, n := range nodes {
		w.waitCondition(crd.KindFarm, "web", n.name, "True", crd.ReasonProgrammed)
		waitFor(t, n.name+" web is dnat", func() bool { f, _ := n.eng.Snapshot().Farm("web"); return f.Mode == model.ModeDNAT })
	}

	// Checks that cannot apply: a second for the same farm, one for a
	// backend the farm does not have, one for no farm.
	w.create(crd.KindCheck, "web-tcp2", map[string]any{"farm": "web", "type": "http"})
	w.create(crd.KindCheck, "web-be9", map[string]any{"farm": "web", "backend": "be9", "type": "tcp"})
	w.create(crd.KindCheck, "nofarm", map[string]any{"farm": "nope", "type": "tcp"})
	for _, n := range nodes {
		for name, want := range map[string]string{"web-tcp2": `check "web-tcp" is for farm "web" already`,
			"web-be9": `farm "web" has no backend "be9"`, "nofarm": `there is no Farm "nope"`} {
			if c := w.waitCondition(crd.KindCheck, name, n.name, "False", crd.ReasonRefused); !strings.Contains(c.Message, want) {
				t.Errorf("%s: check %s: %q, want %q", n.name, name, c.Message, want)
			}
		}
		if f, _ := n.eng.Snapshot().Farm("web"); f.Check == nil || f.Check.Type != model.CheckTCP {
			t.Fatalf("%s: web's check changed: %+v", n.name, f.Check)
		}
	}

	// Deletion: web-tcp goes, and web-tcp2 (refused while web-tcp was
	// there) is the farm's check; then it goes too and the farm has none.
	// A Farm goes from both nodes.
	w.delete(crd.KindCheck, "web-tcp")
	w.delete(crd.KindFarm, "other")
	for _, n := range nodes {
		w.waitCondition(crd.KindCheck, "web-tcp2", n.name, "True", crd.ReasonProgrammed)
		waitFor(t, n.name+": other removed, web's check http", func() bool {
			s := n.eng.Snapshot()
			_, has := s.Farm("other")
			f, _ := s.Farm("web")
			return !has && f != nil && f.Check != nil && f.Check.Type == model.CheckHTTP
		})
	}
	w.delete(crd.KindCheck, "web-tcp2")
	for _, n := range nodes {
		waitFor(t, n.name+": web's check off", func() bool { f, _ := n.eng.Snapshot().Farm("web"); return f != nil && f.Check == nil })
	}

	// A node down while a resource is deleted removes it when it comes
	// back (its saved state still has it).
	a.stop()
	w.delete(crd.KindFarm, "web")
	w.delete(crd.KindTable, "deny")
	waitFor(t, "lb-b: web and deny removed", func() bool {
		s := b.eng.Snapshot()
		_, f := s.Farm("web")
		_, tb := s.Table("deny")
		return !f && !tb
	})
	a2 := startNode(t, env, "lb-a", stA)
	if _, ok := a2.eng.Snapshot().Farm("web"); !ok {
		t.Fatal("the restarted node's saved state lost web before the controller synced")
	}
	waitFor(t, "restarted lb-a: web and deny removed", func() bool {
		s := a2.eng.Snapshot()
		_, f := s.Farm("web")
		_, tb := s.Table("deny")
		return !f && !tb
	})
}

// TestCRDGateWait: a node that cannot reach the API server holds its BGP
// announcements back (Ready says why) for Config.Wait, then announces its
// saved state.
func TestCRDGateWait(t *testing.T) {
	st, err := store.OpenBolt(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slog.New(slog.DiscardHandler)
	eng, err := engine.New(context.Background(), log, fake.New(), st)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1.
	dyn, err := dynamic.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := crd.New(crd.Config{Log: log, Client: dyn, Engine: eng, Node: "n", Wait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if ok, why := c.Ready(); ok || !strings.Contains(why, "waiting for the first sync") {
		t.Fatalf("ready before any sync: %v %q", ok, why)
	}
	select {
	case <-c.Changed():
	case <-time.After(20 * time.Second):
		t.Fatal("the wait did not end")
	}
	if ok, _ := c.Ready(); !ok {
		t.Fatal("not ready after the wait")
	}
}
