package kube_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestLoadBalancerSourceRanges, on both planes: a Service's ranges are an
// allow list on its load balancer IP only; changing them changes who is
// served, removing them serves everyone again and destroys the table, and
// so does deleting the Service.
func TestLoadBalancerSourceRanges(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) { testSourceRanges(t, plane) })
	}
}

func testSourceRanges(t *testing.T, plane string) {
	e := newWorld(t, 3)
	e.startController(plane)
	e.startServers()
	e.scenarioSources()
	s := service("lbsr", corev1.ServiceTypeLoadBalancer)
	s.Spec.Ports = s.Spec.Ports[:1]
	s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/25"}
	svc := e.withLB(e.createService(s), testutil.VIP4(41))
	e.kpSlice("lbsr", "lbsr-1", false, readyEP(0, false))
	lb := ap(testutil.VIP4(41), 80)
	np := svc.Spec.Ports[0].NodePort
	table := kube.SourceRangesTableName(e.ns, "lbsr")
	check := func(step string, flows []flow) {
		t.Helper()
		e.settle(plane, flows[0])
		for _, f := range flows {
			f.name = step + ": " + f.name
			e.runFlows(t, plane, []flow{f})
		}
	}
	check("203.0.113.0/25", []flow{
		{name: "inside to LB", from: fromExternal, to: lb, want: "b0 masq"},
		{name: "outside to LB", from: fromBlocked, to: lb, want: "DROP"},
		{name: "outside to NodePort", from: fromBlocked, to: ap(e.LB.IPv4, np), want: "b0 masq"},
		{name: "outside to cluster IP", from: fromBlocked, to: ap(cip(svc), 80), want: "b0"},
	})

	update := func(ranges []string) {
		t.Helper()
		cur, err := e.client.CoreV1().Services(e.ns).Get(e.ctx, "lbsr", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.LoadBalancerSourceRanges = ranges
		if _, err := e.client.CoreV1().Services(e.ns).Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update([]string{"203.0.113.128/25"})
	check("203.0.113.128/25", []flow{
		{name: "outside to LB", from: fromExternal, to: lb, want: "DROP"},
		{name: "inside to LB", from: fromBlocked, to: lb, want: "b0 masq"},
	})

	hasTable := func() bool { _, ok := e.eng.Snapshot().Table(table); return ok }
	update(nil)
	check("no ranges", []flow{
		{name: "any source to LB", from: fromExternal, to: lb, want: "b0 masq"},
		{name: "any other source to LB", from: fromBlocked, to: lb, want: "b0 masq"},
	})
	e.waitFor("the allow list destroyed once the ranges are gone", func() bool { return !hasTable() })

	update([]string{"203.0.113.0/25"})
	e.waitFor("the allow list back", hasTable)
	if err := e.client.CoreV1().Services(e.ns).Delete(e.ctx, "lbsr", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the allow list destroyed with its Service", func() bool { return !hasTable() })
}
