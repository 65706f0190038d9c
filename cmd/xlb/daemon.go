package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/cluster/bgp"
	"github.com/xlb-lb/xlb/internal/cluster/connsync"
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/health"
	"github.com/xlb-lb/xlb/internal/setup"
	"github.com/xlb-lb/xlb/internal/store"
)

type daemonOptions struct {
	listen   string
	socket   string // "" = <state-dir>/api.sock, "none" = no socket
	stateDir string
	dp       setup.Flags
	logLevel string
	// bgpConfig is the BGP speaker's configuration file ("": no speaker).
	bgpConfig string
	sync      syncOptions // cluster.go
	tls       tlsOptions  // exposure.go
	// forceEmpty: start with an empty saved state even if the kernel
	// holds farms (guard.go).
	forceEmpty bool
	// metricsListen: address of /metrics without a key ("" = none).
	metricsListen string
	// cleanup: remove xlb's kernel objects and exit (cleanup.go).
	cleanup bool
	// driftWatch: watch the kernel for changes by others (drift.go).
	driftWatch bool
	// kube: the configuration comes from custom resources (kubecrd.go).
	kube kubeCRDOptions
}

func (a *app) daemonCmd() *cobra.Command {
	var o daemonOptions
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "Run the xlb daemon: program the kernel and serve the REST API",
		Long: `Run xlb: load the saved state from --state-dir, reconcile the kernel with it
(without flushing: traffic keeps flowing across restarts), and serve the REST
API on --listen until SIGINT or SIGTERM. Stopping leaves the kernel's rules in
place.

The API is also served on a Unix socket, --socket (default
<state-dir>/` + socketFileName + `, mode 0600; "none" turns it off). Client commands on
the same machine use it when it exists at the default state directory, so
local use needs no TCP port. The key is required on both.

--dataplane ebpf attaches xlb's eBPF program at tcx ingress of --interfaces
(default: every interface of the namespace but loopback) and pins its maps
and links under --pin-path (bpffs is mounted at /sys/fs/bpf if it is not): a
restarted or upgraded daemon adopts them, and tracked connections keep
flowing meanwhile. --conn-table-size (like IPVS's conn_tab_bits, fixed at
start-up; changing it drops tracked connections) sizes its conntrack table;
the --ct-timeout-* flags (like ipvsadm --set) apply to it only. --xdp
generic|native also attaches the XDP fast path for tracked dsr flows to the
same interfaces (native: for NICs with XDP drivers; list --interfaces then).
--bridge-port-redirect sends packets for backends behind a bridge of the
namespace (containers on a bridge such as docker0) straight into the
container's veth peer (bpf_redirect_peer), past the bridge's transmit and
its output hooks; see docs/dataplane-ebpf.md.

--dataplane nft relies on the kernel's conntrack: given --conn-table-size N it
sets net.netfilter.nf_conntrack_max to N and nf_conntrack_buckets to N
(rounded up to 512) at start-up, which the kernel allows only in the initial
network namespace (the values are global); elsewhere the daemon refuses to
start, naming the sysctl. Without the flag it leaves both alone. See
docs/dataplane-nft.md.

The API key comes from --key-file, else XLB_KEY; with neither, a random key is
generated into <state-dir>/` + keyFileName + ` (mode 0600) and reused on later starts.
A daemon whose saved state is empty (a new, lost or mistyped --state-dir)
while the kernel holds farms of xlb's refuses to start, naming them: starting
would delete them. --force-empty starts empty and deletes them. A state
directory with no room left opens read-only: the daemon serves reads and
keeps the kernel, and refuses every change (503) until space is freed and it
is restarted. A state directory removed while the daemon runs makes it refuse
every change (503).

While it runs, the daemon watches its kernel objects (nft: netlink events of
its tables; ebpf: a poll of links, pins and map entries) and repairs what
another program changes in them (nft flush ruleset, a rule or element
deleted, a program detached) within a second, logging each repair; a change
is acknowledged only on a kernel that holds the state. SIGHUP (or xlb
reconcile) reconciles on demand. At start, once its plane holds every farm,
it removes what the other plane left (the eBPF links and maps pinned under
--pin-path when on nft; the nft tables of --nft-table when on ebpf).
--cleanup removes everything xlb put in the kernel, both planes, and exits.

--kube-crd takes the farms, tables and checks from the Farm, Table and Check
custom resources (xlb.io/v1alpha1, deploy/crd/crds.yaml) that the API server of
--kubeconfig (default: in-cluster) serves, so every node watching them
programs the same configuration; each object's status says per node
(--kube-node-name) whether it is programmed, and why not. The API is read-only
then. This runs ` + kubeCRDDaemon + ` (xlb built with client-go), installed next
to xlb, in place of this process. See docs/ha.md.

When --listen is beyond loopback, a key shorter than 16 bytes, or a key file
others may read, is refused (--allow-weak-key: logged as an error instead).
--tls-cert and --tls-key serve the TCP API over TLS; --tls-client-ca also
requires a client certificate signed by that CA (mutual TLS). The Unix socket
stays plain (it is local, mode 0600). Failed authentications are limited per
client address (10 at once, then one a second; 429 beyond) and logged as one
summary line every 10 s. See docs/operations.md.`,
		Example: `  xlb daemon
  xlb daemon --state-dir /var/lib/xlb --listen 127.0.0.1:5555 --log-level debug
  XLB_KEY=s3cret xlb daemon --listen 10.0.0.1:5555
  xlb daemon --dataplane ebpf --interfaces eth0,eth1 --conn-table-size 1048576
  xlb daemon --dataplane ebpf --interfaces eth0,eth1 --xdp native
  xlb daemon --cleanup
  xlb daemon --kube-crd --kubeconfig /etc/xlb/kubeconfig --kube-node-name lb1 --bgp-config /etc/xlb/bgp.yaml
  xlb daemon --listen 10.0.0.1:5555 --tls-cert api.crt --tls-key api.key.pem --tls-client-ca clients.pem`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			keyFile := ""
			if cmd.Flags().Changed("key-file") {
				keyFile = a.keyFile
			}
			if err := o.dp.Check(); err != nil {
				return err
			}
			if o.cleanup {
				return a.runCleanup(cmd.Context(), o)
			}
			if o.kube.enabled && kubeCRD() == nil {
				return execKubeCRDDaemon()
			}
			return a.runDaemon(cmd.Context(), o, keyFile)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", defaultListen, "address:port the API listens on")
	f.StringVar(&o.socket, "socket", "", `Unix socket the API is also served on (default <state-dir>/`+socketFileName+`; "none": no socket)`)
	f.StringVar(&o.stateDir, "state-dir", defaultStateDir, "directory of the saved state (and the generated API key)")
	o.dp.Register(f, setup.DaemonDefaults)
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.sync.listen, "sync-listen", "", "connection sync: this node's address:port that its peers connect to (docs/ha.md)")
	f.StringSliceVar(&o.sync.peers, "sync-peers", nil, "connection sync: the other nodes' --sync-listen addresses")
	f.StringVar(&o.sync.keyFile, "sync-key-file", "", "connection sync: file holding the secret (16 bytes or more) every node shares; frames are HMAC-SHA256'd with it")
	f.DurationVar(&o.sync.wait, "sync-wait", 10*time.Second, "connection sync: longest wait for the peers' state before the VIPs are announced")
	f.StringVar(&o.bgpConfig, "bgp-config", "", "announce the VIPs over BGP with the router id, AS, peers and attributes of this YAML file (docs/ha.md)")
	f.BoolVar(&o.cleanup, "cleanup", false, "remove everything xlb put in this namespace's kernel (both data planes: the nft tables of --nft-table, any layout, and its named tables' table; the links and maps pinned under --pin-path) and exit; the saved state is kept")
	f.BoolVar(&o.driftWatch, "drift-watch", true, "watch xlb's kernel objects and repair what other programs change in them within a second (nft: the kernel then builds an event per object of every change, +0.25 ms on a change, +28 % on a bulk one; false: repaired only by xlb reconcile, SIGHUP or a restart)")
	f.BoolVar(&o.forceEmpty, "force-empty", false, "start even if the saved state is empty while the kernel holds farms of xlb's, and delete them (by default the daemon refuses: a lost --state-dir must not wipe the kernel)")
	f.StringVar(&o.tls.cert, "tls-cert", "", "PEM certificate (chain) of the API over TLS; with --tls-key")
	f.StringVar(&o.tls.key, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&o.tls.clientCA, "tls-client-ca", "", "PEM CA certificates: require a client certificate signed by one (mutual TLS)")
	f.BoolVar(&o.tls.allowWeakKey, "allow-weak-key", false, "beyond loopback, log a key shorter than 16 bytes or readable by others as an error instead of refusing to start")
	o.kube.register(f)
	f.StringVar(&o.metricsListen, "metrics-listen", "", `address:port serving Prometheus /metrics without the API key (e.g. 127.0.0.1:9555; "": none; GET /metrics on the API needs the key)`)
	return cmd
}

