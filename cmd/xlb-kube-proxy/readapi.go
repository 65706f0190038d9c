package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strings"

	"github.com/xlb-lb/xlb/internal/api"
	"github.com/xlb-lb/xlb/internal/engine"
)

// The proxy's read-only xlb API (--api-listen): the read routes of
// internal/api over the proxy's engine, so `xlb list`, `xlb list --stats`
// and `xlb dump` work against the proxy as against `xlb daemon`. Writes
// answer 405: the proxy's farms follow the API server's objects, and a
// change made here would be undone by the next sync. It listens on
// loopback only (there is no TLS here, unlike the daemon's API) and needs
// a key, as the daemon's.

// readOnlyReason is the 405 answer's explanation.
const readOnlyReason = "xlb kube-proxy's farms follow the Kubernetes API server's Services and EndpointSlices; change those"

// checkAPIListen validates --api-listen: a loopback address:port.
func checkAPIListen(listen, keyFile string) error {
	if listen == "" {
		if keyFile != "" {
			return fmt.Errorf("--api-key-file %s: needs --api-listen", keyFile)
		}
		return nil
	}
	ap, err := netip.ParseAddrPort(listen)
	if err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("--api-listen %q: must be a loopback address:port such as 127.0.0.1:5556 (the proxy's API has no TLS)", listen)
	}
	return nil
}

// readAPI returns the read-only API handler, its key from keyFile, else
// envKey (XLB_KEY).
func readAPI(log *slog.Logger, eng *engine.Engine, keyFile, envKey string) (http.Handler, error) {
	key := strings.TrimSpace(envKey)
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("--api-key-file: %w", err)
		}
		key = strings.TrimSpace(string(b))
	}
	if key == "" {
		return nil, fmt.Errorf("--api-listen needs a key: --api-key-file or XLB_KEY")
	}
	return api.New(log.With("component", "api"), eng, key, api.Options{ReadOnly: true, ReadOnlyReason: readOnlyReason}), nil
}
