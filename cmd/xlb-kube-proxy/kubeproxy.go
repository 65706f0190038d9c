package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/setup"
	"github.com/xlb-lb/xlb/internal/store"
)

type kubeProxyOptions struct {
	kubeconfig        string
	hostname          string
	dp                setup.Flags
	stateDir          string
	nodePortAddresses []string
	metricsAddr       string
	healthzAddr       string
	logLevel          string
	apiEndpoints      []string
}

// The proxy's table and pin path are apart from xlb daemon's (xlb,
// /sys/fs/bpf/xlb): the two may run on one host, each with its own rules
// and maps.
var kubeProxyDefaults = setup.Defaults{NFTTable: "xlb-kube", PinPath: "/sys/fs/bpf/xlb-kube"}

func (a *app) kubeProxyCmd() *cobra.Command {
	var o kubeProxyOptions
	cmd := &cobra.Command{
		Use:   "kube-proxy",
		Short: "Run as a Kubernetes service proxy (replaces kube-proxy)",
		Long: `Watch Services, EndpointSlices and this node's Node object and program every
Service as xlb farms: ClusterIP, NodePort (on the node's addresses),
LoadBalancer status IPs and externalIPs; TCP, UDP, SCTP; IPv4, IPv6 and
dual-stack. Each change of a Service or its EndpointSlices is one kernel
transaction on that Service's farms only. Annotations under xlb.io/ (and
kube-nftlb's service.kubernetes.io/kube-nftlb-load-balancer-*) set mode,
scheduler, persistence, helper, log and limits; an invalid or refused one
becomes an Event on the Service, which is served with the defaults and
always follows its endpoints. See docs/kube-proxy.md.

Farms are named <namespace>.<service>.<port>.<kind>-<address> and live in
their own nftables tables (--nft-table), apart from "xlb daemon"'s. With
--dataplane ebpf they are programmed into xlb's eBPF program instead,
attached at tcx ingress of --interfaces, with its maps pinned under
--pin-path. It balances what arrives on those interfaces (not what the
node itself sends), and Service features it does not implement (SCTP, the
helper and est-connlimit annotations) fall back to the defaults, or leave
that port out, with an Event (see docs/kube-proxy.md). The state
is saved in --state-dir, so a restart keeps the rules in place until the
first sync replaces them.

Serves /healthz on --healthz-bind-address and Prometheus /metrics (and
/healthz) on --metrics-bind-address. Uses the in-cluster configuration when
--kubeconfig is not given.`,
		Example: `  xlb kube-proxy --kubeconfig /etc/kubernetes/proxy.conf --hostname-override node1
  xlb kube-proxy --hostname-override "$NODE_NAME" --nodeport-addresses 192.168.0.0/16
  xlb kube-proxy --hostname-override "$NODE_NAME" --dataplane ebpf --interfaces eth0,cni0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.runKubeProxy(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster configuration)")
	f.StringVar(&o.hostname, "hostname-override", "", "this node's name (default: $NODE_NAME, else the host name)")
	o.dp.Register(f, kubeProxyDefaults)
	f.StringVar(&o.stateDir, "state-dir", defaultStateDir+"/kube-proxy", "directory of the saved state")
	f.StringSliceVar(&o.nodePortAddresses, "nodeport-addresses", nil, "serve NodePorts only on node addresses inside these CIDRs (default: every InternalIP and ExternalIP of the Node)")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address:port of /metrics and /healthz (empty: off)")
	f.StringVar(&o.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address:port of /healthz (empty: off)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringSliceVar(&o.apiEndpoints, "apiserver-endpoints", nil, "the API server's real address:port(s): program the kubernetes Service's cluster IP to them before the first sync, so a fresh node's in-cluster configuration can reach the API server")
	cmd.PreRunE = func(*cobra.Command, []string) error { return o.dp.Check() }
	return cmd
}

func (a *app) runKubeProxy(ctx context.Context, o kubeProxyOptions) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: allowed values are debug, info, warn, error", o.logLevel)
	}
	log := slog.New(slog.NewTextHandler(a.errOut, &slog.HandlerOptions{Level: level}))
	node := o.hostname
	if node == "" {
		node = a.getenv("NODE_NAME")
	}
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --hostname-override and no host name: %w", err)
		}
		node = strings.ToLower(h)
	}
	var within []netip.Prefix
	for _, s := range o.nodePortAddresses {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--nodeport-addresses %q: must be CIDRs such as 192.168.0.0/16 or 2001:db8::/64", s)
		}
		within = append(within, p.Masked())
	}
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			err = errors.New("not running in a cluster: give --kubeconfig")
		}
	}
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	cfg.UserAgent = "xlb-kube-proxy"
	var apiEndpoints []netip.AddrPort
	for _, s := range o.apiEndpoints {
		if strings.TrimSpace(s) == "" {
			continue // an empty value from the manifest's ConfigMap
		}
		ep, err := netip.ParseAddrPort(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--apiserver-endpoints %q: must be address:port, e.g. 192.168.0.10:6443 or [2001:db8::10]:6443", s)
		}
		apiEndpoints = append(apiEndpoints, ep)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	bolt, err := store.OpenBolt(o.stateDir)
	if err != nil {
		return err
	}
	// Saved behind the kernel: the API server is the source of truth, the
	// saved state only bridges restarts (see store.WriteBehind).
	st := store.NewWriteBehind(bolt, log)
	defer st.Close()
	dp, err := setup.Open(ctx, log, o.dp)
	if err != nil {
		return fmt.Errorf("open %s data plane: %w", o.dp.Plane, err)
	}
	defer dp.Close() // leaves the kernel's rules (and pinned eBPF maps) in place
	eng, err := engine.New(ctx, log, dp, st)
	if err != nil {
		return err
	}

	// A fresh node: the client may reach the API server only through the
	// kubernetes Service's cluster IP, which nothing serves yet.
	apiSvc, viaIP := kube.APIServiceAddr(cfg.Host)
	if viaIP && len(apiEndpoints) > 0 {
		if err := kube.BootstrapAPIFarm(ctx, eng, apiSvc, apiEndpoints); err != nil {
			return err
		}
		log.Info("kubernetes Service programmed before the first sync", "service", apiSvc.String(), "endpoints", fmt.Sprint(apiEndpoints))
	}
	waitHint := ""
	inCluster := viaIP && a.getenv("KUBERNETES_SERVICE_HOST") == apiSvc.Addr().String()
	if _, served := eng.Snapshot().Farm(kube.FarmName("default", "kubernetes", "https", kube.KindCluster, apiSvc.Addr())); inCluster && !served {
		waitHint = kube.FreshNodeHint(apiSvc)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	kc := kube.Config{
		Client: client, Engine: eng, Log: log, NodeName: node,
		NodePortAddresses: within, Metrics: kube.NewMetrics(reg),
		APIHost: cfg.Host, WaitHint: waitHint,
	}
	// Stale UDP flows of removed endpoints are deleted from netfilter's
	// conntrack (nft) or from the ebpf plane's own table.
	if ff, ok := dp.(dataplane.FlowFlusher); ok {
		kc.Flows = ff
	}
	ctl, err := kube.New(kc)
	if err != nil {
		return err
	}

	healthz := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok, why := ctl.Healthy(60 * time.Second)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
	var servers []*http.Server
	serve := func(addr string, mux *http.ServeMux) error {
		if addr == "" {
			return nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", addr, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		servers = append(servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "addr", addr, "err", err)
			}
		}()
		log.Info("serving", "addr", ln.Addr().String())
		return nil
	}
	mm := http.NewServeMux()
	mm.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mm.Handle("/healthz", healthz)
	hm := http.NewServeMux()
	hm.Handle("/healthz", healthz)
	if err := serve(o.metricsAddr, mm); err != nil {
		return err
	}
	if o.healthzAddr != o.metricsAddr {
		if err := serve(o.healthzAddr, hm); err != nil {
			return err
		}
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(sctx)
		}
	}()
	log.Info("xlb kube-proxy starting", "node", node, "dataplane", dp.Name(), "state_dir", o.stateDir, "api", cfg.Host)
	err = ctl.Run(ctx)
	log.Info("xlb kube-proxy stopping; kernel rules stay in place")
	return err
}