func (a *app) runDaemon(ctx context.Context, o daemonOptions, keyFile string) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: allowed values are debug, info, warn, error", o.logLevel)
	}
	log := slog.New(slog.NewTextHandler(a.errOut, &slog.HandlerOptions{Level: level}))
	var bgpCfg *bgp.Config
	if o.bgpConfig != "" {
		c, err := bgp.LoadConfig(o.bgpConfig)
		if err != nil {
			return fmt.Errorf("--bgp-config: %w", err)
		}
		bgpCfg = c
	}
	syncCfg, err := o.sync.config()
	if err != nil {
		return err
	}

	_, statErr := os.Stat(o.stateDir)
	st, err := store.OpenJournal(o.stateDir)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.ReadOnly(); err != nil {
		log.Error("the state directory is full: serving read-only, every change is refused until space is freed and the daemon restarted", "state_dir", o.stateDir, "err", err)
	}
	// The key is set up after the store is open: its lock keeps two daemons
	// from generating two keys in one state directory.
	key, err := daemonKey(log, keyFile, a.getenv("XLB_KEY"), o.stateDir)
	if err != nil {
		return err
	}
	keyPath := keyFile
	if keyPath == "" && strings.TrimSpace(a.getenv("XLB_KEY")) == "" {
		keyPath = filepath.Join(o.stateDir, keyFileName)
	}
	if err := checkKeyExposure(log, o.listen, key, keyPath, o.tls); err != nil {
		return err
	}
	tlsConfig, err := serverTLS(o.tls)
	if err != nil {
		return err
	}
	dp, err := a.openDataplane(ctx, log, o.dp)
	if err != nil {
		return fmt.Errorf("open %s data plane: %w", o.dp.Plane, err)
	}
	defer dp.Close() // leaves the kernel's rules in place
	if err := guardEmptyState(ctx, log, dp, st, o.stateDir, statErr == nil, o.forceEmpty); err != nil {
		return err
	}
	eng, err := engine.New(ctx, log, dp, st)
	if err != nil {
		return err
	}
	metrics, osrv, stopObserve, err := startObserve(ctx, log, eng, dp, st, o.metricsListen)
	if err != nil {
		return err
	}
	defer stopObserve()
	// Every farm is in this plane now: the other's leftovers go.
	if a.removeOtherPlane != nil {
		if err := a.removeOtherPlane(ctx, log, o.dp); err != nil {
			log.Error("could not remove the other data plane's objects; remove them with xlb daemon --cleanup once this daemon is stopped", "err", err)
		}
	}
	watchDrift(ctx, log, eng, o.driftWatch)
	hsrv, mon, stopHealth := startHealth(ctx, log, eng, dp, health.Options{Observe: metrics.ObserveCheck})
	defer stopHealth()
	metrics.SetChecks(mon)
	var apiOpts api.Options
	var crdGate bgp.Gate
	if o.kube.enabled {
		if crdGate, err = kubeCRD()(ctx, log, eng, o.kube); err != nil {
			return err
		}
		apiOpts = api.Options{ReadOnly: true, ReadOnlyReason: "this daemon takes its farms, tables and checks from Kubernetes custom resources (--kube-crd): change those"}
	}
	// The speaker starts once the engine has reconciled the kernel with
	// the saved state: every VIP it announces is in the kernel.
	var syncNode *connsync.Node
	var gate bgp.Gate
	if syncCfg.Listen.IsValid() {
		syncer, err := syncerFor(dp)
		if err != nil {
			return fmt.Errorf("connection sync: %w", err)
		}
		if syncNode, err = startSync(ctx, log, syncCfg, syncer, eng); err != nil {
			return fmt.Errorf("connection sync: %w", err)
		}
		gate = syncNode
	}
	var announcer *bgp.Announcer
	drained := func() {}
	if bgpCfg != nil {
		if announcer, drained, err = startBGP(ctx, log, bgpCfg, eng, mon, bgp.JoinGates(ctx, gate, crdGate)); err != nil {
			return err
		}
	}
	go eng.RunExpiry(ctx, time.Second) // table entries' timeouts
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen for the API: %w", err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	apiSrv := osrv(hsrv(api.New(log, eng, key, apiOpts)))
	if announcer != nil {
		apiSrv.SetBGP(announcer)
	}
	if syncNode != nil {
		apiSrv.SetSync(syncNode)
	}
	defer apiSrv.FlushLog()
	srv := &http.Server{
		Handler:           apiSrv,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	srv.RegisterOnShutdown(apiSrv.StopStreams)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	sock, err := listenSocket(log, o)
	if err != nil {
		ln.Close()
		return err
	}
	if sock != nil {
		go func() { errc <- srv.Serve(sock) }()
	}
	sockAt := ""
	if sock != nil {
		sockAt = sock.Addr().String()
	}
	log.Info("xlb daemon serving", "addr", ln.Addr().String(), "tls", tlsConfig != nil, "client_certs", o.tls.clientCA != "", "socket", sockAt, "state_dir", o.stateDir, "dataplane", dp.Name(), "version", api.Version())
	if a.daemonReady != nil {
		a.daemonReady(ln.Addr())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve the API: %w", err)
	case <-ctx.Done():
	}
	// Drain first: the routers stop sending new flows here (routes
	// withdrawn, drain-wait waited) before anything else stops.
	drained()
	log.Info("xlb daemon stopping; kernel rules stay in place")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("API shutdown", "err", err)
	}
	return nil
}

