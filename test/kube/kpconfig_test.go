package kube_test

import (
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xlb-lb/xlb/internal/testutil"
)

// healthBody is kube-proxy's /healthz and /livez JSON.
type healthBody struct {
	LastUpdated  string `json:"lastUpdated"`
	CurrentTime  string `json:"currentTime"`
	NodeEligible *bool  `json:"nodeEligible"`
}

func (e *env) health(path string) (int, healthBody) {
	e.t.Helper()
	code, body, err := e.httpGet("http://127.0.0.1:10256" + path)
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	var h healthBody
	if err := json.Unmarshal([]byte(body), &h); err != nil || h.CurrentTime == "" || h.LastUpdated == "" {
		e.t.Fatalf("GET %s: body %q is not kube-proxy's JSON: %v", path, body, err)
	}
	return code, h
}

// TestKubeProxyConfigFile runs the real command with only kube-proxy's
// flags and a KubeProxyConfiguration file (kubeadm's fields, plus
// masqueradeAll, nodePortAddresses primary, conntrack timeouts, -v):
// the settings are honoured with real traffic and in the kernel; /healthz
// and /livez answer kube-proxy's JSON and /healthz turns 503 when the
// Cluster Autoscaler taints the node; a refused setting stops the command
// with an error naming it, and so does a kube-proxy flag xlb does not take.
func TestKubeProxyConfigFile(t *testing.T) {
	e := newWorld(t, 2)
	api := apiserver(t)
	bin := xlbBinary(t)
	e.startServers()
	kubeconfig := e.proxyKubeconfig(api)
	// A second InternalIP: --nodeport-addresses primary serves NodePorts
	// on the first one only.
	e.LB.AddAddr(t, netip.MustParsePrefix("10.100.0.9/24"))
	node, err := e.client.CoreV1().Nodes().Get(e.ctx, e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.100.0.9"})
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(e.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "config.conf")
	body, err := os.ReadFile("../../internal/kube/proxyconfig/testdata/kubeadm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer(
		"kubeconfig: /var/lib/kube-proxy/kubeconfig.conf", "kubeconfig: "+kubeconfig,
		`hostnameOverride: ""`, "hostnameOverride: "+e.node,
		`healthzBindAddress: ""`, "healthzBindAddress: 127.0.0.1:10256",
		`metricsBindAddress: ""`, "metricsBindAddress: 127.0.0.1:10249",
		"nodePortAddresses: null", "nodePortAddresses: [primary]",
		"tcpEstablishedTimeout: null", "tcpEstablishedTimeout: 7h",
		"udpTimeout: 0s", "udpTimeout: 33s",
	).Replace(string(body))
	conf = strings.Replace(conf, "nftables:\n  masqueradeAll: false", "nftables:\n  masqueradeAll: true", 1)
	if err := os.WriteFile(config, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := e.startProxyArgs(nil, bin, "--config", config, "--state-dir", filepath.Join(dir, "state"), "-v", "4")
	e.waitHealthy()

	s := service("web", corev1.ServiceTypeNodePort)
	svc := e.createService(s)
	e.setEndpoints("web", false, ready(0, 1))
	cip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	e.waitBothEndpoints(cip)
	// masqueradeAll: cluster IP traffic is masqueraded too.
	reply, err := testutil.AskTCP(e.Client.NS, cip)
	if err != nil {
		t.Fatal(err)
	}
	if _, from, _ := testutil.ParseReply(reply); from.Addr() != e.LBBack4 {
		t.Errorf("with masqueradeAll the endpoint saw %s, want the node's %s", from, e.LBBack4)
	}
	// nodePortAddresses primary: the first InternalIP serves the NodePort,
	// the second does not.
	np := uint16(svc.Spec.Ports[0].NodePort)
	if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(e.LB.IPv4, np)); err != nil {
		t.Errorf("NodePort on the primary address: %v", err)
	}
	if got, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(netip.MustParseAddr("10.100.0.9"), np)); err == nil {
		t.Errorf("NodePort on the second InternalIP answered %q with nodePortAddresses primary", got)
	}
	// conntrack timeouts: the kernel's, in the proxy's namespace.
	for sysctl, want := range map[string]string{"nf_conntrack_tcp_timeout_established": "25200", "nf_conntrack_udp_timeout": "33"} {
		got := strings.TrimSpace(testutil.Run(t, e.LB.Name, "cat", "/proc/sys/net/netfilter/"+sysctl))
		if got != want {
			t.Errorf("%s = %s, want %s", sysctl, got, want)
		}
	}
	// -v 4: debug lines; the accepted-without-effect settings are logged.
	// clusterCIDR is used (internal/kube/clustercidr.go), so it is not
	// among them.
	e.waitFor("a debug line and the accepted-without-effect settings in the log", func() bool {
		l := p.log.String()
		return strings.Contains(l, "level=DEBUG") && strings.Contains(l, "accepted without effect")
	})
	if l := p.log.String(); strings.Contains(l, "clusterCIDR") && strings.Contains(l, "not used") {
		t.Errorf("the log says clusterCIDR is not used")
	}

	// kube-proxy's /healthz and /livez.
	for _, path := range []string{"/healthz", "/livez"} {
		code, h := e.health(path)
		if code != 200 || (path == "/healthz") != (h.NodeEligible != nil) || h.NodeEligible != nil && !*h.NodeEligible {
			t.Errorf("GET %s: %d %+v", path, code, h)
		}
	}
	node, err = e.client.CoreV1().Nodes().Get(e.ctx, e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule})
	if _, err := e.client.CoreV1().Nodes().Update(e.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("/healthz 503 with nodeEligible false", func() bool {
		code, h := e.health("/healthz")
		return code == 503 && h.NodeEligible != nil && !*h.NodeEligible
	})
	if code, _ := e.health("/livez"); code != 200 {
		t.Errorf("/livez of a tainted node: %d, want 200", code)
	}
	p.stop(t)

	// Refused, naming what: a setting of the file, a kube-proxy flag.
	bad := filepath.Join(dir, "bad.conf")
	if err := os.WriteFile(bad, []byte(strings.Replace(conf, `detectLocalMode: ""`, "detectLocalMode: NodeCIDR", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", bad}, `field "detectLocalMode" value NodeCIDR`},
		{[]string{"--config", config, "--ipvs-scheduler", "sh"}, "unknown flag: --ipvs-scheduler"},
		{[]string{"--config", config, "--proxy-mode", "kernelspace"}, `--proxy-mode "kernelspace"`},
	} {
		out, err := exec.Command(bin, append([]string{"kube-proxy"}, c.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%v: %v, output %q, want an error with %q", c.args, err, out, c.want)
		}
	}
}

// TestKubeProxyCleanup: `xlb kube-proxy --cleanup` removes every table the
// nft plane made (with localhost NodePorts' guard table), and every pin of the ebpf plane (its tcx links, its
// socket programs' cgroup links, its maps), and exits; traffic to the
// Services stops.
func TestKubeProxyCleanup(t *testing.T) {
	for _, plane := range []string{"nft", "ebpf"} {
		t.Run(plane, func(t *testing.T) {
			e := newWorld(t, 2)
			api := apiserver(t)
			bin := xlbBinary(t)
			e.startServers()
			kubeconfig := e.proxyKubeconfig(api)
			var extra, cleanupArgs []string
			var pin string
			var cg *testutil.Cgroup
			if plane == "nft" {
				// Localhost NodePorts add the guard's table (inet
				// xlb-kube-localnet): --cleanup removes it too.
				extra = []string{"--nodeport-addresses", "localhost"}
			}
			if plane == "ebpf" {
				pin = mountBPFFS(t)
				cg = testutil.NewCgroup(t)
				extra = []string{"--dataplane", "ebpf", "--pin-path", pin, "--socket-lb-cgroup", cg.Dir, "--conn-table-size", "4096"}
				cleanupArgs = []string{"--dataplane", "ebpf", "--pin-path", pin}
			}
			p := e.startProxy(bin, kubeconfig, t.TempDir(), extra...)
			e.waitHealthy()
			svc := e.createService(service("web", corev1.ServiceTypeClusterIP))
			e.setEndpoints("web", false, ready(0, 1))
			cip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
			e.waitBothEndpoints(cip)
			p.stop(t)
			tables := func() string {
				var out []string
				for _, l := range strings.Split(testutil.Run(t, e.LB.Name, "nft", "list", "tables"), "\n") {
					if strings.Contains(l, "xlb") {
						out = append(out, l)
					}
				}
				return strings.Join(out, "; ")
			}
			if plane == "nft" && !strings.Contains(tables(), "xlb-kube-localnet") {
				t.Fatalf("no xlb-kube-localnet table before the cleanup: %s", tables())
			}
			if plane == "ebpf" {
				if entries, _ := os.ReadDir(pin); len(entries) == 0 {
					t.Fatal("no pin before the cleanup")
				}
			}
			out, err := exec.Command("ip", append([]string{"netns", "exec", e.LB.Name, bin, "kube-proxy", "--cleanup"}, cleanupArgs...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("--cleanup: %v\n%s", err, out)
			}
			if left := tables(); left != "" {
				t.Errorf("tables left after --cleanup: %s", left)
			}
			if plane == "ebpf" {
				if _, err := os.Stat(pin); !os.IsNotExist(err) {
					entries, _ := os.ReadDir(pin)
					t.Errorf("pin path after --cleanup: %v, %d entries", err, len(entries))
				}
				if n := cgroupProgs(t, cg.Dir); n != 0 {
					t.Errorf("%d socket programs still attached to the cgroup", n)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				_, err := testutil.AskTCP(e.Client.NS, cip)
				if err != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("the Service still answers after --cleanup")
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// cgroupProgs counts the programs attached to the cgroup dir at the
// socket hooks.
func cgroupProgs(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	n := 0
	for _, a := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP4Sendmsg,
		ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg,
		ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername} {
		r, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: a})
		if err != nil {
			t.Fatalf("query cgroup programs: %v", err)
		}
		n += len(r.Programs)
	}
	return n
}
