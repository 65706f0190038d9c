package proxyconfig

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestKubeadmConfig: the file kubeadm writes loads, with its kubeconfig
// and cluster CIDR, and notes what does nothing.
func TestKubeadmConfig(t *testing.T) {
	s, err := Load("testdata/kubeadm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || fmt.Sprint(s.ClusterCIDRs) != "[10.244.0.0/16]" {
		t.Errorf("settings %+v", s)
	}
	if _, set := s.Conntrack.Max(4); set || s.MasqueradeAll || s.NodePortAddresses.Primary || len(s.NodePortAddresses.CIDRs) > 0 {
		t.Errorf("defaults changed something: %+v", s)
	}
	if strings.Contains(strings.Join(s.Notes, "\n"), "clusterCIDR") {
		t.Errorf("notes %q say clusterCIDR does nothing; it is used (internal/kube/clustercidr.go)", s.Notes)
	}
}

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHonoured: the fields xlb maps onto its settings.
func TestHonoured(t *testing.T) {
	s, err := Load(write(t, `
hostnameOverride: node1
clientConnection: {kubeconfig: /k, qps: 50, burst: 100, contentType: application/vnd.kubernetes.protobuf}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 0.0.0.0:10249
enableProfiling: true
clusterCIDR: 10.244.0.0/16,fd00:244::/56
nftables: {masqueradeAll: true}
nodePortAddresses: [primary]
logging: {verbosity: 4, format: json}
oomScoreAdj: -999
mode: nftables
conntrack: {maxPerCore: 32768, min: 131072, tcpEstablishedTimeout: 24h, tcpCloseWaitTimeout: 1h, udpTimeout: 30s, udpStreamTimeout: 2m, tcpBeLiberal: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{Kubeconfig: "/k", QPS: 50, Burst: 100, ContentType: "application/vnd.kubernetes.protobuf", Hostname: "node1",
		HealthzBindAddress: "127.0.0.1:10256", MetricsBindAddress: "0.0.0.0:10249", Profiling: true,
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")},
		MasqueradeAll: true, NodePortAddresses: NodePortAddresses{Primary: true}, Verbosity: 4, LogFormat: "json", Mode: "nftables"}
	got := *s
	got.Notes, got.OOMScoreAdj, got.Conntrack = nil, nil, Conntrack{}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("settings\n%+v\nwant\n%+v", got, want)
	}
	if s.OOMScoreAdj == nil || *s.OOMScoreAdj != -999 {
		t.Errorf("oomScoreAdj %v", s.OOMScoreAdj)
	}
	ct := s.Conntrack
	if n, ok := ct.Max(2); !ok || n != 131072 {
		t.Errorf("conntrack max on 2 CPUs: %d %v, want 131072 (min)", n, ok)
	}
	if n, _ := ct.Max(8); n != 262144 {
		t.Errorf("conntrack max on 8 CPUs: %d, want 262144", n)
	}
	if ct.TCPEstablished != 24*time.Hour || ct.TCPCloseWait != time.Hour || ct.UDP != 30*time.Second || ct.UDPStream != 2*time.Minute || !ct.TCPBeLiberal {
		t.Errorf("conntrack %+v", ct)
	}
}

// TestRefused: what xlb cannot do is refused, naming the field and value.
func TestRefused(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"bogus: 1\n", `unknown field "bogus"`},
		{"mode: kernelspace\n", `field "mode" value kernelspace: allowed values are`},
		{"featureGates: {Foo: true}\n", `field "featureGates" value map[Foo:true]`},
		{"detectLocalMode: NodeCIDR\n", `field "detectLocalMode" value NodeCIDR`},
		{"detectLocal: {bridgeInterface: cbr0}\n", `field "detectLocal"`},
		{"clusterCIDR: 10.244.0.0\n", `field "clusterCIDR" value 10.244.0.0: must be CIDRs`},
		{"nodePortAddresses: [primary, 10.0.0.0/8, primary]\n", `keyword "primary" given twice`},
		{"nodePortAddresses: [10.0.0.0/33]\n", `"10.0.0.0/33": must be CIDRs`},
		{"nodePortAddresses: [eth0]\n", `"eth0": must be CIDRs`},
		{"healthzBindAddress: 10256\n", `field "healthzBindAddress" value 10256: must be address:port`},
		{"bindAddress: 10.0.0.1\n", `field "bindAddress" value 10.0.0.1`},
		{"logging: {format: xml}\n", `field "logging.format" value xml`},
		{"logging: {vmodule: [{filePattern: proxier, verbosity: 4}]}\n", `field "logging.vmodule"`},
		{"conntrack: {udpTimeout: 1500ms}\n", `field "conntrack.udpTimeout" value 1.5s: must be whole seconds`},
		{"conntrack: {maxPerCore: -1}\n", `field "conntrack.maxPerCore" value -1`},
		{"oomScoreAdj: 2000\n", `field "oomScoreAdj" value 2000`},
		{"portRange: 30000-32767\n", `field "portRange"`},
		{"winkernel: {enableDSR: true}\n", `field "winkernel"`},
		{"showHiddenMetricsForVersion: \"1.30\"\n", `field "showHiddenMetricsForVersion"`},
	} {
		_, err := Load(write(t, c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.body, err, c.want)
		}
	}
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte("apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n"), 0o600)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), `apiVersion "kubeproxy.config.k8s.io/v1beta1"`) {
		t.Errorf("another apiVersion: %v", err)
	}
}

// TestNodePortAddressKeywords: kube-proxy 1.37's keywords, combined with
// CIDRs, become what they stand for.
func TestNodePortAddressKeywords(t *testing.T) {
	got, err := ParseNodePortAddresses("--nodeport-addresses", []string{"primary", "localhost", "10.0.0.0/8", "all"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	if !got.Primary || !slices.Equal(got.CIDRs, want) {
		t.Errorf("got %+v, want primary and %v", got, want)
	}
}
