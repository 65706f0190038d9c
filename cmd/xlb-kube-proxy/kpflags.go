package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/xlb-lb/xlb/internal/kube/proxyconfig"
)

// kube-proxy's own command line (cmd/kube-proxy), so a DaemonSet written
// for kube-proxy runs xlb with its arguments: the flags below are honoured
// (or checked and refused with an error naming them), --config reads its
// KubeProxyConfiguration file (internal/kube/proxyconfig), and any other
// kube-proxy flag is refused as unknown, by name.
type kpOptions struct {
	config        string
	cleanup       bool
	master        string
	clusterCIDR   string
	masqueradeAll bool
	proxyMode     string
	bindAddress   string
	detectLocal   string
	featureGates  string
	verbosity     int
	logFormat     string
	oomScoreAdj   int32
	profiling     bool
	qps           float32
	burst         int32
	contentType   string
	syncPeriod    time.Duration
	ctMaxPerCore  int32
	ctMin         int32
	ctEstablished time.Duration
	ctCloseWait   time.Duration
	ctUDP         time.Duration
	ctUDPStream   time.Duration
	ctBeLiberal   bool

	// settings are what the flags and --config add up to (resolve).
	settings proxyconfig.Settings
}

func (k *kpOptions) register(f *pflag.FlagSet) {
	f.StringVar(&k.config, "config", "", "kube-proxy's configuration file (KubeProxyConfiguration v1alpha1); flags given on the command line override it")
	f.BoolVar(&k.cleanup, "cleanup", false, "remove every nftables table and eBPF program, link and map pin this proxy's flags name, then exit")
	f.StringVar(&k.master, "master", "", "the API server's address (overrides the kubeconfig's)")
	f.StringVar(&k.clusterCIDR, "cluster-cidr", "", "the cluster's Pod CIDRs, comma-separated: traffic to cluster IPs from outside them is masqueraded, and Pods reaching an externalTrafficPolicy Local Service's external addresses get every endpoint")
	f.BoolVar(&k.masqueradeAll, "masquerade-all", false, "masquerade all traffic to cluster IPs (cluster farms in snat mode)")
	f.StringVar(&k.proxyMode, "proxy-mode", "", `kube-proxy's mode: "", iptables, ipvs or nftables (xlb programs its own data plane: --dataplane)`)
	f.StringVar(&k.bindAddress, "bind-address", "0.0.0.0", `"0.0.0.0" or "::" (xlb serves on --healthz-bind-address and --metrics-bind-address)`)
	f.StringVar(&k.detectLocal, "detect-local-mode", "", `"" or ClusterCIDR`)
	f.StringVar(&k.featureGates, "feature-gates", "", "refused: xlb has no feature gates")
	f.IntVarP(&k.verbosity, "v", "v", 0, "log verbosity as kube-proxy's: 0-3 info, 4 and more debug (--log-level overrides)")
	f.StringVar(&k.logFormat, "logging-format", "text", "log format: text or json")
	f.Int32Var(&k.oomScoreAdj, "oom-score-adj", 0, "this process's oom_score_adj (-1000 to 1000; kube-proxy's default -999 is not applied unless given)")
	f.BoolVar(&k.profiling, "profiling", false, "serve /debug/pprof on --metrics-bind-address")
	f.Float32Var(&k.qps, "kube-api-qps", 0, "queries per second to the API server (0: client-go's default)")
	f.Int32Var(&k.burst, "kube-api-burst", 0, "burst of queries to the API server (0: client-go's default)")
	f.StringVar(&k.contentType, "kube-api-content-type", "", "content type of requests to the API server")
	f.DurationVar(&k.syncPeriod, "config-sync-period", 0, "accepted; xlb does not resync periodically (each change is applied as it comes)")
	f.Int32Var(&k.ctMaxPerCore, "conntrack-max-per-core", 0, "conntrack entries per CPU (0: leave the limit alone); with --conntrack-min, the connections tracked (nft: nf_conntrack_max; ebpf: --conn-table-size)")
	f.Int32Var(&k.ctMin, "conntrack-min", 0, "at least this many conntrack entries, with --conntrack-max-per-core")
	f.DurationVar(&k.ctEstablished, "conntrack-tcp-timeout-established", 0, "idle timeout of established TCP connections (nft: the kernel's sysctl; ebpf: --ct-timeout-tcp); 0: leave it")
	f.DurationVar(&k.ctCloseWait, "conntrack-tcp-timeout-close-wait", 0, "idle timeout of TCP connections in CLOSE_WAIT (nft: the sysctl; ebpf: --ct-timeout-tcpfin); 0: leave it")
	f.DurationVar(&k.ctUDP, "conntrack-udp-timeout", 0, "idle timeout of UDP flows seen one way (nft: the sysctl; ebpf: --ct-timeout-udp, unless --conntrack-udp-timeout-stream); 0: leave it")
	f.DurationVar(&k.ctUDPStream, "conntrack-udp-timeout-stream", 0, "idle timeout of UDP flows seen both ways (nft: the sysctl; ebpf: --ct-timeout-udp); 0: leave it")
	f.BoolVar(&k.ctBeLiberal, "conntrack-tcp-be-liberal", false, "nft: set nf_conntrack_tcp_be_liberal (the ebpf plane does not check TCP windows)")
}

