package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
)

// The API off loopback: TLS (--tls-cert/--tls-key, mutual with
// --tls-client-ca), and a key that is long enough and kept private. On
// loopback and the Unix socket (mode 0600) none of it is required.

// minKeyLen is the shortest API key a daemon listening beyond loopback
// takes: 16 bytes, 128 bits if random.
const minKeyLen = 16

// tlsOptions are the daemon's TLS flags.
type tlsOptions struct {
	cert, key, clientCA string
	allowWeakKey        bool // --allow-weak-key: warn instead of refusing
}

// listensBeyondLoopback reports whether the API address is reachable from
// other hosts: any address but a loopback one ("" and 0.0.0.0 are every
// interface).
func listensBeyondLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err != nil || !a.IsLoopback()
}

// checkKeyExposure refuses, on an API that listens beyond loopback, a key
// shorter than minKeyLen bytes or kept in a file that others may read
// (keyPath: "" when the key came from XLB_KEY). With --allow-weak-key it
// logs the same at ERROR level and goes on.
func checkKeyExposure(log *slog.Logger, listen, key, keyPath string, o tlsOptions) error {
	if !listensBeyondLoopback(listen) {
		return nil
	}
	var problems []string
	if len(key) < minKeyLen {
		problems = append(problems, fmt.Sprintf("the API key is %d bytes; at least %d are required", len(key), minKeyLen))
	}
	if keyPath != "" {
		if fi, err := os.Stat(keyPath); err == nil && fi.Mode().Perm()&0o077 != 0 {
			problems = append(problems, fmt.Sprintf("the key file %s has mode %04o: others may read it (chmod 600 %s)", keyPath, fi.Mode().Perm(), keyPath))
		}
	}
	if len(problems) == 0 {
		if o.cert == "" {
			log.Warn("the API listens beyond loopback without TLS: the key and every request travel in clear text; set --tls-cert and --tls-key", "listen", listen)
		}
		return nil
	}
	msg := strings.Join(problems, "; ")
	if o.allowWeakKey {
		log.Error("INSECURE: the API listens beyond loopback with a weak key (--allow-weak-key)", "listen", listen, "problems", msg)
		return nil
	}
	return fmt.Errorf("--listen %s is beyond loopback and %s (or pass --allow-weak-key to only warn)", listen, msg)
}

// serverTLS builds the API's TLS configuration from the flags; nil when
// TLS is off.
func serverTLS(o tlsOptions) (*tls.Config, error) {
	switch {
	case o.cert == "" && o.key == "" && o.clientCA == "":
		return nil, nil
	case o.cert == "" || o.key == "":
		return nil, fmt.Errorf("--tls-cert and --tls-key go together (--tls-client-ca needs both)")
	}
	pair, err := tls.LoadX509KeyPair(o.cert, o.key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", o.cert, o.key, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if o.clientCA != "" {
		pem, err := os.ReadFile(o.clientCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-client-ca %s: no PEM certificate in it", o.clientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
