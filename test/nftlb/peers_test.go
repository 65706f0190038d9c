// Package nftlb checks xlb's nftlb-compatible API side by side against
// Debian's nftlb itself: the same requests go to both daemons, each in a
// network namespace of the test's own, and their replies (status codes,
// {"response": ...} texts) and what GET prints afterwards are compared.
// docs/nftlb-compat.md is the table of what matches and every deliberate
// difference; the cases here are where each line of it is shown.
package nftlb

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xlb-lb/xlb/internal/testutil"
)

const key = "side-by-side-key"

// peer is one daemon answering nftlb's API inside its own namespace.
type peer struct {
	name   string
	nsName string
	ns     netns.NsHandle
	hc     *http.Client
	cmd    *exec.Cmd
	log    *bytes.Buffer
	// stateDir: xlb's state directory.
	stateDir string
}

// reply is one answer.
type reply struct {
	status int
	body   string
}

func (p *peer) do(t *testing.T, method, path, body string) reply {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://127.0.0.1:5555"+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Key", key)
	resp, err := p.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s %s: %v\n%s log:\n%s", p.name, method, path, err, p.name, p.log)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(b)}
}

// newPeer starts argv inside a new namespace and waits for its API.
func newPeer(t *testing.T, name string, env []string, argv ...string) *peer {
	t.Helper()
	nsName, ns := testutil.NewNetNS(t)
	p := &peer{name: name, nsName: nsName, ns: ns, log: &bytes.Buffer{}}
	// Each request is a connection of its own made inside the namespace
	// (nftlb closes a connection after each answer).
	p.hc = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := testutil.Do(ns, func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", nsName}, argv...)...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &syncWriter{w: p.log}, &syncWriter{w: p.log}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:5555/farms", nil)
		req.Header.Set("Key", key)
		if resp, err := p.hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer on 127.0.0.1:5555 in its namespace; log:\n%s", name, p.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

var (
	buildOnce sync.Once
	xlbPath   string
	buildErr  error
)

func xlbBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "xlb-nftlb-bin")
		if err != nil {
			buildErr = err
			return
		}
		xlbPath = filepath.Join(dir, "xlb")
		if out, err := exec.Command("go", "build", "-o", xlbPath, "../../cmd/xlb").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return xlbPath
}

// nftlbBinary finds Debian's nftlb: $XLB_NFTLB, or what
// scripts/nftlb-binary.sh fetched (it fetches it when missing).
func nftlbBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("XLB_NFTLB"); p != "" {
		return p
	}
	out, err := exec.Command("../../scripts/nftlb-binary.sh").Output()
	if err != nil {
		t.Fatalf("Debian's nftlb is needed for the side-by-side tests (scripts/install-deps.sh, or XLB_NFTLB=path): %v", err)
	}
	return strings.TrimSpace(string(out))
}

// startPeers starts nftlb and xlb (nft data plane), each in a namespace
// of its own, both on 127.0.0.1:5555 there.
func startPeers(t *testing.T) (nftlb, xlb *peer) {
	testutil.RequireRoot(t)
	nbin := nftlbBinary(t)
	nftlb = newPeer(t, "nftlb", nil, nbin, "-k", key, "-H", "127.0.0.1", "-P", "5555", "-l", "3", "-L", "2")
	xlb = startXlb(t, t.TempDir())
	return nftlb, xlb
}

// startXlb starts xlb (nft data plane) on the state directory dir, in a
// namespace of its own.
func startXlb(t *testing.T, dir string) *peer {
	p := newPeer(t, "xlb", []string{"XLB_KEY=" + key}, xlbBinary(t), "daemon", "--listen", "127.0.0.1:5555",
		"--state-dir", dir, "--socket", "none", "--dataplane", "nft", "--log-level", "warn")
	p.stateDir = dir
	return p
}

// restartXlb stops xlb and starts it again on its state directory (in a
// new namespace: what it serves comes from the saved state).
func restartXlb(t *testing.T, p *peer) *peer {
	p.cmd.Process.Kill()
	p.cmd.Wait()
	return startXlb(t, p.stateDir)
}

// responseText is the text of a {"response": ...} body, ok false if the
// body is not one.
func responseText(body string) (string, bool) {
	var r map[string]json.RawMessage
	if json.Unmarshal([]byte(body), &r) != nil || len(r) != 1 || r["response"] == nil {
		return "", false
	}
	var s string
	return s, json.Unmarshal(r["response"], &s) == nil
}

// nftlbText is nftlb's own text in a reply: up to the first ". " (what
// nftlb appends after it is its detail; xlb puts its own message there).
func nftlbText(s string) string {
	text, _, _ := strings.Cut(s, ". ")
	return text
}
