package testutil

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

func TestNewNetNS(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	name, h := NewNetNS(t)
	out := Run(t, name, "ip", "-o", "link", "show", "lo")
	if !strings.Contains(out, "UP") {
		t.Fatalf("loopback not up: %s", out)
	}
	srv := StartTCPServer(t, h, netip.MustParseAddrPort("127.0.0.1:0"), "lo")
	got, err := AskTCP(h, srv)
	if err != nil {
		t.Fatal(err)
	}
	if n, _, err := ParseReply(got); err != nil || n != "lo" {
		t.Fatalf("reply %q, %v", got, err)
	}
}

func TestNewNetNSRemoved(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	var name string
	t.Run("inner", func(t *testing.T) { name, _ = NewNetNS(t) })
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), name) {
		t.Fatalf("namespace %s still exists: %s", name, out)
	}
}

// TestTopology routes (no NAT) from the client to every backend through the
// LB, over TCP, UDP and HTTP, IPv4 and IPv6.
func TestTopology(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	topo := NewTopology(t, TopologyOptions{Backends: 2, IPv6: true})
	if got, want := topo.Backends[1].IPv4.String(), "10.200.0.12"; got != want {
		t.Fatalf("backend 1 address %s, want %s", got, want)
	}
	if got, want := topo.Backends[1].IPv6.String(), "fd00:200::12"; got != want {
		t.Fatalf("backend 1 address %s, want %s", got, want)
	}
	for i, b := range topo.Backends {
		name := []string{"b0", "b1"}[i]
		StartTCPServer(t, b.NS, netip.MustParseAddrPort("[::]:80"), name)
		StartUDPServer(t, b.NS, netip.MustParseAddrPort("[::]:53"), name)
		StartHTTPServer(t, b.NS, netip.MustParseAddrPort("[::]:8080"), name)
		for _, v6 := range []bool{false, true} {
			dst := b.Addr(v6)
			got, err := AskTCP(topo.Client.NS, netip.AddrPortFrom(dst, 80))
			if err != nil {
				t.Fatalf("tcp to %s: %v", dst, err)
			}
			n, from, err := ParseReply(got)
			if err != nil || n != name || from.Addr().Unmap() != topo.Client.Addr(v6) {
				t.Fatalf("tcp to %s: reply %q (%v)", dst, got, err)
			}
			got, err = AskUDP(topo.Client.NS, netip.AddrPortFrom(dst, 53))
			if err != nil {
				t.Fatalf("udp to %s: %v", dst, err)
			}
			if n, _, _ := ParseReply(got); n != name {
				t.Fatalf("udp to %s: reply %q", dst, got)
			}
			resp, err := HTTPClient(topo.Client.NS).Get("http://" + netip.AddrPortFrom(dst, 8080).String() + "/")
			if err != nil {
				t.Fatalf("http to %s: %v", dst, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if n, _, _ := ParseReply(string(body)); n != name {
				t.Fatalf("http to %s: body %q", dst, body)
			}
		}
	}
	// A long-lived connection echoes lines.
	c, err := DialTCP(topo.Client.NS, netip.AddrPortFrom(topo.Backends[0].IPv4, 80), DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := ReadLine(c, DefaultTimeout); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := ReadLine(c, DefaultTimeout); err != nil || line != "hello" {
		t.Fatalf("echo %q, %v", line, err)
	}
	// Only the LB forwards.
	if out := Run(t, topo.Client.Name, "cat", "/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(out) != "0" {
		t.Fatalf("client forwards: %s", out)
	}
}

func TestVIP(t *testing.T) {
	if got := VIP4(7).String(); got != "10.99.0.7" {
		t.Fatal(got)
	}
	if got := VIP6(0x12).String(); got != "fd00:99::12" {
		t.Fatal(got)
	}
}

// TestHATopology routes from the client to each LB through the router and
// from a backend to the client through the LBs (added later ones too), and
// starts BIRD in the router with a session configured per LB address.
func TestHATopology(t *testing.T) {
	RequireRoot(t)
	topo := NewHATopology(t, HAOptions{LBs: 2, Backends: 1, IPv6: true})
	topo.AddLB(t)
	if got, want := topo.LBs[2].IPv6.String(), "fd00:101::13"; got != want {
		t.Fatalf("lb2 address %s, want %s", got, want)
	}
	srv := StartTCPServer(t, topo.Client.NS, netip.MustParseAddrPort("[::]:80"), "client")
	for _, v6 := range []bool{false, true} {
		for _, lb := range topo.LBs {
			StartTCPServer(t, lb.NS, netip.AddrPortFrom(lb.Addr(v6), 80), lb.Name)
			if _, err := AskTCP(topo.Client.NS, netip.AddrPortFrom(lb.Addr(v6), 80)); err != nil {
				t.Fatalf("client to %s: %v", lb.Addr(v6), err)
			}
		}
		// A backend reaches the client through its multipath route over
		// the LBs, each of which routes through the router.
		got, err := AskTCP(topo.Backends[0].NS, netip.AddrPortFrom(topo.Client.Addr(v6), srv.Port()))
		if err != nil {
			t.Fatalf("backend to client %s: %v", topo.Client.Addr(v6), err)
		}
		if _, from, _ := ParseReply(got); from.Addr() != topo.Backends[0].Addr(v6) {
			t.Fatalf("client saw %s, want the backend's %s", from, topo.Backends[0].Addr(v6))
		}
	}
	out := Run(t, topo.Backends[0].Name, "ip", "route", "show", "default")
	for _, lb := range topo.LBs {
		if !strings.Contains(out, "via "+lb.Back4.String()) {
			t.Fatalf("backend default route misses %s:\n%s", lb.Back4, out)
		}
	}
	bird := topo.StartBIRD(t, BIRDOptions{Peers: 3})
	if p := bird.Show("protocols"); !strings.Contains(p, "lb2") || !strings.Contains(p, "k6") {
		t.Fatalf("bird protocols:\n%s", p)
	}
	if nhs, err := topo.RouteNextHops(VIP4(1)); err != nil || len(nhs) != 0 {
		t.Fatalf("router has a route to %s before any announcement: %v %v", VIP4(1), nhs, err)
	}
}

// TestReapStale: a namespace named for a process that is gone is removed;
// one of a live process is kept.
func TestReapStale(t *testing.T) {
	RequireRoot(t)
	// pid_max is at most 4194304: no process has this pid.
	dead := "xlbt-4194305-1-reap"
	live := fmt.Sprintf("xlbt-%d-1-reap", os.Getppid())
	if err := netnsDirOnce(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{dead, live} {
		// ip(8), not netns.NewNamed: that moves this thread into it.
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	}
	reapStale()
	if _, err := os.Stat("/run/netns/" + dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace %s of a process that is gone: still there (%v)", dead, err)
	}
	if _, err := os.Stat("/run/netns/" + live); err != nil {
		t.Errorf("namespace %s of a live process: %v", live, err)
	}
}

// TestNetnsDirFreshMachine: on a machine where /run/netns is not yet a
// mount point (a fresh one), a namespace this package names survives the
// first `ip netns add` of another process, and its removal succeeds
// (netnsDirOnce). The test runs itself again in a private mount namespace
// of its own, where it takes /run/netns's mounts away. Without
// netnsDirOnce the removal fails with EBUSY.
func TestNetnsDirFreshMachine(t *testing.T) {
	RequireRoot(t)
	if os.Getenv("XLB_TEST_FRESH_NETNS_DIR") != "1" {
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run", "^TestNetnsDirFreshMachine$", "-test.v")
		cmd.Env = append(os.Environ(), "XLB_TEST_FRESH_NETNS_DIR=1")
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS: TestNetnsDirFreshMachine") {
			t.Fatalf("in a private mount namespace: %v\n%s", err, out)
		}
		return
	}
	for isMountPoint(t, "/run/netns") {
		if err := syscall.Unmount("/run/netns", syscall.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
	NewNetNS(t) // its removal, at the end, must succeed
	if !isMountPoint(t, "/run/netns") {
		t.Error("naming a namespace did not make /run/netns a mount point")
	}
	name := fmt.Sprintf("xlbt-%d-0-fresh", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		t.Errorf("ip netns del %s: %v: %s", name, err, out)
	}
}

// isMountPoint reports whether path is a mount point in this process's
// mount namespace.
func isMountPoint(t *testing.T, path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