// resolve merges --config (when given) under the flags set on the command
// line into k.settings, and checks the result. It also fills the xlb
// options the kube-proxy settings name (kubeconfig, hostname, addresses)
// where their flags were not given.
func (k *kpOptions) resolve(f *pflag.FlagSet, o *kubeProxyOptions) error {
	s := proxyconfig.Settings{}
	if k.config != "" {
		loaded, err := proxyconfig.Load(k.config)
		if err != nil {
			return err
		}
		s = *loaded
	}
	set := f.Changed
	if k.featureGates != "" {
		return fmt.Errorf("--feature-gates %q: xlb has no feature gates; remove it", k.featureGates)
	}
	switch k.bindAddress {
	case "0.0.0.0", "::", "":
	default:
		return fmt.Errorf(`--bind-address %q: only "0.0.0.0" or "::" (xlb serves on --healthz-bind-address and --metrics-bind-address)`, k.bindAddress)
	}
	switch k.detectLocal {
	case "", "ClusterCIDR":
	default:
		return fmt.Errorf(`--detect-local-mode %q: allowed values are "" and ClusterCIDR`, k.detectLocal)
	}
	if set("proxy-mode") {
		switch k.proxyMode {
		case "", "iptables", "ipvs", "nftables":
			s.Mode = k.proxyMode
		default:
			return fmt.Errorf(`--proxy-mode %q: allowed values are "", iptables, ipvs, nftables (xlb's own data plane is chosen by --dataplane)`, k.proxyMode)
		}
	}
	if set("cluster-cidr") {
		s.ClusterCIDRs = nil
		for _, v := range strings.Split(k.clusterCIDR, ",") {
			if v = strings.TrimSpace(v); v == "" {
				continue
			}
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return fmt.Errorf("--cluster-cidr %q: must be CIDRs, one per family, separated by a comma", k.clusterCIDR)
			}
			s.ClusterCIDRs = append(s.ClusterCIDRs, p.Masked())
		}
	}
	if set("masquerade-all") {
		s.MasqueradeAll = k.masqueradeAll
	}
	if set("v") {
		s.Verbosity = k.verbosity
	}
	if set("logging-format") || s.LogFormat == "" {
		switch k.logFormat {
		case "text":
			s.LogFormat = ""
		case "json":
			s.LogFormat = "json"
		default:
			return fmt.Errorf("--logging-format %q: allowed values are text, json", k.logFormat)
		}
	}
	if set("oom-score-adj") {
		if k.oomScoreAdj < -1000 || k.oomScoreAdj > 1000 {
			return fmt.Errorf("--oom-score-adj %d: allowed values are -1000 to 1000", k.oomScoreAdj)
		}
		s.OOMScoreAdj = &k.oomScoreAdj
	}
	if set("profiling") {
		s.Profiling = k.profiling
	}
	if set("kube-api-qps") {
		s.QPS = k.qps
	}
	if set("kube-api-burst") {
		s.Burst = k.burst
	}
	if set("kube-api-content-type") {
		s.ContentType = k.contentType
	}
	ct := &s.Conntrack
	if set("conntrack-max-per-core") {
		ct.MaxPerCore = &k.ctMaxPerCore
	}
	if set("conntrack-min") {
		ct.Min = &k.ctMin
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
		to   *time.Duration
	}{{"conntrack-tcp-timeout-established", k.ctEstablished, &ct.TCPEstablished}, {"conntrack-tcp-timeout-close-wait", k.ctCloseWait, &ct.TCPCloseWait},
		{"conntrack-udp-timeout", k.ctUDP, &ct.UDP}, {"conntrack-udp-timeout-stream", k.ctUDPStream, &ct.UDPStream}} {
		if !set(d.flag) {
			continue
		}
		if d.v < 0 || d.v%time.Second != 0 {
			return fmt.Errorf("--%s %s: must be whole seconds, 0 or more (0: leave the kernel's)", d.flag, d.v)
		}
		*d.to = d.v
	}
	if set("conntrack-tcp-be-liberal") {
		ct.TCPBeLiberal = k.ctBeLiberal
	}
	// The settings the file shares with xlb's own flags.
	if !set("kubeconfig") && s.Kubeconfig != "" {
		o.kubeconfig = s.Kubeconfig
	}
	if !set("hostname-override") && s.Hostname != "" {
		o.hostname = s.Hostname
	}
	if !set("healthz-bind-address") && s.HealthzBindAddress != "" {
		o.healthzAddr = s.HealthzBindAddress
	}
	if !set("metrics-bind-address") && s.MetricsBindAddress != "" {
		o.metricsAddr = s.MetricsBindAddress
	}
	if set("nodeport-addresses") || (len(s.NodePortAddresses.CIDRs) == 0 && !s.NodePortAddresses.Primary) {
		npa, err := proxyconfig.ParseNodePortAddresses("--nodeport-addresses", o.nodePortAddresses)
		if err != nil {
			return err
		}
		s.NodePortAddresses = npa
	}
	// The conntrack settings reach the data plane's flags, unless those
	// were given themselves (the caller marks the size as set once the
	// flags are checked: see conntrackSized).
	if n, ok := ct.Max(runtime.NumCPU()); ok && !set("conn-table-size") {
		o.dp.ConnTableSize = n
	}
	if o.dp.Plane == "ebpf" {
		for _, t := range []struct {
			flag string
			v    time.Duration
			to   *time.Duration
		}{{"ct-timeout-tcp", ct.TCPEstablished, &o.dp.Timeouts.TCP}, {"ct-timeout-tcpfin", ct.TCPCloseWait, &o.dp.Timeouts.TCPFin},
			{"ct-timeout-udp", max(ct.UDP, ct.UDPStream), &o.dp.Timeouts.UDP}} {
			if t.v > 0 && !set(t.flag) {
				*t.to = t.v
			}
		}
	}
	k.settings = s
	return nil
}

