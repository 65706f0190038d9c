package testutil

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"
)

// The LVS-style baseline of the HA benchmark: keepalived's VRRP moves the
// VIP (and the backends' gateway) to the backup when the master goes, and
// conntrackd (FTFW) keeps the backup's copy of the master's conntrack
// table, committed to the kernel when it takes over (conntrackd's
// primary-backup.sh). Both come from Debian's packages, unpacked by
// scripts/deb-binary.sh into ~/.cache/xlb (never installed: no keepalived
// or conntrackd service starts on the host), and run only inside the LB
// namespaces with their own configuration, sockets, pid and log files.
// IPVS itself is not in this kernel: xlb's nft plane stands in for it.

var (
	debOnce  = map[string]*sync.Once{"keepalived": {}, "conntrackd": {}}
	debPaths = map[string]string{}
	debErrs  = map[string]error{}
)

// debBinary fetches a daemon of Debian's with scripts/deb-binary.sh once.
func debBinary(tb testing.TB, pkg, bin string, libs ...string) string {
	tb.Helper()
	debOnce[pkg].Do(func() {
		root, err := moduleRoot()
		if err != nil {
			debErrs[pkg] = err
			return
		}
		out, err := exec.Command(filepath.Join(root, "scripts/deb-binary.sh"), append([]string{pkg, bin}, libs...)...).Output()
		if err != nil {
			debErrs[pkg] = fmt.Errorf("scripts/deb-binary.sh %s: %w", pkg, err)
			return
		}
		debPaths[pkg] = strings.TrimSpace(string(out))
	})
	if debErrs[pkg] != nil {
		tb.Fatalf("%s: %v", pkg, debErrs[pkg])
	}
	return debPaths[pkg]
}

// KeepalivedBinary is Debian's keepalived (2.2.7 in bookworm).
func KeepalivedBinary(tb testing.TB) string {
	return debBinary(tb, "keepalived", "usr/sbin/keepalived", "libglib2.0-0", "libmnl0", "libnftnl11",
		"libnl-3-200", "libnl-genl-3-200", "libpcre2-8-0", "libsnmp40", "libssl3")
}

// ConntrackdBinary is Debian's conntrackd (1.4.7 in bookworm).
func ConntrackdBinary(tb testing.TB) string {
	return debBinary(tb, "conntrackd", "usr/sbin/conntrackd", "libmnl0", "libnetfilter-conntrack3",
		"libnetfilter-cthelper0", "libnetfilter-queue1", "libnfnetlink0")
}

// VRRPGateway4 is the backends' gateway in the VRRP baseline: an address
// of the backend segment that keepalived moves with the VIP (LVS-NAT's
// real servers route through the director's floating address).
var VRRPGateway4 = nth(BackNet4, 1)

// VRRPOptions configures keepalived and conntrackd on one LB node.
type VRRPOptions struct {
	VIP      netip.Addr // moved on the LB's router side (eth0)
	Priority int        // the higher is master at start
	// AdvertInt is VRRP's advertisement interval (keepalived's default
	// 1 s; the backup takes over after about 3 of them).
	AdvertInt time.Duration
	// Conntrackd: run conntrackd (FTFW over UDP on the router-side
	// link) and commit its copy on taking over; otherwise VRRP alone.
	Conntrackd bool
	// Peer is the other LB (its router-side address is conntrackd's
	// destination).
	Peer *LBNode
}

// VRRPNode is keepalived (and conntrackd) on one LB node.
type VRRPNode struct {
	LB   *LBNode
	Dir  string
	opts VRRPOptions
	bin  string // keepalived
	ka   *exec.Cmd
	// CT is the node's conntrackd (nil without).
	CT *Conntrackd
}

// Conntrackd is conntrackd (FTFW over UDP on the router-side link to one
// peer) on one LB node.
type Conntrackd struct {
	LB   *LBNode
	Dir  string
	bin  string
	cmd  *exec.Cmd
	conf string
}

const keepalivedConf = `global_defs {
	router_id {{.Name}}
	script_user root
	vrrp_garp_master_repeat 2
	vrrp_version 3
}
vrrp_sync_group G {
	group {
		VI_1
		VI_2
	}
	notify "{{.Dir}}/notify.sh"
}
vrrp_instance VI_1 {
	state BACKUP
	nopreempt
	interface eth0
	virtual_router_id 51
	priority {{.Priority}}
	advert_int {{.Advert}}
	virtual_ipaddress {
		{{.VIP}}/32 dev eth0
	}
}
vrrp_instance VI_2 {
	state BACKUP
	nopreempt
	interface eth1
	virtual_router_id 52
	priority {{.Priority}}
	advert_int {{.Advert}}
	virtual_ipaddress {
		{{.Gateway}}/24 dev eth1
	}
}
`

