package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/dataplane/nft"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/health"
	"github.com/xlb-lb/xlb/internal/ifaddr"
	"github.com/xlb-lb/xlb/internal/kube"
	"github.com/xlb-lb/xlb/internal/observe"
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
	apiListen         string // read-only xlb API (readapi.go)
	apiKeyFile        string
	kp                kpOptions // kube-proxy's own flags and --config (kpflags.go)
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
			level, err := o.kp.logLevel(cmd.Flags(), o.logLevel)
			if err != nil {
				return err
			}
			return a.runKubeProxy(cmd.Context(), o, level)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster configuration)")
	f.StringVar(&o.hostname, "hostname-override", "", "this node's name (default: $NODE_NAME, else the host name)")
	o.dp.Register(f, kubeProxyDefaults)
	f.StringVar(&o.stateDir, "state-dir", defaultStateDir+"/kube-proxy", "directory of the saved state")
	f.StringSliceVar(&o.nodePortAddresses, "nodeport-addresses", nil, "serve NodePorts only on the node's interface addresses inside these CIDRs, and the keywords primary (the Node's first InternalIP of each family), localhost, all, as kube-proxy (default: every InternalIP and ExternalIP of the Node)")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address:port of /metrics and /healthz (empty: off)")
	f.StringVar(&o.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address:port of /healthz (empty: off)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringSliceVar(&o.apiEndpoints, "apiserver-endpoints", nil, "the API server's real address:port(s): program the kubernetes Service's cluster IP to them before the first sync, so a fresh node's in-cluster configuration can reach the API server")
	f.StringVar(&o.apiListen, "api-listen", "", "loopback address:port of a read-only xlb API (xlb list, xlb dump, xlb list --stats against the proxy; empty: off)")
	f.StringVar(&o.apiKeyFile, "api-key-file", "", "file holding the key of --api-listen (default: $XLB_KEY)")
	o.kp.register(f)
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkAPIListen(o.apiListen, o.apiKeyFile); err != nil {
			return err
		}
		if err := o.kp.resolve(cmd.Flags(), &o); err != nil {
			return err
		}
		if err := o.dp.Check(); err != nil {
			return err
		}
		if o.kp.conntrackSized(cmd.Flags()) {
			o.dp.ConnTableSet = true
		}
		return nil
	}
	return cmd
}

