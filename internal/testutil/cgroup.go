package testutil

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Cgroup is a cgroup v2 group of a test's own, for programs attached to a
// cgroup (socket-level balancing): processes started with Ask run in it,
// and nothing else does. It lives on a cgroup2 mount the test makes on a
// directory of its own (the hierarchy is the host's one cgroup v2
// hierarchy, whatever else is mounted at /sys/fs/cgroup), so attaching to
// Dir reaches exactly those processes, never the host's: never attach to
// the hierarchy's root.
type Cgroup struct {
	Dir string // the group's directory
	fd  int    // open on Dir, for clone3(CLONE_INTO_CGROUP)
	mnt string // the cgroup2 mount Dir is below
}

// NewCgroup mounts cgroup2 on a temporary directory, makes a group below
// its root, and removes both in tb.Cleanup.
func NewCgroup(tb testing.TB) *Cgroup {
	tb.Helper()
	RequireRoot(tb)
	mnt, err := os.MkdirTemp("", "xlb-cgroup2-")
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		os.Remove(mnt)
		tb.Fatalf("mount cgroup2 at %s: %v", mnt, err)
	}
	dir := filepath.Join(mnt, uniqueName("cg"))
	if err := os.Mkdir(dir, 0o755); err != nil {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		os.Remove(mnt)
		tb.Fatalf("make cgroup %s: %v", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("open cgroup %s: %v", dir, err)
	}
	c := &Cgroup{Dir: dir, fd: fd, mnt: mnt}
	tb.Cleanup(func() {
		unix.Close(fd)
		// A group is removable once its last process is reaped; Ask
		// waits for its process, but the kernel may take a moment.
		var err error
		for range 100 {
			if err = unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			tb.Errorf("remove cgroup %s: %v", dir, err)
		}
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount %s: %v", mnt, err)
		}
		os.Remove(mnt)
	})
	return c
}

// Procs returns the processes in the group.
func (c *Cgroup) Procs(tb testing.TB) []int {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(c.Dir, "cgroup.procs"))
	if err != nil {
		tb.Fatal(err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		out = append(out, pid)
	}
	return out
}

// Answer is one request of an Ask client.
type Answer struct {
	Reply string `json:"reply,omitempty"` // the server's answer line
	// Peer is the address the client's socket says it talks to: for TCP
	// and connected UDP getpeername(), for unconnected UDP the source of
	// the answer (recvfrom).
	Peer string `json:"peer,omitempty"`
	Err  string `json:"err,omitempty"`
}

// Ask modes.
const (
	AskTCPMode     = "tcp"     // a new connection per request
	AskUDPMode     = "udp"     // one unconnected socket, sendto/recvfrom
	AskUDPConnMode = "udpconn" // one connected socket
)

const askEnv = "XLB_TESTUTIL_ASK"

// Ask runs a client process in the group and in the network namespace
// nsName (a named namespace, e.g. Host.Name) that sends n requests to
// addr (mode: AskTCPMode, AskUDPMode, AskUDPConnMode) to servers like
// StartTCPServer's and StartUDPServer's, and returns what each got. The
// process is this test binary run again (its TestMain must call AskMain
// first), put into the group when it is created (clone3
// CLONE_INTO_CGROUP), so every socket it opens belongs to the group.
func (c *Cgroup) Ask(tb testing.TB, nsName, mode string, addr netip.AddrPort, n int) []Answer {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(n)*DefaultTimeout+10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%s,%d", askEnv, nsName, mode, addr, n))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: c.fd}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("ask client (%s %s x%d in %s): %v: %s", mode, addr, n, nsName, err, stderr.String())
	}
	var answers []Answer
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var a Answer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			tb.Fatalf("ask client output %q: %v", sc.Text(), err)
		}
		answers = append(answers, a)
	}
	if len(answers) != n {
		tb.Fatalf("ask client gave %d answers, want %d: %s", len(answers), n, out)
	}
	return answers
}

// AskMain is the client side of Cgroup.Ask: call it first in TestMain. In
// a process started by Ask it runs the client and exits; otherwise it
// returns at once.
func AskMain() {
	v := os.Getenv(askEnv)
	if v == "" {
		return
	}
	if err := askClient(v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(0)
}

func askClient(spec string) error {
	parts := strings.Split(spec, ",")
	if len(parts) != 4 {
		return fmt.Errorf("%s=%q: want ns,mode,addr,n", askEnv, spec)
	}
	addr, err := netip.ParseAddrPort(parts[2])
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(parts[3])
	if err != nil {
		return err
	}
	ns, err := netns.GetFromName(parts[0])
	if err != nil {
		return fmt.Errorf("namespace %s: %w", parts[0], err)
	}
	defer ns.Close()
	enc := json.NewEncoder(os.Stdout)
	emit := func(reply string, peer net.Addr, err error) {
		a := Answer{Reply: strings.TrimSpace(reply)}
		if peer != nil {
			a.Peer = peer.String()
		}
		if err != nil {
			a.Err = err.Error()
		}
		_ = enc.Encode(a)
	}
	switch parts[1] {
	case AskTCPMode:
		for range n {
			c, err := DialTCP(ns, addr, DefaultTimeout)
			if err != nil {
				emit("", nil, err)
				continue
			}
			peer, perr := getpeername(c.(syscall.Conn))
			line, err := ReadLine(c, DefaultTimeout)
			c.Close()
			emit(line, peer, errors.Join(perr, err))
		}
	case AskUDPMode, AskUDPConnMode:
		var c *net.UDPConn
		err := Do(ns, func() error {
			var err error
			if parts[1] == AskUDPMode {
				c, err = net.ListenUDP("udp", nil)
			} else {
				c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
			}
			return err
		})
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2048)
		for range n {
			_ = c.SetDeadline(time.Now().Add(DefaultTimeout))
			var k int
			var from net.Addr
			if parts[1] == AskUDPMode {
				if _, err = c.WriteToUDPAddrPort([]byte("ping"), addr); err == nil {
					k, from, err = c.ReadFrom(buf)
				}
			} else if _, err = c.Write([]byte("ping")); err == nil {
				if k, err = c.Read(buf); err == nil {
					from, err = getpeername(c)
				}
			}
			emit(string(buf[:k]), from, err)
		}
	default:
		return fmt.Errorf("ask mode %q: want tcp, udp or udpconn", parts[1])
	}
	return nil
}

// getpeername asks the kernel (not Go's cached RemoteAddr) whom the socket
// of c talks to.
func getpeername(c syscall.Conn) (net.Addr, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var sa unix.Sockaddr
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = unix.Getpeername(int(fd)) }); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))), nil
	case *unix.SockaddrInet6:
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))), nil
	}
	return nil, fmt.Errorf("getpeername: address %T", sa)
}

// Enter runs fn with this whole process in the group, then moves it back
// to the group it was in: a socket belongs to the group of the process
// that creates it for its whole life, so sockets fn creates are the
// group's (for benchmarks that must send from this process; tests use
// Ask). Other goroutines' sockets created meanwhile are the group's too.
func (c *Cgroup) Enter(tb testing.TB, fn func()) {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		tb.Fatal(err)
	}
	var home string
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			home = p
		}
	}
	if home == "" {
		tb.Fatalf("no cgroup v2 line in /proc/self/cgroup:\n%s", b)
	}
	move := func(dir string) {
		tb.Helper()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			tb.Fatalf("move this process to cgroup %s: %v", dir, err)
		}
	}
	move(c.Dir)
	defer move(filepath.Join(c.mnt, home))
	fn()
}
