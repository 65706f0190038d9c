package kube_test

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/xlb-lb/xlb/internal/kube"
)

// TestKubeProxyReadAPI runs the real `xlb kube-proxy` with --api-listen
// on both planes: `xlb list`, `xlb dump` and `xlb list --stats` against it
// show the Service's farms (with the counters of the real traffic sent),
// and a write (`xlb farm del`) is refused, leaving the farm in place.
func TestKubeProxyReadAPI(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			e := newWorld(t, 2)
			api := apiserver(t)
			bin := xlbBinary(t)
			e.startServers()
			const key = "kube3-read-api-key-0123456789abcdef"
			args := []string{"--api-listen", "127.0.0.1:5557"}
			if plane == "ebpf" {
				args = append(args, "--dataplane", "ebpf", "--pin-path", mountBPFFS(t), "--conn-table-size", "4096")
			}
			e.startProxyEnv([]string{"XLB_KEY=" + key}, bin, e.proxyKubeconfig(api), t.TempDir(), args...)
			e.waitHealthy()

			svc := e.createService(service("web", corev1.ServiceTypeClusterIP))
			e.setEndpoints("web", false, ready(0, 1))
			cip := netip.MustParseAddr(svc.Spec.ClusterIP)
			e.waitBothEndpoints(netip.AddrPortFrom(cip, 80))
			farm := kube.FarmName(e.ns, "web", "tcp", kube.KindCluster, cip)
			vip := cip.String() + ":80"

			xlb := func(args ...string) (string, error) {
				full := append([]string{"netns", "exec", e.LB.Name, bin, "--api", "http://127.0.0.1:5557", "--key", key}, args...)
				out, err := exec.Command("ip", full...).CombinedOutput()
				return string(out), err
			}
			for _, c := range []struct {
				args []string
				want string
			}{{[]string{"list", "-n"}, vip}, {[]string{"dump"}, farm}} {
				out, err := xlb(c.args...)
				if err != nil || !strings.Contains(out, c.want) {
					t.Errorf("xlb %s: %v, output lacks %s:\n%s", strings.Join(c.args, " "), err, c.want, out)
				}
			}
			// waitBothEndpoints connected to both backends: counted on
			// both planes.
			out, err := xlb("list", "-n", "--stats")
			if err != nil || !strings.Contains(out, vip) || !strings.Contains(out, "10.200.0.11:8080") || !strings.Contains(out, "10.200.0.12:8080") {
				t.Errorf("xlb list --stats: %v:\n%s", err, out)
			}
			out, err = xlb("farm", "del", farm)
			if err == nil || !strings.Contains(out, "read-only") {
				t.Errorf("xlb farm del: %v, want a read-only refusal:\n%s", err, out)
			}
			if out, _ := xlb("dump"); !strings.Contains(out, farm) {
				t.Errorf("farm gone after a refused delete:\n%s", out)
			}
			if out, err := exec.Command("ip", "netns", "exec", e.LB.Name, bin, "--api", "http://127.0.0.1:5557", "--key", "wrong-key-0123456789abcdef", "list").CombinedOutput(); err == nil {
				t.Errorf("xlb list with a wrong key answered:\n%s", out)
			}
		})
	}
}