func (a *app) runKubeProxy(ctx context.Context, o kubeProxyOptions, level slog.Level) error {
	kps := o.kp.settings
	var handler slog.Handler = slog.NewTextHandler(a.errOut, &slog.HandlerOptions{Level: level})
	if kps.LogFormat == "json" {
		handler = slog.NewJSONHandler(a.errOut, &slog.HandlerOptions{Level: level})
	}
	log := slog.New(handler)
	if o.kp.cleanup {
		// kube-proxy --cleanup: remove what the flags name and exit,
		// without the API server.
		return a.runCleanup(ctx, o)
	}
	for _, n := range kps.Notes {
		log.Info("kube-proxy setting accepted without effect", "setting", n)
	}
	if kps.OOMScoreAdj != nil {
		if err := setOOMScoreAdj(*kps.OOMScoreAdj); err != nil {
			return err
		}
	}
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
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" || o.kp.master != "" {
		cfg, err = clientcmd.BuildConfigFromFlags(o.kp.master, o.kubeconfig)
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
	if kps.QPS > 0 {
		cfg.QPS = kps.QPS
	}
	if kps.Burst > 0 {
		cfg.Burst = int(kps.Burst)
	}
	if kps.ContentType != "" {
		cfg.ContentType = kps.ContentType
	}
	if kps.AcceptContentTypes != "" {
		cfg.AcceptContentTypes = kps.AcceptContentTypes
	}
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
	// kube-proxy filters the node's own connections to a load balancer
	// IP by loadBalancerSourceRanges too.
	o.dp.PoliciesOnOutput = true
	dp, err := setup.Open(ctx, log, o.dp)
	if err != nil {
		return fmt.Errorf("open %s data plane: %w", o.dp.Plane, err)
	}
	if o.dp.Plane == "nft" {
		ct := kps.Conntrack
		err := nft.SetConntrackTimeouts(netns.None(), nft.ConntrackTimeouts{TCPEstablished: ct.TCPEstablished,
			TCPCloseWait: ct.TCPCloseWait, UDP: ct.UDP, UDPStream: ct.UDPStream, TCPBeLiberal: ct.TCPBeLiberal})
		if err != nil {
			dp.Close()
			return fmt.Errorf("conntrack settings: %w", err)
		}
		// NodePorts on 127.0.0.1: route_localnet, and its guard
		// (the ebpf plane balances the node's sockets at connect
		// time, which needs neither).
		if kube.LocalhostNodePorts(kps.NodePortAddresses.CIDRs) {
			if err := nft.EnableLocalhostNodePorts(netns.None(), o.dp.NFTTable); err != nil {
				dp.Close()
				return err
			}
		}
	}
	defer dp.Close() // leaves the kernel's rules (and pinned eBPF maps) in place
	eng, err := engine.New(ctx, log, dp, st)
	if err != nil {
		return err
	}
	// Every farm is in this plane now: the other's leftovers go.
	if a.removeOtherPlane != nil {
		if err := a.removeOtherPlane(ctx, log, o.dp); err != nil {
			log.Error("could not remove the other data plane's objects; remove them with --cleanup once the proxy is stopped", "err", err)
		}
	}
	// Changes to the proxy's kernel objects by other programs are
	// repaired within a second (as the daemon does).
	if _, err := eng.WatchDrift(ctx); err != nil {
		log.Error("no drift watch: changes to the proxy's kernel objects by other programs are repaired at the next full sync or restart", "err", err)
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
	// The daemon's metrics (xlb_farm_*, xlb_backend_*, xlb_engine_*, ...)
	// next to the proxy's own (xlb_kubeproxy_*), in one registry.
	obs := observe.New(observe.Options{Engine: eng, Log: log.With("component", "metrics"), Registry: reg,
		NoRuntime: true, Version: api.Version(), Dataplane: dp.Name()})
	eng.SetObserver(obs)
	kc := kube.Config{
		Client: client, Engine: eng, Log: log, NodeName: node,
		NodePortAddresses: kps.NodePortAddresses.CIDRs, NodePortPrimary: kps.NodePortAddresses.Primary,
		MasqueradeAll: kps.MasqueradeAll, ClusterCIDRs: kps.ClusterCIDRs, Metrics: kube.NewMetrics(reg),
		APIHost: cfg.Host, WaitHint: waitHint,
		// CIDRs in --nodeport-addresses filter the interfaces' addresses
		// (of this namespace, the data plane's), as kube-proxy's do.
		InterfaceAddrs: ifaddr.New(netns.None()),
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
	// Checks a Service's xlb.io/check annotation adds (next to readiness,
	// which the endpoints carry already).
	checks := health.Start(ctx, log, eng, dp, health.Options{Observe: obs.ObserveCheck})
	defer checks.Stop()

	// kube-proxy's /healthz and /livez, with its JSON bodies.
	health := kube.NewProxyHealth(ctl, 60*time.Second, reg)
	var servers []*http.Server
	serve := func(addr string, mux http.Handler) error {
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
	mm.Handle("/metrics", obs)
	mm.Handle("/healthz", health.Healthz())
	mm.Handle("/livez", health.Livez())
	if kps.Profiling {
		mm.HandleFunc("/debug/pprof/", pprof.Index)
		mm.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mm.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mm.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	hm := http.NewServeMux()
	hm.Handle("/healthz", health.Healthz())
	hm.Handle("/livez", health.Livez())
	if err := serve(o.metricsAddr, mm); err != nil {
		return err
	}
	if o.healthzAddr != o.metricsAddr {
		if err := serve(o.healthzAddr, hm); err != nil {
			return err
		}
	}
	if o.apiListen != "" {
		h, err := readAPI(log, eng, o.apiKeyFile, a.getenv("XLB_KEY"))
		if err != nil {
			return err
		}
		if err := serve(o.apiListen, h); err != nil {
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
