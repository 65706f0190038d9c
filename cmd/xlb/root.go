package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xlb-lb/xlb/internal/client"
	"github.com/xlb-lb/xlb/internal/dataplane"
	"github.com/xlb-lb/xlb/internal/setup"
)

// Defaults shared by the daemon and the client commands.
const (
	defaultAPI      = "http://127.0.0.1:5555"
	defaultListen   = "127.0.0.1:5555"
	defaultStateDir = "/var/lib/xlb"
	keyFileName     = "api.key"
	socketFileName  = "api.sock"
)

// app is one invocation of the command: its streams, environment and global
// flags. Nothing lives in package variables.
type app struct {
	in            io.Reader
	out, errOut   io.Writer
	getenv        func(string) string
	httpClient    *http.Client // nil: http.DefaultClient
	openDataplane func(ctx context.Context, log *slog.Logger, c setup.Flags) (dataplane.Dataplane, error)
	// removeOtherPlane and cleanup act on the current namespace's kernel
	// (setup.RemoveOtherPlane, setup.Cleanup); nil: skipped (tests whose
	// planes live in namespaces of their own).
	removeOtherPlane func(ctx context.Context, log *slog.Logger, c setup.Flags) error
	cleanup          func(ctx context.Context, c setup.Flags) (removed, left []string, err error)
	daemonReady      func(addr net.Addr) // tests: called once the daemon's API serves

	apiURL  string
	key     string
	keyFile string
	tls     client.TLSOptions
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "xlb",
		Short: "xlb: a layer-4 load balancer for Linux (nftlb's API, ipvsadm's habits)",
		Long: `xlb balances TCP, UDP and SCTP with the Linux kernel. "xlb daemon" runs it and
serves nftlb's REST API; every other command talks to the daemon through that API.

The API address comes from --api or XLB_API (http://HOST:PORT, or unix:PATH for
the daemon's Unix socket, https://HOST:PORT for a daemon with --tls-cert, see
--ca-file, --client-cert, --client-key); by default the socket ` + defaultStateDir + `/` + socketFileName + ` if it
exists, else ` + defaultAPI + `. The
key from --key, --key-file, XLB_KEY, XLB_KEY_FILE, or ` + defaultStateDir + `/` + keyFileName + ` if readable.`,
		Example: `  xlb daemon --state-dir /var/lib/xlb
  xlb farm add web --vip 192.0.2.10 --ports 80,443 --proto tcp --mode snat --sched rr
  xlb backend add web be1 --ip 10.200.0.11 --port 8080
  xlb list -n
  xlb save -f state.json && xlb restore -f state.json`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetIn(a.in)
	root.SetOut(a.out)
	root.SetErr(a.errOut)
	pf := root.PersistentFlags()
	pf.StringVar(&a.apiURL, "api", defaultAPI, "daemon API: http://HOST:PORT or unix:PATH (env XLB_API; default "+defaultStateDir+"/"+socketFileName+" if it exists)")
	pf.StringVar(&a.key, "key", "", "API key (env XLB_KEY)")
	pf.StringVar(&a.keyFile, "key-file", "", "file holding the API key (env XLB_KEY_FILE; default "+defaultStateDir+"/"+keyFileName+" if readable)")
	pf.StringVar(&a.tls.CAFile, "ca-file", "", "https API: PEM CA certificates to verify the daemon with (env XLB_CA_FILE; default the system's)")
	pf.StringVar(&a.tls.CertFile, "client-cert", "", "https API: PEM client certificate, for a daemon with --tls-client-ca (env XLB_CLIENT_CERT)")
	pf.StringVar(&a.tls.KeyFile, "client-key", "", "https API: PEM key of --client-cert (env XLB_CLIENT_KEY)")
	root.AddCommand(a.daemonCmd(), a.farmCmd(), a.backendCmd(), a.listCmd(), a.dumpCmd(), a.saveCmd(), a.restoreCmd(), a.problemsCmd(), a.reconcileCmd(), a.kubeProxyCmd(), a.tableCmd(), a.eventsCmd(), a.connectionsCmd(), a.bgpCmd(), a.syncCmd(), a.diffCmd(), a.importCmd())
	return root
}

// client returns an API client from the global flags and environment.
func (a *app) client(cmd *cobra.Command) (*client.Client, error) {
	base := a.apiURL
	if !cmd.Flags().Changed("api") {
		if v := a.getenv("XLB_API"); v != "" {
			base = v
		} else if sock := defaultStateDir + "/" + socketFileName; fileIsSocket(sock) {
			base = "unix:" + sock
		}
	}
	if !strings.Contains(base, "://") && !strings.HasPrefix(base, "unix:") {
		base = "http://" + base
	}
	key, err := a.clientKey(cmd)
	if err != nil {
		return nil, err
	}
	hc := a.httpClient
	o := a.tls
	for _, x := range []struct {
		flag, env string
		v         *string
	}{{"ca-file", "XLB_CA_FILE", &o.CAFile}, {"client-cert", "XLB_CLIENT_CERT", &o.CertFile}, {"client-key", "XLB_CLIENT_KEY", &o.KeyFile}} {
		if !cmd.Flags().Changed(x.flag) {
			*x.v = a.getenv(x.env)
		}
	}
	if hc == nil {
		if hc, err = o.HTTPClient(); err != nil {
			return nil, err
		}
	}
	return client.New(base, key, hc), nil
}

// clientKey: --key, then --key-file, then XLB_KEY, XLB_KEY_FILE, then the
// daemon's default key file.
func (a *app) clientKey(cmd *cobra.Command) (string, error) {
	if cmd.Flags().Changed("key") {
		return a.key, nil
	}
	if cmd.Flags().Changed("key-file") {
		return readKeyFile(a.keyFile)
	}
	if v := a.getenv("XLB_KEY"); v != "" {
		return v, nil
	}
	if v := a.getenv("XLB_KEY_FILE"); v != "" {
		return readKeyFile(v)
	}
	def := defaultStateDir + "/" + keyFileName
	if key, err := readKeyFile(def); err == nil {
		return key, nil
	}
	return "", fmt.Errorf("no API key: give --key or --key-file, or set XLB_KEY or XLB_KEY_FILE (the daemon writes a generated key to <state-dir>/%s; %s is not readable)", keyFileName, def)
}

func fileIsSocket(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().Type() == os.ModeSocket
}

func readKeyFile(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read API key: %w", err)
	}
	key := strings.TrimSpace(string(raw))
	if key == "" {
		return "", fmt.Errorf("read API key: %s is empty", path)
	}
	return key, nil
}

// args checks the positional arguments, naming the ones missing.
func args(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, got []string) error {
		if len(got) == len(names) {
			return nil
		}
		if len(got) < len(names) {
			return fmt.Errorf("%s needs %s (see %s --help)", cmd.CommandPath(), strings.Join(names[len(got):], " "), cmd.CommandPath())
		}
		return fmt.Errorf("%s: unexpected argument %q (see %s --help)", cmd.CommandPath(), got[len(names)], cmd.CommandPath())
	}
}