// conntrackSized reports whether the conntrack size comes from kube-proxy's
// settings (so the nft plane sets nf_conntrack_max, as --conn-table-size
// does).
func (k *kpOptions) conntrackSized(f *pflag.FlagSet) bool {
	_, ok := k.settings.Conntrack.Max(runtime.NumCPU())
	return ok && !f.Changed("conn-table-size")
}

// logLevel is the level kube-proxy's verbosity means for xlb's logs, or
// the one --log-level names when given.
func (k *kpOptions) logLevel(f *pflag.FlagSet, logLevel string) (slog.Level, error) {
	var level slog.Level
	if f.Changed("log-level") || k.settings.Verbosity == 0 {
		if err := level.UnmarshalText([]byte(logLevel)); err != nil {
			return level, fmt.Errorf("--log-level %q: allowed values are debug, info, warn, error", logLevel)
		}
		return level, nil
	}
	if k.settings.Verbosity >= 4 {
		return slog.LevelDebug, nil
	}
	return slog.LevelInfo, nil
}

// setOOMScoreAdj writes this process's oom_score_adj, as kube-proxy does.
func setOOMScoreAdj(v int32) error {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(fmt.Sprint(v)), 0); err != nil {
		return fmt.Errorf("oom-score-adj %d: %w", v, err)
	}
	return nil
}