// notify.sh is keepalived's notify script: it records the state, and with
// conntrackd does what conntrackd's primary-backup.sh does.
const notifyScript = `#!/bin/sh
# keepalived calls: notify.sh GROUP|INSTANCE NAME STATE PRIORITY
[ "$1" = GROUP ] || exit 0
state=$3
{{- if .Conntrackd}}
ctd="{{.Conntrackd}}"
case $state in
MASTER)
	$ctd -c   # commit the external cache (the master's connections) to the kernel
	$ctd -f   # flush the caches
	$ctd -R   # resync the internal cache with the kernel's table
	$ctd -B   # send it to the other node
	;;
BACKUP)
	$ctd -t   # shorten the kernel's timeouts (the entries go unless refreshed)
	$ctd -n   # ask the other node for its state
	;;
FAULT)
	$ctd -t
	;;
esac
{{- end}}
echo "$state $(date +%s.%N)" >>{{.Dir}}/state
`

const conntrackdConf = `Sync {
	Mode FTFW {
		DisableExternalCache {{if .Direct}}On{{else}}Off{{end}}
		CommitTimeout 1800
		PurgeTimeout 5
	}
	UDP {
		IPv4_address {{.Self}}
		IPv4_Destination_Address {{.Peer}}
		Port 3780
		Interface eth0
		SndSocketBuffer 1249280
		RcvSocketBuffer 1249280
		Checksum on
	}
}
General {
	Systemd off
	HashSize 32768
	HashLimit 131072
	LogFile {{.Dir}}/conntrackd.log
	Syslog off
	LockFile {{.Dir}}/conntrackd.lock
	UNIX {
		Path {{.Dir}}/conntrackd.ctl
	}
	NetlinkBufferSize 2097152
	NetlinkBufferSizeMaxGrowth 8388608
	Filter From Userspace {
		Protocol Accept {
			TCP
		}
		Address Ignore {
			IPv4_address 127.0.0.1
			IPv4_address {{.Self}}
			IPv4_address {{.Peer}}
		}
	}
}
`

// StartConntrackd runs conntrackd in LB lb's namespace, synchronising
// with peer (FTFW over UDP on the router-side link), and stops it in
// tb.Cleanup. direct: DisableExternalCache On (the peer's entries go
// straight into the kernel) instead of conntrackd's default external
// cache, committed on demand (Commit). The LB's conntrack is made liberal
// about TCP windows (conntrackd's documentation asks it: synchronised
// entries know nothing of the windows).
func (t *HATopology) StartConntrackd(tb testing.TB, lb, peer *LBNode, direct bool) *Conntrackd {
	tb.Helper()
	c := &Conntrackd{LB: lb, Dir: tempDir(tb, "xlb-conntrackd-"+lb.Name+"-"), bin: ConntrackdBinary(tb)}
	c.conf = filepath.Join(c.Dir, "conntrackd.conf")
	writeTemplate(tb, c.conf, conntrackdConf, map[string]any{"Dir": c.Dir, "Self": lb.IPv4, "Peer": peer.IPv4, "Direct": direct}, 0o600)
	if err := WriteSysctl(lb.NS, "net/netfilter/nf_conntrack_tcp_be_liberal", "1"); err != nil {
		tb.Fatalf("%s: %v", lb.Name, err)
	}
	tb.Cleanup(func() {
		c.Kill()
		if tb.Failed() {
			tb.Logf("%s conntrackd:\n%s", lb.Name, logs(c.Dir, "conntrackd.out", "conntrackd.log"))
		}
	})
	c.Start(tb)
	return c
}

func tempDir(tb testing.TB, prefix string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func writeTemplate(tb testing.TB, path, tmpl string, data any, mode os.FileMode) {
	tb.Helper()
	var b bytes.Buffer
	if err := template.Must(template.New(filepath.Base(path)).Parse(tmpl)).Execute(&b, data); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), mode); err != nil {
		tb.Fatal(err)
	}
}

