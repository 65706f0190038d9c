package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterFlags: the --sync-* and --bgp-config flags are checked before
// the daemon starts anything, with errors naming flag and value.
func TestClusterFlags(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.key")
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	good := filepath.Join(dir, "good.key")
	os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600)
	badBGP := filepath.Join(dir, "bgp.yaml")
	os.WriteFile(badBGP, []byte("router-id: 10.0.0.1\nas: 65001\npeers: [{address: 10.0.0.2, as: 0}]\n"), 0o600)
	d := func(args ...string) []string {
		return append([]string{"daemon", "--state-dir", t.TempDir(), "--listen", "127.0.0.1:0"}, args...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{d("--sync-peers", "10.0.0.2:7000"), `--sync-peers and --sync-key-file need --sync-listen`},
		{d("--sync-listen", "0.0.0.0:7000", "--sync-peers", "10.0.0.2:7000", "--sync-key-file", good), `--sync-listen "0.0.0.0:7000": must be this node's address:port`},
		{d("--sync-listen", "10.0.0.1:7000"), `--sync-peers: at least one peer`},
		{d("--sync-listen", "10.0.0.1:7000", "--sync-peers", "10.0.0.2"), `--sync-peers "10.0.0.2": must be address:port`},
		{d("--sync-listen", "10.0.0.1:7000", "--sync-peers", "10.0.0.2:7000"), `--sync-key-file: required`},
		{d("--sync-listen", "10.0.0.1:7000", "--sync-peers", "10.0.0.2:7000", "--sync-key-file", short), `8 bytes, at least 16 required`},
		{d("--bgp-config", badBGP), `peers[0]: as: required`},
		{d("--bgp-config", filepath.Join(dir, "missing.yaml")), `--bgp-config: read BGP config`},
	} {
		r := runCLI(t, map[string]string{}, "", c.args...)
		if r.code != 1 || !strings.Contains(r.err, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args[4:], r.code, r.err, c.want)
		}
	}
}
