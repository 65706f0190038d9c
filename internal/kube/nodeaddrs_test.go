package kube

import (
	"net/netip"
	"slices"
	"testing"
)

// TestFilterNodePortAddrs: kube-proxy's per-family rule (a family without
// a prefix takes all its addresses); 127.0.0.1 only when a prefix names it
// (localhost NodePorts, kube-proxy's iptables mode); ::1 and link-local
// never.
func TestFilterNodePortAddrs(t *testing.T) {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	ifs := []netip.Addr{a("127.0.0.1"), a("10.0.0.5"), a("192.168.1.2"), a("::1"), a("fe80::1"), a("2001:db8::5"), a("2001:db8:1::2")}
	for _, c := range []struct {
		name   string
		within []netip.Prefix
		want   []netip.Addr
	}{
		{"ipv4 CIDR: every IPv6 address", []netip.Prefix{p("192.168.0.0/16")}, []netip.Addr{a("192.168.1.2"), a("2001:db8::5"), a("2001:db8:1::2")}},
		{"ipv6 CIDR: every IPv4 address but loopback", []netip.Prefix{p("2001:db8::/64")}, []netip.Addr{a("10.0.0.5"), a("192.168.1.2"), a("2001:db8::5")}},
		{"both families", []netip.Prefix{p("10.0.0.0/8"), p("2001:db8:1::2/128")}, []netip.Addr{a("10.0.0.5"), a("2001:db8:1::2")}},
		{"localhost: 127.0.0.1, not ::1", []netip.Prefix{p("127.0.0.0/8"), p("::1/128")}, []netip.Addr{a("127.0.0.1")}},
		{"all: 127.0.0.1, no ::1, no link-local", []netip.Prefix{p("0.0.0.0/0"), p("::/0")}, []netip.Addr{a("127.0.0.1"), a("10.0.0.5"), a("192.168.1.2"), a("2001:db8::5"), a("2001:db8:1::2")}},
	} {
		if got := FilterNodePortAddrs(ifs, c.within); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestLocalhostNodePorts(t *testing.T) {
	p := netip.MustParsePrefix
	for _, c := range []struct {
		within []netip.Prefix
		want   bool
	}{
		{nil, false},
		{[]netip.Prefix{p("10.0.0.0/8"), p("::1/128")}, false},
		{[]netip.Prefix{p("127.0.0.0/8")}, true},
		{[]netip.Prefix{p("0.0.0.0/0")}, true},
	} {
		if got := LocalhostNodePorts(c.within); got != c.want {
			t.Errorf("%v: %v, want %v", c.within, got, c.want)
		}
	}
}
