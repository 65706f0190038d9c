package ebpf

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// mountBPFFS mounts a fresh bpf file system on a temporary directory, so
// each test pins into its own, and unmounts it (dropping every pin) at
// cleanup.
func mountBPFFS(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "xlb-bpffs-")
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		tb.Fatalf("mount bpffs at %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir + "/xlb"
}

func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(b []byte) (int, error) { w.tb.Log(string(b)); return len(b), nil }

// newPlane starts a plane in ns, pinned under a fresh bpffs, and closes
// it at cleanup (the bpffs unmount and namespace removal undo the rest).
func newPlane(tb testing.TB, ns netns.NsHandle, pin string, ifaces []string, ctSize int) *Plane {
	tb.Helper()
	p, err := New(context.Background(), testLogger(tb), Options{NetNS: ns, Interfaces: ifaces, PinPath: pin, ConnTableSize: ctSize})
	if err != nil {
		tb.Fatalf("new ebpf plane: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

var (
	macFront = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	macBack  = net.HardwareAddr{0x02, 0, 0, 0, 1, 0x01}
)

func macBackend(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, 2, byte(11 + i)} }

// fixtureNS is a namespace for BPF_PROG_TEST_RUN fixtures: veths "front"
// (10.100.0.1/24, client 10.100.0.2) and "back" (10.200.0.1/24, backends
// 10.200.0.11-13) with permanent neighbours, so bpf_fib_lookup resolves
// next hops without any real traffic.
func fixtureNS(tb testing.TB) netns.NsHandle {
	tb.Helper()
	_, ns := testutil.NewNetNS(tb)
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatal(err)
	}
	defer nh.Close()
	add := func(name string, mac net.HardwareAddr, addr string) netlink.Link {
		// A veth pair inside the namespace: the dummy driver may be absent.
		l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac}, PeerName: name + "-p"}
		if err := nh.LinkAdd(l); err != nil {
			tb.Fatalf("add %s: %v", name, err)
		}
		if peer, err := nh.LinkByName(name + "-p"); err != nil || nh.LinkSetUp(peer) != nil {
			tb.Fatalf("set up %s-p: %v", name, err)
		}
		a, _ := netlink.ParseAddr(addr)
		if err := nh.AddrAdd(l, a); err != nil {
			tb.Fatalf("address %s: %v", addr, err)
		}
		if err := nh.LinkSetUp(l); err != nil {
			tb.Fatal(err)
		}
		return l
	}
	front := add("front", macFront, "10.100.0.1/24")
	back := add("back", macBack, "10.200.0.1/24")
	for _, a := range []struct {
		l    netlink.Link
		addr string
	}{{front, "fd00:100::1/64"}, {back, "fd00:200::1/64"}} {
		pa, _ := netlink.ParseAddr(a.addr)
		pa.Flags = unix.IFA_F_NODAD
		if err := nh.AddrAdd(a.l, pa); err != nil {
			tb.Fatalf("address %s: %v", a.addr, err)
		}
	}
	neigh := func(l netlink.Link, ip string, mac net.HardwareAddr) {
		fam := unix.AF_INET
		if strings.Contains(ip, ":") {
			fam = unix.AF_INET6
		}
		err := nh.NeighAdd(&netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: net.ParseIP(ip), HardwareAddr: mac, Family: fam})
		if err != nil {
			tb.Fatalf("neighbour %s: %v", ip, err)
		}
	}
	neigh(front, "10.100.0.2", macClient)
	neigh(front, "fd00:100::2", macClient)
	for i := range 3 {
		neigh(back, netip.AddrFrom4([4]byte{10, 200, 0, byte(11 + i)}).String(), macBackend(i))
		neigh(back, fmt.Sprintf("fd00:200::%d", 11+i), macBackend(i))
	}
	for _, sc := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := testutil.WriteSysctl(ns, sc, "1"); err != nil {
			tb.Fatal(err)
		}
	}
	return ns
}

// farm builds a valid farm; backends are "addr:port" strings.
func farm(tb testing.TB, name, vip string, port uint16, proto model.Protocol, mode model.Mode, sched model.Scheduler, backends ...string) *model.Farm {
	tb.Helper()
	f := model.NewFarm(name)
	f.VirtualAddr = netip.MustParseAddr(vip)
	if f.VirtualAddr.Is6() {
		f.Family = model.FamilyIPv6
	}
	if port != 0 {
		f.VirtualPorts = []model.PortRange{{First: port, Last: port}}
	}
	f.Protocol = proto
	f.Mode = mode
	f.Scheduler = sched
	if sched == model.SchedHash {
		f.SchedParam = model.KeySrcIP
	}
	if sched == model.SchedSymhash {
		f.SchedParam = model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort
	}
	for i, b := range backends {
		ap := netip.MustParseAddrPort(b)
		be := model.NewBackend("b" + string(rune('1'+i)))
		be.Addr = ap.Addr()
		be.Port = ap.Port()
		f.Backends = append(f.Backends, be)
	}
	if err := f.Validate(); err != nil {
		tb.Fatalf("farm %s: %v", name, err)
	}
	if err := check(&f); err != nil {
		tb.Fatalf("farm %s: %v", name, err)
	}
	return &f
}

type (
	dataplaneDiff   = plan.Diff
	dataplaneChange = plan.FarmChange
)

// setTxChecksum turns transmit checksum offload of ifname in ns on or off
// (ethtool -K ifname tx on|off). Off, the kernel completes every checksum
// in software before the packet leaves, so a wrong checksum seed written by
// the program turns into a packet the receiver drops: veth peers otherwise
// trust offloaded (CHECKSUM_PARTIAL) checksums without ever computing them.
func setTxChecksum(tb testing.TB, ns netns.NsHandle, ifname string, on bool) {
	tb.Helper()
	const ethtoolSTXCSUM = 0x17
	setEthtoolFlag(tb, ns, ifname, ethtoolSTXCSUM, "tx checksumming", on)
}

// setEthtoolFlag sets one ethtool on/off value (an ETHTOOL_S* command with
// struct ethtool_value) of ifname in ns.
func setEthtoolFlag(tb testing.TB, ns netns.NsHandle, ifname string, cmd uint32, what string, on bool) {
	tb.Helper()
	val := struct{ cmd, data uint32 }{cmd: cmd}
	if on {
		val.data = 1
	}
	err := testutil.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var ifr [40]byte
		copy(ifr[:unix.IFNAMSIZ-1], ifname)
		*(*uintptr)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = uintptr(unsafe.Pointer(&val))
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr[0])))
		runtime.KeepAlive(&val)
		if errno != 0 {
			return errno
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("set %s of %s: %v", what, ifname, err)
	}
}

// addrUp gives interface name (in h's namespace) the address cidr and sets
// it up.
func addrUp(tb testing.TB, h *netlink.Handle, name, cidr string) netlink.Link {
	tb.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		tb.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		tb.Fatal(err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		tb.Fatalf("add %s to %s: %v", cidr, name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		tb.Fatal(err)
	}
	return l
}
