// Package proxyconfig reads kube-proxy's configuration file
// (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1, kube-proxy's
// own Go types) for `xlb kube-proxy --config`, so the ConfigMap a cluster
// already has (kubeadm writes one) keeps working. Every field is honoured
// (mapped onto xlb's settings), or accepted with a note saying why it
// changes nothing in xlb (the settings of kube-proxy's own iptables, ipvs
// and nftables implementations, which kube-proxy itself ignores in the
// other modes), or refused with an error naming the field, its value and
// what xlb accepts. Unknown fields are refused.
package proxyconfig

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// APIVersion and Kind of the file.
const (
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"
)

// Settings are what xlb takes from the file. Zero values leave xlb's own
// defaults (and command-line flags) in place.
type Settings struct {
	Kubeconfig         string
	AcceptContentTypes string
	ContentType        string
	QPS                float32
	Burst              int32
	Hostname           string
	HealthzBindAddress string
	MetricsBindAddress string
	Profiling          bool
	// ClusterCIDRs is clusterCIDR (comma-separated, one per family).
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll is iptables.masqueradeAll or nftables.masqueradeAll.
	MasqueradeAll     bool
	NodePortAddresses NodePortAddresses
	Verbosity         int
	LogFormat         string // "" (text) or "json"
	OOMScoreAdj       *int32
	Conntrack         Conntrack
	Mode              string
	// Notes are the fields accepted that change nothing in xlb, each
	// with why (logged at start).
	Notes []string
}

// NodePortAddresses is --nodeport-addresses / nodePortAddresses, as
// kube-proxy 1.37 takes it: CIDRs and the keywords "primary" (the Node's
// primary addresses), "localhost" (127.0.0.0/8 and ::1/128) and "all"
// (0.0.0.0/0 and ::/0), in any combination; "localhost" and "all" arrive
// here as their CIDRs. Nothing given: every address of the Node's status
// (see kube.Config.NodePortAddresses).
type NodePortAddresses struct {
	CIDRs   []netip.Prefix
	Primary bool
}

// The keywords' CIDRs (kube-proxy's expandNodePortAddressKeywords).
var (
	localhostCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	allCIDRs       = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
)

// ParseNodePortAddresses parses kube-proxy's nodePortAddresses values:
// CIDRs and keywords, each keyword at most once (as kube-proxy's
// validation).
func ParseNodePortAddresses(field string, vals []string) (NodePortAddresses, error) {
	var out NodePortAddresses
	seen := map[string]bool{}
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		switch v {
		case "primary", "localhost", "all":
			if seen[v] {
				return out, fmt.Errorf("%s %q: keyword %q given twice", field, strings.Join(vals, ","), v)
			}
			seen[v] = true
			switch v {
			case "primary":
				out.Primary = true
			case "localhost":
				out.CIDRs = append(out.CIDRs, localhostCIDRs...)
			default:
				out.CIDRs = append(out.CIDRs, allCIDRs...)
			}
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return out, fmt.Errorf("%s %q: must be CIDRs such as 192.168.0.0/16 or 2001:db8::/64, or the keywords \"primary\", \"localhost\", \"all\"", field, v)
		}
		out.CIDRs = append(out.CIDRs, p.Masked())
	}
	return out, nil
}

// Conntrack are the kernel conntrack settings kube-proxy sets.
type Conntrack struct {
	MaxPerCore, Min *int32
	// Timeouts; zero: leave the kernel's (or the plane's) value.
	TCPEstablished, TCPCloseWait, UDP, UDPStream time.Duration
	TCPBeLiberal                                 bool
}

// Max is the conntrack table size kube-proxy sets, max(maxPerCore × CPUs,
// min), and whether to set one at all (maxPerCore 0 or unset: no).
func (c Conntrack) Max(cpus int) (int, bool) {
	if c.MaxPerCore == nil || *c.MaxPerCore <= 0 {
		return 0, false
	}
	n := int(*c.MaxPerCore) * cpus
	if c.Min != nil && int(*c.Min) > n {
		n = int(*c.Min)
	}
	return n, true
}

