package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"
)

// The HA topology's router is BIRD 2 from Debian's bird2 package, unpacked
// (never installed, so no bird service starts on the host) by
// scripts/deb-binary.sh into ~/.cache/xlb/bird2. BIRD merges equal BGP
// routes from several peers into one multipath kernel route ("merge
// paths"), which is what ECMP in front of xlb needs, in one daemon and
// one file: FRR needs zebra and bgpd, gobgpd needs zebra to reach the
// kernel at all.

// Router AS and the LBs' AS in the HA tests.
const (
	RouterAS = 65000
	LBAS     = 65001
)

var (
	birdOnce sync.Once
	birdPath string
	birdErr  error
)

// BIRDBinary returns the path of Debian's bird (fetching it with
// scripts/deb-binary.sh on first use); the test fails without it.
func BIRDBinary(tb testing.TB) string {
	tb.Helper()
	birdOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			birdErr = err
			return
		}
		out, err := exec.Command(filepath.Join(root, "scripts/deb-binary.sh"), "bird2", "usr/sbin/bird",
			"libreadline8", "libssh-gcrypt-4", "libtinfo6").Output()
		if err != nil {
			birdErr = fmt.Errorf("scripts/deb-binary.sh bird2: %w", err)
			return
		}
		birdPath = strings.TrimSpace(string(out))
	})
	if birdErr != nil {
		tb.Fatalf("bird: %v", birdErr)
	}
	return birdPath
}

// moduleRoot finds the directory of go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// BIRDOptions configures the router's BGP daemon.
type BIRDOptions struct {
	// Peers is how many LB addresses (10.101.0.11, .12, ...) get a BGP
	// session configured, including LBs added later (default 3).
	Peers int
	// Password, if set, protects every session with TCP MD5.
	Password string
	// HoldTime in seconds (default 3, the smallest BGP allows).
	HoldTime int
}

// BIRD is a running bird in the router namespace.
type BIRD struct {
	Dir  string // config, control socket, log
	Sock string
	cmd  *exec.Cmd
	done chan struct{}
	out  bytes.Buffer
	args []string
}

const birdConf = `router id {{.RouterID}};
log "{{.Dir}}/bird.log" all;
protocol device { scan time 1; }
protocol kernel k4 { ipv4 { import none; export all; }; merge paths on limit 16; }
{{- if .IPv6}}
protocol kernel k6 { ipv6 { import none; export all; }; merge paths on limit 16; }
{{- end}}
template bgp lb {
	local {{.RouterID}} as {{.RouterAS}};
	hold time {{.Hold}}; keepalive time 1; connect retry time 1; error wait time 1, 2;
	{{- if .Password}}
	password "{{.Password}}";
	{{- end}}
	ipv4 { import all; export none; };
	{{- if .IPv6}}
	ipv6 { import all; export none; };
	{{- end}}
}
{{range .Peers}}protocol bgp lb{{.I}} from lb { neighbor {{.Addr}} as {{$.LBAS}}; }
{{end}}`

// StartBIRD runs bird in the router's namespace with BGP sessions to the
// LB addresses, its own config, control socket and log in a temporary
// directory, and stops it in tb.Cleanup.
func (t *HATopology) StartBIRD(tb testing.TB, o BIRDOptions) *BIRD {
	tb.Helper()
	bin := BIRDBinary(tb)
	if o.Peers <= 0 {
		o.Peers = 3
	}
	if o.HoldTime <= 0 {
		o.HoldTime = 3
	}
	dir, err := os.MkdirTemp("", "xlb-bird-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	type peer struct {
		I    int
		Addr string
	}
	data := struct {
		Dir, RouterID, Password string
		RouterAS, LBAS, Hold    int
		IPv6                    bool
		Peers                   []peer
	}{Dir: dir, RouterID: t.RouterLB4.String(), Password: o.Password, RouterAS: RouterAS, LBAS: LBAS,
		Hold: o.HoldTime, IPv6: t.ipv6}
	for i := range o.Peers {
		data.Peers = append(data.Peers, peer{i, nth(LBNet4, 11+i).String()})
	}
	var conf bytes.Buffer
	if err := template.Must(template.New("bird").Parse(birdConf)).Execute(&conf, data); err != nil {
		tb.Fatal(err)
	}
	confPath := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o600); err != nil {
		tb.Fatal(err)
	}
	b := &BIRD{Dir: dir, Sock: filepath.Join(dir, "bird.ctl")}
	// -f: foreground, so the test owns the process; -s and -P keep it off
	// the host's /run/bird.
	b.args = []string{"netns", "exec", t.Router.Name, bin, "-f", "-c", confPath,
		"-s", b.Sock, "-P", filepath.Join(dir, "bird.pid")}
	b.start(tb)
	tb.Cleanup(func() {
		b.stop()
		if tb.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "bird.log"))
			tb.Logf("bird output:\n%s\nbird.log:\n%s\nconfig:\n%s", b.out.String(), log, conf.String())
		}
	})
	return b
}

func (b *BIRD) start(tb testing.TB) {
	tb.Helper()
	os.Remove(b.Sock)
	b.done = make(chan struct{})
	b.cmd = exec.Command("ip", b.args...)
	b.cmd.Stdout, b.cmd.Stderr = &b.out, &b.out
	if err := b.cmd.Start(); err != nil {
		tb.Fatalf("start bird: %v", err)
	}
	done := b.done
	go func() { b.cmd.Wait(); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(b.Sock); err == nil {
			return
		}
		select {
		case <-b.done:
			tb.Fatalf("bird exited at start:\n%s", b.out.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("bird: no control socket after 5s:\n%s", b.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *BIRD) stop() {
	if b.cmd == nil {
		return
	}
	b.cmd.Process.Kill()
	<-b.done
	b.cmd = nil
}

// Restart kills bird (its sessions drop, its kernel routes stay until it
// flushes them at start) and starts it again with the same configuration.
func (b *BIRD) Restart(tb testing.TB) {
	tb.Helper()
	b.stop()
	b.start(tb)
}

// Show runs `birdc show ...` against this bird and returns its output
// (for test logs and failure messages).
func (b *BIRD) Show(args ...string) string {
	out, err := b.Ctl(append([]string{"show"}, args...)...)
	if err != nil {
		return err.Error()
	}
	return out
}

// Ctl runs a birdc command (disable lb0, enable lb0, ...) against this
// bird.
func (b *BIRD) Ctl(args ...string) (string, error) {
	birdc := filepath.Join(filepath.Dir(birdPath), "birdc")
	out, err := exec.Command(birdc, append([]string{"-s", b.Sock}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("birdc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
