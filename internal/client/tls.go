package client

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
)

// TLSOptions say how the client reaches a daemon whose API is served
// over TLS (https:// addresses).
type TLSOptions struct {
	CAFile   string // PEM certificates the daemon's certificate must chain to; "": the system's
	CertFile string // client certificate and key, for a daemon that asks for one (mutual TLS)
	KeyFile  string
}

// HTTPClient returns an HTTP client for o, or nil (the default client)
// when o is empty.
func (o TLSOptions) HTTPClient() (*http.Client, error) {
	if o == (TLSOptions{}) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate in it", o.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, fmt.Errorf("a client certificate needs its key, and a key its certificate")
	}
	if o.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s, key %s: %w", o.CertFile, o.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}, nil
}
