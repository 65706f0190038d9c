package kube

import (
	"net/netip"
	"slices"
	"testing"
)

// TestFilterNodePortAddrs: kube-proxy's per-family rule (a family without
// a prefix takes all its addresses), loopback and link-local never.
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
		{"both families", []netip.Prefix{p("10.0.0.0/8"), p("2001:db8:1::2/128")}, []netip.Addr{a("10.0.0.5"), a("2001:db8:1::2")}},
		{"localhost: nothing", []netip.Prefix{p("127.0.0.0/8"), p("::1/128")}, nil},
		{"all: no loopback, no link-local", []netip.Prefix{p("0.0.0.0/0"), p("::/0")}, []netip.Addr{a("10.0.0.5"), a("192.168.1.2"), a("2001:db8::5"), a("2001:db8:1::2")}},
	} {
		if got := FilterNodePortAddrs(ifs, c.within); !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}
