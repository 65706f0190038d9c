package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlb-lb/xlb/internal/kube/kubetest"
	"github.com/xlb-lb/xlb/internal/nsenter"
)

// topo is the traffic side of the benchmark. The bench runs in a network
// namespace of its own (bench/kube.sh), which plays the node; it adds two:
//
//	client (10.250.0.2) --veth kb-cl-- node --veth kb-ep-- pods (10.250.1.2)
//
// The pods namespace holds every endpoint address (10.129.0.0/16, on its
// loopback, routed there by the node) and one TCP listener on port 8080 of
// all of them, so "traffic reaches an endpoint" is literal. The node
// forwards; the proxies under test program the node's namespace.
type topo struct {
	client, pods netns.NsHandle
	names        []string
	ln           net.Listener
}

var (
	nodeClient = netip.MustParseAddr("10.250.0.1")
	clientAddr = netip.MustParseAddr("10.250.0.2")
	nodePods   = netip.MustParseAddr("10.250.1.1")
	podsAddr   = netip.MustParseAddr("10.250.1.2")
)

// topoIfaces are the node's interfaces towards client and pods (where the
// eBPF plane attaches).
var topoIfaces = []string{"kb-cl", "kb-ep"}

// podAddr is the address of endpoint i (0-based) in the pods namespace.
func podAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 129, byte(i / 250), byte(i%250 + 1)})
}

// inNS runs fn on a thread in ns.
func inNS(ns netns.NsHandle, fn func() error) error { return nsenter.Run(ns, fn) }

// newTopo builds the namespaces with prefix (names prefix-cl, prefix-ep),
// the listener with npods addresses, and the node's routes.
func newTopo(prefix string, npods int) (_ *topo, err error) {
	t := &topo{}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	node, err := netlink.NewHandle()
	if err != nil {
		return nil, err
	}
	defer node.Close()
	for _, side := range []struct {
		name, nodeIf  string
		ns            *netns.NsHandle
		nodeIP, local netip.Addr
	}{
		{prefix + "-cl", "kb-cl", &t.client, nodeClient, clientAddr},
		{prefix + "-ep", "kb-ep", &t.pods, nodePods, podsAddr},
	} {
		// netns.NewNamed moves the calling thread into the new
		// namespace: inNS brings it back.
		self, err := netns.Get()
		if err != nil {
			return nil, err
		}
		var h netns.NsHandle
		err = inNS(self, func() error {
			var err error
			h, err = netns.NewNamed(side.name)
			return err
		})
		self.Close()
		if err != nil {
			return nil, fmt.Errorf("create namespace %s: %w", side.name, err)
		}
		*side.ns = h
		t.names = append(t.names, side.name)
		la := netlink.NewLinkAttrs()
		la.Name = side.nodeIf
		veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(h)}
		if err := node.LinkAdd(veth); err != nil {
			return nil, fmt.Errorf("add veth %s: %w", side.nodeIf, err)
		}
		l, err := node.LinkByName(side.nodeIf)
		if err != nil {
			return nil, err
		}
		if err := node.AddrAdd(l, &netlink.Addr{IPNet: prefix24(side.nodeIP)}); err != nil {
			return nil, err
		}
		if err := node.LinkSetUp(l); err != nil {
			return nil, err
		}
		peer, err := netlink.NewHandleAt(h)
		if err != nil {
			return nil, err
		}
		err = func() error {
			defer peer.Close()
			for _, n := range []string{"lo", "eth0"} {
				pl, err := peer.LinkByName(n)
				if err != nil {
					return err
				}
				if err := peer.LinkSetUp(pl); err != nil {
					return err
				}
				if n == "eth0" {
					if err := peer.AddrAdd(pl, &netlink.Addr{IPNet: prefix24(side.local)}); err != nil {
						return err
					}
				}
			}
			return peer.RouteAdd(&netlink.Route{Gw: side.nodeIP.AsSlice()})
		}()
		if err != nil {
			return nil, fmt.Errorf("set up %s: %w", side.name, err)
		}
	}
	// Endpoint addresses on the pods' loopback, routed to them by the node.
	pods, err := netlink.NewHandleAt(t.pods)
	if err != nil {
		return nil, err
	}
	defer pods.Close()
	lo, err := pods.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	for i := range npods {
		a := podAddr(i)
		if err := pods.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return nil, fmt.Errorf("add pod address %s: %w", a, err)
		}
	}
	_, podNet, _ := net.ParseCIDR("10.129.0.0/16")
	if err := node.RouteAdd(&netlink.Route{Dst: podNet, Gw: podsAddr.AsSlice()}); err != nil {
		return nil, fmt.Errorf("route to the pods: %w", err)
	}
	// Cluster IPs that no proxy serves (yet, or any more) are refused by
	// the node with ICMP "administratively prohibited", which fails a
	// probe's connect at once, whatever routes the node has (as kube-proxy
	// rejects unallocated cluster IPs). Served ones are translated before
	// the route lookup (prerouting, tcx ingress). (Without it this node,
	// which has no route there, answers net unreachable, which also fails
	// a connect in SYN_SENT at once; the commit that added this blamed the
	// timeouts then seen on that, wrongly: they came from probing one
	// connection at a time.)
	_, svcNet, _ := net.ParseCIDR(kubetest.ServiceCIDR4)
	if err := node.RouteAdd(&netlink.Route{Dst: svcNet, Type: unix.RTN_PROHIBIT}); err != nil {
		return nil, fmt.Errorf("prohibit route for the cluster IPs: %w", err)
	}
	// The node forwards. A probe to an address not (yet) served gets an
	// ICMP unreachable from the node (it has no route there), which
	// fails the probe at once only if ICMP errors are not rate limited.
	for _, s := range []struct{ path, v string }{
		{"net/ipv4/ip_forward", "1"},
		{"net/ipv4/conf/all/rp_filter", "0"}, {"net/ipv4/conf/default/rp_filter", "0"},
		{"net/ipv4/icmp_ratelimit", "0"}, {"net/ipv4/icmp_msgs_per_sec", "1000000"}, {"net/ipv4/icmp_msgs_burst", "1000000"},
	} {
		if err := os.WriteFile(filepath.Join("/proc/sys", s.path), []byte(s.v), 0o644); err != nil {
			return nil, err
		}
	}
	err = inNS(t.pods, func() error {
		var err error
		t.ln, err = net.Listen("tcp4", "0.0.0.0:8080")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen in the pods namespace: %w", err)
	}
	go serve(t.ln)
	return t, nil
}