// Load reads and checks the file at path.
func Load(path string) (*Settings, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var c kpv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	s, err := FromConfig(&c)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	return s, nil
}

// FromConfig maps a KubeProxyConfiguration onto xlb's settings, refusing
// what xlb cannot do.
func FromConfig(c *kpv1alpha1.KubeProxyConfiguration) (*Settings, error) {
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want %s, %s", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	s := &Settings{
		Kubeconfig:         c.ClientConnection.Kubeconfig,
		AcceptContentTypes: c.ClientConnection.AcceptContentTypes,
		ContentType:        c.ClientConnection.ContentType,
		QPS:                c.ClientConnection.QPS,
		Burst:              c.ClientConnection.Burst,
		Hostname:           c.HostnameOverride,
		HealthzBindAddress: c.HealthzBindAddress,
		MetricsBindAddress: c.MetricsBindAddress,
		Profiling:          c.EnableProfiling,
		OOMScoreAdj:        c.OOMScoreAdj,
		Mode:               string(c.Mode),
		MasqueradeAll:      c.IPTables.MasqueradeAll || c.NFTables.MasqueradeAll,
	}
	refuse := func(field string, value any, why string) error {
		return fmt.Errorf("field %q value %v: %s", field, value, why)
	}
	note := func(field, why string) { s.Notes = append(s.Notes, field+": "+why) }

	if len(c.FeatureGates) > 0 {
		return nil, refuse("featureGates", c.FeatureGates, "xlb has no feature gates; remove them")
	}
	for _, a := range []struct{ field, v string }{{"healthzBindAddress", c.HealthzBindAddress}, {"metricsBindAddress", c.MetricsBindAddress}} {
		if a.v == "" {
			continue
		}
		if _, err := netip.ParseAddrPort(a.v); err != nil {
			return nil, refuse(a.field, a.v, "must be address:port, e.g. 0.0.0.0:10256")
		}
	}
	switch c.BindAddress {
	case "", "0.0.0.0", "::":
	default:
		return nil, refuse("bindAddress", c.BindAddress, `only "0.0.0.0" or "::" (every address; xlb serves on healthzBindAddress and metricsBindAddress)`)
	}
	if !c.BindAddressHardFail {
		note("bindAddressHardFail", "false: xlb always exits when it cannot bind its health or metrics address")
	}
	if c.ShowHiddenMetricsForVersion != "" {
		return nil, refuse("showHiddenMetricsForVersion", c.ShowHiddenMetricsForVersion, "xlb hides no metrics; remove it")
	}
	switch c.Mode {
	case "", "iptables", "ipvs", "nftables":
		if c.Mode != "" {
			note("mode", fmt.Sprintf("%q: xlb programs its own data plane (--dataplane), whatever the mode", c.Mode))
		}
	default:
		return nil, refuse("mode", c.Mode, `allowed values are "", iptables, ipvs, nftables (xlb's own data plane is chosen by --dataplane)`)
	}
	// The settings of kube-proxy's own implementations: kube-proxy
	// ignores those of the modes it does not run; xlb runs none of them.
	if c.IPTables != (kpv1alpha1.KubeProxyIPTablesConfiguration{}) {
		note("iptables", "kube-proxy's iptables implementation's settings (masqueradeAll is honoured; localhostNodePorts: NodePorts on 127.0.0.1 are not served by xlb)")
	}
	if !zeroIPVS(c.IPVS) {
		note("ipvs", "kube-proxy's ipvs implementation's settings: xlb has its own schedulers (annotations) and timeouts (conntrack)")
	}
	if c.NFTables != (kpv1alpha1.KubeProxyNFTablesConfiguration{}) {
		note("nftables", "kube-proxy's nftables implementation's settings (masqueradeAll is honoured)")
	}
	if c.Winkernel != (kpv1alpha1.KubeProxyWinkernelConfiguration{}) {
		return nil, refuse("winkernel", fmt.Sprintf("%+v", c.Winkernel), "Windows only; remove it")
	}
	switch c.DetectLocalMode {
	case "", "ClusterCIDR":
	default:
		return nil, refuse("detectLocalMode", c.DetectLocalMode, `allowed values are "" and ClusterCIDR`)
	}
	if c.DetectLocal != (kpv1alpha1.DetectLocalConfiguration{}) {
		return nil, refuse("detectLocal", fmt.Sprintf("%+v", c.DetectLocal), "only detectLocalMode ClusterCIDR is implemented; remove it")
	}
	for _, v := range strings.Split(c.ClusterCIDR, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, refuse("clusterCIDR", c.ClusterCIDR, "must be CIDRs, one per family, separated by a comma")
		}
		s.ClusterCIDRs = append(s.ClusterCIDRs, p.Masked())
	}
	npa, err := ParseNodePortAddresses("field \"nodePortAddresses\"", c.NodePortAddresses)
	if err != nil {
		return nil, err
	}
	s.NodePortAddresses = npa
	ct := c.Conntrack
	s.Conntrack = Conntrack{MaxPerCore: ct.MaxPerCore, Min: ct.Min, TCPBeLiberal: ct.TCPBeLiberal,
		UDP: ct.UDPTimeout.Duration, UDPStream: ct.UDPStreamTimeout.Duration}
	for _, t := range []struct {
		field string
		v     *metav1.Duration
		to    *time.Duration
	}{{"conntrack.tcpEstablishedTimeout", ct.TCPEstablishedTimeout, &s.Conntrack.TCPEstablished}, {"conntrack.tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout, &s.Conntrack.TCPCloseWait}} {
		if t.v != nil {
			*t.to = t.v.Duration
		}
	}
	for _, t := range []struct {
		field string
		v     time.Duration
	}{{"conntrack.tcpEstablishedTimeout", s.Conntrack.TCPEstablished}, {"conntrack.tcpCloseWaitTimeout", s.Conntrack.TCPCloseWait},
		{"conntrack.udpTimeout", s.Conntrack.UDP}, {"conntrack.udpStreamTimeout", s.Conntrack.UDPStream}} {
		if t.v < 0 || t.v%time.Second != 0 {
			return nil, refuse(t.field, t.v, "must be whole seconds, 0 or more (0: leave the kernel's)")
		}
	}
	for _, n := range []struct {
		field string
		v     *int32
	}{{"conntrack.maxPerCore", ct.MaxPerCore}, {"conntrack.min", ct.Min}} {
		if n.v != nil && *n.v < 0 {
			return nil, refuse(n.field, *n.v, "must be 0 or more")
		}
	}
	if c.ConfigSyncPeriod.Duration != 0 {
		note("configSyncPeriod", "xlb does not resync periodically: each change is applied as it comes, and a failure is followed by a full reconcile")
	}
	if c.OOMScoreAdj != nil && (*c.OOMScoreAdj < -1000 || *c.OOMScoreAdj > 1000) {
		return nil, refuse("oomScoreAdj", *c.OOMScoreAdj, "allowed values are -1000 to 1000")
	}
	if c.PortRange != "" {
		return nil, refuse("portRange", c.PortRange, "unused since kube-proxy's userspace mode; remove it")
	}
	if c.WindowsRunAsService {
		return nil, refuse("windowsRunAsService", true, "Windows only")
	}
	lg := c.Logging
	switch lg.Format {
	case "", "text":
	case "json":
		s.LogFormat = "json"
	default:
		return nil, refuse("logging.format", lg.Format, "allowed values are text and json")
	}
	if len(lg.VModule) > 0 {
		return nil, refuse("logging.vmodule", lg.VModule, "xlb has no per-file verbosity; use logging.verbosity")
	}
	s.Verbosity = int(lg.Verbosity)
	if lg.FlushFrequency.Duration.Duration != 0 {
		note("logging.flushFrequency", "xlb writes each log line at once")
	}
	return s, nil
}

func zeroIPVS(c kpv1alpha1.KubeProxyIPVSConfiguration) bool {
	return c.SyncPeriod.Duration == 0 && c.MinSyncPeriod.Duration == 0 && c.Scheduler == "" && len(c.ExcludeCIDRs) == 0 &&
		!c.StrictARP && c.TCPTimeout.Duration == 0 && c.TCPFinTimeout.Duration == 0 && c.UDPTimeout.Duration == 0
}
