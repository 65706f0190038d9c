package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // its certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	file := filepath.Join(dir, name+".pem")
	os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	return &testCA{cert: cert, key: key, file: file}
}

// issue writes a certificate and key signed by ca: for 127.0.0.1 (server)
// or a client.
func (ca *testCA) issue(t *testing.T, dir, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

// The API over TLS, and with client certificates (mutual TLS); the CLI
// reaches it with --ca-file (and --client-cert/--client-key).
func TestDaemonTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	srvCert, srvKey := ca.issue(t, dir, "server", true)
	cliCert, cliKey := ca.issue(t, dir, "client", false)
	otherCA := newTestCA(t, dir, "other-ca")
	strangerCert, strangerKey := otherCA.issue(t, dir, "stranger", false)

	stateDir := t.TempDir()
	d, code, logs := startDaemonWith(t, nil, nil, "--state-dir", stateDir, "--tls-cert", srvCert, "--tls-key", srvKey)
	if d == nil {
		t.Fatalf("daemon exited %d: %s", code, logs)
	}
	keyEnv := map[string]string{"XLB_KEY_FILE": filepath.Join(stateDir, keyFileName)}
	with := func(extra ...string) map[string]string {
		env := map[string]string{}
		for k, v := range keyEnv {
			env[k] = v
		}
		for i := 0; i+1 < len(extra); i += 2 {
			env[extra[i]] = extra[i+1]
		}
		return env
	}
	https := "https://" + d.addr
	if r := runCLI(t, with("XLB_API", https, "XLB_CA_FILE", ca.file), "", "farm", "add", "web", "--vip", "10.0.0.1"); r.code != 0 {
		t.Fatalf("over TLS: %+v", r)
	}
	if r := runCLI(t, with("XLB_API", https), "", "farm", "list"); r.code != 1 || !strings.Contains(r.err, "certificate") {
		t.Fatalf("without the CA: %+v", r)
	}
	if r := runCLI(t, with("XLB_API", "http://"+d.addr), "", "farm", "list"); r.code != 1 {
		t.Fatalf("plain HTTP to the TLS port: %+v", r)
	}
	if r := runCLI(t, with(), "", "--api", https, "--ca-file", ca.file, "farm", "list"); r.code != 0 || r.out != "web\n" {
		t.Fatalf("--ca-file: %+v", r)
	}
	d.stop()

	// Mutual TLS: a client certificate of the CA is required.
	d, code, logs = startDaemonWith(t, nil, nil, "--state-dir", stateDir, "--tls-cert", srvCert, "--tls-key", srvKey, "--tls-client-ca", ca.file)
	if d == nil {
		t.Fatalf("daemon exited %d: %s", code, logs)
	}
	https = "https://" + d.addr
	if r := runCLI(t, with("XLB_API", https, "XLB_CA_FILE", ca.file), "", "farm", "list"); r.code != 1 {
		t.Fatalf("mTLS without a client certificate: %+v", r)
	}
	if r := runCLI(t, with("XLB_API", https, "XLB_CA_FILE", ca.file, "XLB_CLIENT_CERT", strangerCert, "XLB_CLIENT_KEY", strangerKey), "", "farm", "list"); r.code != 1 {
		t.Fatalf("mTLS with another CA's certificate: %+v", r)
	}
	if r := runCLI(t, with("XLB_API", https), "", "--ca-file", ca.file, "--client-cert", cliCert, "--client-key", cliKey, "farm", "list"); r.code != 0 || r.out != "web\n" {
		t.Fatalf("mTLS with a client certificate: %+v", r)
	}
	// The key is still required.
	if r := runCLI(t, map[string]string{"XLB_API": https, "XLB_KEY": "wrong-key-wrong-key", "XLB_CA_FILE": ca.file, "XLB_CLIENT_CERT": cliCert, "XLB_CLIENT_KEY": cliKey}, "", "farm", "list"); r.code != 1 || !strings.Contains(r.err, "wrong API key") {
		t.Fatalf("mTLS with a wrong key: %+v", r)
	}
	if !strings.Contains(d.logs.String(), "tls=true client_certs=true") {
		t.Errorf("the daemon did not log its TLS mode: %s", d.logs)
	}
}

// Beyond loopback, a short key or a key file others may read is refused
// (before anything listens); --allow-weak-key turns the refusal into an
// ERROR line. On loopback both are accepted.
func TestKeyExposure(t *testing.T) {
	dir := t.TempDir()
	shortFile := filepath.Join(dir, "short")
	os.WriteFile(shortFile, []byte("s3cret\n"), 0o600)
	openFile := filepath.Join(dir, "open")
	os.WriteFile(openFile, []byte(strings.Repeat("k", 32)), 0o644)
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:5599", "--key-file", shortFile}, nil, "the API key is 6 bytes; at least 16"},
		{[]string{"--listen", "192.0.2.1:5599"}, map[string]string{"XLB_KEY": "short"}, "at least 16"},
		{[]string{"--listen", "[::]:5599", "--key-file", openFile}, nil, "mode 0644: others may read it"},
	} {
		r := runCLI(t, c.env, "", append([]string{"daemon", "--state-dir", t.TempDir()}, c.args...)...)
		if r.code != 1 || !strings.Contains(r.err, c.want) || !strings.Contains(r.err, "--allow-weak-key") {
			t.Errorf("%v: exit %d, %q", c.args, r.code, r.err)
		}
	}
	// On loopback, the same keys start.
	for _, f := range []string{shortFile, openFile} {
		d, code, logs := startDaemonWith(t, nil, nil, "--state-dir", t.TempDir(), "--key-file", f)
		if d == nil {
			t.Fatalf("loopback with %s: exit %d: %s", f, code, logs)
		}
		d.stop()
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if err := checkKeyExposure(log, "0.0.0.0:5555", "short", openFile, tlsOptions{allowWeakKey: true}); err != nil {
		t.Fatalf("--allow-weak-key: %v", err)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "INSECURE") || !strings.Contains(logs.String(), "mode 0644") {
		t.Errorf("--allow-weak-key logged %q", logs.String())
	}
	logs = syncBuffer{}
	if err := checkKeyExposure(slog.New(slog.NewTextHandler(&logs, nil)), "10.0.0.1:5555", strings.Repeat("k", 32), "", tlsOptions{}); err != nil || !strings.Contains(logs.String(), "without TLS") {
		t.Errorf("a good key without TLS: %v, logged %q", err, logs.String())
	}
	for listen, beyond := range map[string]bool{"127.0.0.1:5555": false, "[::1]:5555": false, "localhost:5555": false, ":5555": true, "0.0.0.0:1": true, "10.1.2.3:5555": true, "[fd00::1]:5555": true} {
		if got := listensBeyondLoopback(listen); got != beyond {
			t.Errorf("listensBeyondLoopback(%q) = %v", listen, got)
		}
	}
}