func prefix24(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(24, 32)}
}

// serve answers every connection with its local address and closes it.
func serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte(c.LocalAddr().String() + "\n"))
		c.Close()
	}
}

func (t *topo) close() {
	if t.ln != nil {
		t.ln.Close()
	}
	if l, err := netlink.LinkByName("kb-cl"); err == nil {
		_ = netlink.LinkDel(l)
	}
	if l, err := netlink.LinkByName("kb-ep"); err == nil {
		_ = netlink.LinkDel(l)
	}
	for _, h := range []netns.NsHandle{t.client, t.pods} {
		if h > 0 {
			h.Close()
		}
	}
	for _, n := range t.names {
		_ = netns.DeleteNamed(n)
	}
}

// probe opens one new TCP connection from the client to addr and reads the
// endpoint's answer (the address it was reached on): nil if an endpoint
// answered within timeout.
func (t *topo) probe(ctx context.Context, addr netip.AddrPort, timeout time.Duration) (string, error) {
	var c net.Conn
	err := inNS(t.client, func() error {
		d := net.Dialer{Timeout: timeout}
		var err error
		c, err = d.DialContext(ctx, "tcp4", addr.String())
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if n > 0 {
		return string(buf[:n]), nil
	}
	if err == nil {
		err = errors.New("no answer")
	}
	return "", err
}

// mountBPFFS mounts a bpf file system of the benchmark's own on a
// temporary directory; the returned function unmounts it (dropping every
// pin, which detaches the program).
func mountBPFFS() (string, func(), error) {
	dir, err := os.MkdirTemp("", "xlb-kubebench-bpffs-")
	if err != nil {
		return "", nil, err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return filepath.Join(dir, "xlb"), func() {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		os.Remove(dir)
	}, nil
}
