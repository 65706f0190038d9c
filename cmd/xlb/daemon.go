package main

import (
	"context"
	"crypto/rand"
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
	"github.com/xlb-lb/xlb/internal/engine"
	"github.com/xlb-lb/xlb/internal/store"
)

type daemonOptions struct {
	listen    string
	stateDir  string
	dataplane string
	logLevel  string
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

The API key comes from --key-file, else XLB_KEY; with neither, a random key is
generated into <state-dir>/` + keyFileName + ` (mode 0600) and reused on later starts.`,
		Example: `  xlb daemon
  xlb daemon --state-dir /var/lib/xlb --listen 127.0.0.1:5555 --log-level debug
  XLB_KEY=s3cret xlb daemon --listen 10.0.0.1:5555`,
		Args: args(),
		RunE: func(cmd *cobra.Command, argv []string) error {
			keyFile := ""
			if cmd.Flags().Changed("key-file") {
				keyFile = a.keyFile
			}
			return a.runDaemon(cmd.Context(), o, keyFile)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", defaultListen, "address:port the API listens on")
	f.StringVar(&o.stateDir, "state-dir", defaultStateDir, "directory of the saved state (and the generated API key)")
	f.StringVar(&o.dataplane, "dataplane", "nft", "kernel data plane: "+dataplaneNames)
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

func (a *app) runDaemon(ctx context.Context, o daemonOptions, keyFile string) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: allowed values are debug, info, warn, error", o.logLevel)
	}
	log := slog.New(slog.NewTextHandler(a.errOut, &slog.HandlerOptions{Level: level}))

	st, err := store.OpenBolt(o.stateDir)
	if err != nil {
		return err
	}
	defer st.Close()
	// The key is set up after the store is open: its lock keeps two daemons
	// from generating two keys in one state directory.
	key, err := daemonKey(log, keyFile, a.getenv("XLB_KEY"), o.stateDir)
	if err != nil {
		return err
	}
	dp, err := a.openDataplane(ctx, log, o.dataplane)
	if err != nil {
		return fmt.Errorf("open %s data plane: %w", o.dataplane, err)
	}
	defer dp.Close() // leaves the kernel's rules in place
	eng, err := engine.New(ctx, log, dp, st)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen for the API: %w", err)
	}
	srv := &http.Server{
		Handler:           api.New(log, eng, key),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("xlb daemon serving", "addr", ln.Addr().String(), "state_dir", o.stateDir, "dataplane", dp.Name(), "version", api.Version())
	if a.daemonReady != nil {
		a.daemonReady(ln.Addr())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve the API: %w", err)
	case <-ctx.Done():
	}
	log.Info("xlb daemon stopping; kernel rules stay in place")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("API shutdown", "err", err)
	}
	return nil
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