// spawn starts a daemon in lb's namespace, its output into dir/NAME.out,
// in a process group of its own (killProcess takes its children too).
func spawn(tb testing.TB, lb *LBNode, dir string, args ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", lb.Name}, args...)...)
	out, err := os.OpenFile(filepath.Join(dir, filepath.Base(args[0])+".out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("%s: start %s: %v", lb.Name, args[0], err)
	}
	return cmd
}

func killProcess(c **exec.Cmd) {
	if *c == nil {
		return
	}
	syscall.Kill(-(*c).Process.Pid, syscall.SIGKILL)
	(*c).Wait()
	*c = nil
}

// Start starts conntrackd and waits for its control socket.
func (c *Conntrackd) Start(tb testing.TB) {
	tb.Helper()
	sock := filepath.Join(c.Dir, "conntrackd.ctl")
	os.Remove(sock)
	os.Remove(filepath.Join(c.Dir, "conntrackd.lock"))
	c.cmd = spawn(tb, c.LB, c.Dir, c.bin, "-C", c.conf)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: conntrackd has no control socket after 5s:\n%s", c.LB.Name, logs(c.Dir, "conntrackd.out"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills conntrackd with SIGKILL.
func (c *Conntrackd) Kill() { killProcess(&c.cmd) }

// Pid is the conntrackd process's id (0 when it is not running).
func (c *Conntrackd) Pid() int {
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Command runs conntrackd's client mode (-c, -s cache, ...) against it.
func (c *Conntrackd) Command(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", c.LB.Name, c.bin, "-C", c.conf}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("conntrackd %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ExternalCache returns the number of entries in conntrackd's external
// cache (the other node's connections it holds).
func (c *Conntrackd) ExternalCache() (int, error) {
	out, err := c.Command("-s", "cache")
	if err != nil {
		return 0, err
	}
	// "cache:external\tactive objects:\t\t  N"
	i := strings.Index(out, "cache:external")
	if i < 0 {
		return 0, fmt.Errorf("conntrackd -s cache: no external cache in %q", out)
	}
	line, _, _ := strings.Cut(out[i:], "\n")
	f := strings.Fields(line)
	count, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		return 0, fmt.Errorf("conntrackd -s cache: %q: %w", line, err)
	}
	return count, nil
}

// logs returns files of dir, for a failed test's log.
func logs(dir string, files ...string) string {
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(filepath.Join(dir, f))
		fmt.Fprintf(&b, "--- %s:\n%s\n", f, data)
	}
	return b.String()
}

// StartVRRP runs keepalived (VRRP only) and, if asked, conntrackd
// (StartConntrackd, with the external cache that keepalived's notify
// script commits on taking over) in LB lb's namespace, and stops them in
// tb.Cleanup.
func (t *HATopology) StartVRRP(tb testing.TB, lb *LBNode, o VRRPOptions) *VRRPNode {
	tb.Helper()
	if o.AdvertInt <= 0 {
		o.AdvertInt = time.Second
	}
	n := &VRRPNode{LB: lb, Dir: tempDir(tb, "xlb-vrrp-"+lb.Name+"-"), opts: o, bin: KeepalivedBinary(tb)}
	ctd := ""
	if o.Conntrackd {
		n.CT = t.StartConntrackd(tb, lb, o.Peer, false)
		ctd = n.CT.bin + " -C " + n.CT.conf
	}
	data := map[string]any{"Name": lb.Name, "Dir": n.Dir, "Priority": o.Priority, "VIP": o.VIP, "Gateway": VRRPGateway4,
		"Advert": strconv.FormatFloat(o.AdvertInt.Seconds(), 'f', -1, 64), "Conntrackd": ctd}
	// keepalived reads only a configuration file that is not executable;
	// the notify script must be.
	writeTemplate(tb, filepath.Join(n.Dir, "keepalived.conf"), keepalivedConf, data, 0o600)
	writeTemplate(tb, filepath.Join(n.Dir, "notify.sh"), notifyScript, data, 0o700)
	tb.Cleanup(func() {
		n.Kill()
		if tb.Failed() {
			tb.Logf("%s keepalived:\n%s", lb.Name, logs(n.Dir, "keepalived.out", "state"))
		}
	})
	n.Start(tb)
	return n
}

// Start starts conntrackd (first: keepalived's notify script talks to it)
// and keepalived.
func (n *VRRPNode) Start(tb testing.TB) {
	tb.Helper()
	if n.CT != nil && n.CT.cmd == nil {
		n.CT.Start(tb)
	}
	n.ka = spawn(tb, n.LB, n.Dir, n.bin, "--vrrp", "--dont-fork", "--log-console", "--log-detail", "--no-syslog",
		"-f", filepath.Join(n.Dir, "keepalived.conf"), "-p", filepath.Join(n.Dir, "keepalived.pid"),
		"-r", filepath.Join(n.Dir, "vrrp.pid"))
}

// Kill kills keepalived and conntrackd with SIGKILL (a node lost: the VIP
// stays on its links; take them down with SetLBLinks).
func (n *VRRPNode) Kill() {
	killProcess(&n.ka)
	if n.CT != nil {
		n.CT.Kill()
	}
}

// State is the VRRP state keepalived last reported (MASTER, BACKUP,
// FAULT; "" before the first).
func (n *VRRPNode) State() string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "state"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// WaitState waits until keepalived reports state and returns how long
// that took.
func (n *VRRPNode) WaitState(tb testing.TB, state string, timeout time.Duration) time.Duration {
	tb.Helper()
	start := time.Now()
	for n.State() != state {
		if time.Since(start) > timeout {
			tb.Fatalf("%s: VRRP state %q after %v, want %s", n.LB.Name, n.State(), timeout, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// SetBackendGateway points every backend's default route at gw alone (the
// VRRP baseline's floating gateway) instead of the multipath route over
// the LBs.
func (t *HATopology) SetBackendGateway(tb testing.TB, gw netip.Addr) {
	tb.Helper()
	for _, b := range t.Backends {
		if _, err := RunErr(b.Name, "ip", "route", "replace", "default", "via", gw.String(), "dev", "eth0"); err != nil {
			tb.Fatalf("default route of %s via %s: %v", b.Name, gw, err)
		}
	}
}