// socketPath is where the API's Unix socket lives ("" for none).
func socketPath(o daemonOptions) string {
	switch o.socket {
	case "":
		return filepath.Join(o.stateDir, socketFileName)
	case "none":
		return ""
	}
	return o.socket
}

// listenSocket opens the API's Unix socket, mode 0600 (the key is still
// required on it). A socket file left by a daemon that died is replaced:
// the state directory's lock, held by now, says no other daemon serves it.
func listenSocket(log *slog.Logger, o daemonOptions) (net.Listener, error) {
	path := socketPath(o)
	if path == "" {
		return nil, nil
	}
	// sun_path holds 107 bytes and a NUL.
	if len(path) > 107 {
		if o.socket == "" {
			log.Warn("no API socket: the state directory's path is too long for one (107 bytes at most); set --socket", "path", path)
			return nil, nil
		}
		return nil, fmt.Errorf("--socket %q: a Unix socket path has at most 107 bytes", path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("--socket %q: exists and is not a socket", path)
		}
		if o.socket != "" {
			// Only the default path is known to belong to this state
			// directory; a socket elsewhere may be another daemon's.
			if c, err := net.Dial("unix", path); err == nil {
				c.Close()
				return nil, fmt.Errorf("--socket %q: another process serves it", path)
			}
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen for the API on --socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--socket %q: %w", path, err)
	}
	return ln, nil
}

// daemonKey returns the API key: from keyFile, else envKey, else the key
// generated into <stateDir>/api.key (created with mode 0600 on first start).
// The key itself is never logged.
func daemonKey(log *slog.Logger, keyFile, envKey, stateDir string) (string, error) {
	if keyFile != "" {
		key, err := readKeyFile(keyFile)
		if err != nil {
			return "", err
		}
		log.Info("API key read", "path", keyFile)
		return key, nil
	}
	if envKey = strings.TrimSpace(envKey); envKey != "" {
		log.Info("API key from XLB_KEY")
		return envKey, nil
	}
	path := filepath.Join(stateDir, keyFileName)
	if key, err := readKeyFile(path); err == nil {
		log.Info("API key read", "path", path)
		return key, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("generate API key: %w", err)
	}
	key := hex.EncodeToString(raw[:])
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("write generated API key: %w", err)
	}
	_, err = f.WriteString(key + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("write generated API key: %w", err)
	}
	log.Info("API key generated", "path", path)
	return key, nil
}
