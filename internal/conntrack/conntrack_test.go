package conntrack

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func flow(proto uint8, dst string, dport uint16, replySrc string, replySport uint16) *netlink.ConntrackFlow {
	f := &netlink.ConntrackFlow{}
	f.Forward.Protocol = proto
	f.Forward.DstIP = net.ParseIP(dst)
	f.Forward.DstPort = dport
	f.Reverse.SrcIP = net.ParseIP(replySrc)
	f.Reverse.SrcPort = replySport
	return f
}

// The filter matches the connections a farm sent to one backend, and no
// others (the checks' own connections go to the backend directly, not
// through a VIP).
func TestBackendFilter(t *testing.T) {
	m := backendFilter{vips: []netip.Addr{netip.MustParseAddr("10.99.0.1")}, addr: netip.MustParseAddr("10.200.0.12"), port: 8080, proto: unix.IPPROTO_TCP}
	for _, c := range []struct {
		f    *netlink.ConntrackFlow
		want bool
	}{
		{flow(unix.IPPROTO_TCP, "10.99.0.1", 80, "10.200.0.12", 8080), true},
		{flow(unix.IPPROTO_TCP, "10.99.0.1", 80, "10.200.0.13", 8080), false},     // another backend
		{flow(unix.IPPROTO_TCP, "10.99.0.1", 80, "10.200.0.12", 9090), false},     // another port
		{flow(unix.IPPROTO_UDP, "10.99.0.1", 80, "10.200.0.12", 8080), false},     // another protocol
		{flow(unix.IPPROTO_TCP, "10.99.0.2", 80, "10.200.0.12", 8080), false},     // another VIP
		{flow(unix.IPPROTO_TCP, "10.200.0.12", 8080, "10.200.0.12", 8080), false}, // a health check
	} {
		if got := m.MatchConntrackFlow(c.f); got != c.want {
			t.Errorf("%v -> %v: %v, want %v", c.f.Forward.DstIP, c.f.Reverse.SrcIP, got, c.want)
		}
	}
	// A firewall-mark farm has no VIP: any destination; port 0: any port.
	any := backendFilter{addr: netip.MustParseAddr("10.200.0.12")}
	if !any.MatchConntrackFlow(flow(unix.IPPROTO_UDP, "192.0.2.1", 53, "10.200.0.12", 53)) {
		t.Error("mark farm backend not matched")
	}
}
