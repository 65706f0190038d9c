package nft

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/xlb-lb/xlb/internal/dataplane/plan"
	"github.com/xlb-lb/xlb/internal/model"
	"github.com/xlb-lb/xlb/internal/testutil"
)

// TestCheck: every field value the plane does not implement is refused
// with a *model.FieldError naming the field.
func TestCheck(t *testing.T) {
	base := func() model.Farm {
		f := model.NewFarm("f")
		f.VirtualAddr = netip.MustParseAddr("10.0.0.1")
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		b := model.NewBackend("b")
		b.Addr = netip.MustParseAddr("10.0.1.1")
		f.Backends = []model.Backend{b}
		return f
	}
	ok := base()
	p := &Plane{}
	if err := p.Check(&ok); err != nil {
		t.Fatalf("plain farm refused: %v", err)
	}
	cases := []struct {
		field string
		edit  func(f *model.Farm)
	}{
		// dsr: per-packet schedulers only for udp; nothing that needs conntrack.
		{"scheduler", func(f *model.Farm) { f.Mode = model.ModeDSR }},
		{"persistence", func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam, f.Persistence = model.ModeDSR, model.SchedHash, model.KeySrcIP, model.KeySrcIP
		}},
		{"est-connlimit", func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam, f.EstConnLimit = model.ModeDSR, model.SchedHash, model.KeySrcIP, 5
		}},
		{"new-rtlimit", func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam, f.NewRTLimit = model.ModeDSR, model.SchedMaglev, 0, 5
		}},
		{"log", func(f *model.Farm) {
			f.Mode, f.Protocol, f.Log = model.ModeDSR, model.ProtoUDP, model.LogForward
		}},
		{"mark", func(f *model.Farm) {
			f.Mode, f.Protocol, f.Backends[0].Mark = model.ModeDSR, model.ProtoUDP, 3
		}},
		{"scheduler", func(f *model.Farm) { f.Mode = model.ModeStlsDNAT }},
		{"mode", func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP
			f.VirtualAddr, f.VirtualPorts, f.Mark = netip.Addr{}, nil, 7
		}},
		{"mode", func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP
			b := f.Backends[0]
			b.Name, b.Addr, b.Port = "b2", netip.MustParseAddr("10.0.1.2"), 8081
			f.Backends[0].Port = 8080
			f.Backends = append(f.Backends, b)
		}},
		{"protocol", func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP
			f.Protocol = model.ProtoSCTP
		}},
		{"persistence", func(f *model.Farm) {
			f.VirtualAddr, f.Family = netip.MustParseAddr("fd00::1"), model.FamilyIPv6
			f.Backends[0].Addr = netip.MustParseAddr("fd00:1::1")
			f.Persistence = model.KeySrcIP | model.KeyDstIP
		}},
		{"mark", func(f *model.Farm) { f.Mark = 7 }},
		{"mark", func(f *model.Farm) { f.Mark = 7; f.VirtualAddr = netip.Addr{}; f.Helper = model.HelperFTP }},
		{"family", func(f *model.Farm) { f.Family = model.FamilyDual }},
		// Each half of a dual farm is checked: here the IPv6 half's
		// persistence key is too long.
		{"persistence", func(f *model.Farm) {
			f.Family, f.VirtualAddr2 = model.FamilyDual, netip.MustParseAddr("fd00::1")
			f.Persistence = model.KeySrcIP | model.KeyDstIP
		}},
		// Policies are checked at prerouting, which stlsdnat bypasses.
		{"policies", func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP
			f.Policies = []model.PolicyRef{{Name: "deny"}}
		}},
		{"mark", func(f *model.Farm) {
			b := f.Backends[0]
			b.Name, b.Addr, b.Mark = "b2", netip.MustParseAddr("10.0.1.2"), 1
			f.Backends[0].Mark = 1
			f.Backends = append(f.Backends, b)
		}},
		{"est-connlimit", func(f *model.Farm) { f.Backends[0].EstConnLimit = 1; f.Persistence = model.KeySrcIP }},
		{"backends.port", func(f *model.Farm) {
			f.VirtualPorts = append(f.VirtualPorts, model.PortRange{First: 443, Last: 443})
			b := f.Backends[0]
			b.Name, b.Port = "b2", 8443
			f.Backends = append(f.Backends, b)
		}},
	}
	for _, c := range cases {
		f := base()
		c.edit(&f)
		err := p.Check(&f)
		var fe *model.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: Check = %v, want a FieldError on %q", c.field, err, c.field)
		}
	}
	// Implemented: hash keys, protocols, weight, dnat, ipv6, mixed ports
	// with one virtual port.
	for _, edit := range []func(f *model.Farm){
		func(f *model.Farm) {
			f.Scheduler = model.SchedHash
			f.SchedParam = model.KeySrcIP | model.KeyDstIP | model.KeySrcPort | model.KeyDstPort
		},
		func(f *model.Farm) { f.Protocol = model.ProtoSCTP },
		func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP
			f.VirtualAddr, f.Family = netip.MustParseAddr("fd00::1"), model.FamilyIPv6
			f.Backends[0].Addr = netip.MustParseAddr("fd00:1::1")
		},
		func(f *model.Farm) { f.Protocol = model.ProtoAll; f.VirtualPorts = nil },
		func(f *model.Farm) { f.Scheduler = model.SchedWeight; f.Mode = model.ModeDNAT },
		func(f *model.Farm) {
			f.Family, f.VirtualAddr2 = model.FamilyDual, netip.MustParseAddr("fd00::1")
			b := f.Backends[0]
			b.Name, b.Addr = "b6", netip.MustParseAddr("fd00:1::1")
			f.Backends = append(f.Backends, b)
		},
		func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam = model.ModeDSR, model.SchedHash, model.KeySrcIP
		},
		func(f *model.Farm) {
			f.Mode, f.Scheduler = model.ModeDSR, model.SchedSymhash
			f.SchedParam = model.KeySrcIP
		},
		func(f *model.Farm) {
			f.Mode, f.Protocol, f.Scheduler = model.ModeDSR, model.ProtoUDP, model.SchedWeight
		},
		func(f *model.Farm) {
			f.Mode, f.Protocol, f.Iface, f.Oface = model.ModeDSR, model.ProtoUDP, "eth0", "eth1"
			f.EtherAddr = model.EtherAddr{2, 0, 0, 0, 0, 1}
			f.Backends[0].EtherAddr = model.EtherAddr{2, 0, 0, 0, 0, 2}
		},
		func(f *model.Farm) {
			b := f.Backends[0]
			b.Name, b.Port = "b2", 8080
			f.Backends = append(f.Backends, b)
		},
	} {
		f := base()
		edit(&f)
		if err := p.Check(&f); err != nil {
			t.Errorf("refused: %v", err)
		}
	}
}

var (
	genRE     = regexp.MustCompile(`([mai]-[0-9a-f]{16})-[0-9a-z]+`)
	counterRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	elemsRE   = regexp.MustCompile(`elements = \{ (.*) \}`)
)

// normalize makes an nft listing comparable: map generations and counter
// values are blanked, elements sorted, lines trimmed and sorted.
func normalize(s string) []string {
	var out []string
	lines := strings.Split(s, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		// nft wraps long element lists: join them back.
		for strings.HasPrefix(l, "elements = {") && !strings.HasSuffix(l, "}") && i+1 < len(lines) {
			i++
			l += " " + strings.TrimSpace(lines[i])
		}
		l = genRE.ReplaceAllString(l, "$1-GEN")
		l = counterRE.ReplaceAllString(l, "counter")
		if m := elemsRE.FindStringSubmatch(l); m != nil {
			items := strings.Split(m[1], ", ")
			sort.Strings(items)
			l = "elements = { " + strings.Join(items, ", ") + " }"
		}
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// TestListing compares `nft list table inet xlb` for a small state with
// the expected ruleset (sorted lines, as kube-proxy's nftables tests do).
func TestListing(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	name, ns := testutil.NewNetNS(t)
	p := newPlane(t, ns)
	web := model.NewFarm("web")
	web.VirtualAddr = netip.MustParseAddr("10.99.0.1")
	web.VirtualPorts = []model.PortRange{{First: 80, Last: 80}, {First: 8000, Last: 8010}}
	for i, a := range []string{"10.200.0.11", "10.200.0.12"} {
		b := model.NewBackend([]string{"a", "b"}[i])
		b.Addr = netip.MustParseAddr(a)
		b.Port = 8080
		web.Backends = append(web.Backends, b)
	}
	dns := model.NewFarm("dns6")
	dns.Family = model.FamilyIPv6
	dns.VirtualAddr = netip.MustParseAddr("fd00:99::1")
	dns.VirtualPorts = []model.PortRange{{First: 53, Last: 53}}
	dns.Protocol = model.ProtoUDP
	dns.Mode = model.ModeDNAT
	dns.Scheduler = model.SchedWeight
	for i, a := range []string{"fd00:200::11", "fd00:200::12"} {
		b := model.NewBackend([]string{"a", "b"}[i])
		b.Addr = netip.MustParseAddr(a)
		b.Weight = uint32(i + 1)
		dns.Backends = append(dns.Backends, b)
	}
	h := model.NewFarm("hash")
	h.VirtualAddr = netip.MustParseAddr("10.99.0.2")
	h.Scheduler = model.SchedHash
	h.SchedParam = model.KeySrcIP | model.KeySrcPort
	h.SourceAddr = netip.MustParseAddr("10.99.0.200")
	b := model.NewBackend("a")
	b.Addr = netip.MustParseAddr("10.200.0.11")
	h.Backends = []model.Backend{b}
	empty := model.NewFarm("empty")
	empty.VirtualAddr = netip.MustParseAddr("10.99.0.3")
	empty.Protocol = model.ProtoAll
	sticky := model.NewFarm("sticky")
	sticky.VirtualAddr = netip.MustParseAddr("10.99.0.4")
	sticky.VirtualPorts = []model.PortRange{{First: 443, Last: 443}}
	sticky.Persistence, sticky.PersistTTL = model.KeySrcIP|model.KeyDstPort, 120
	sticky.NewRTLimit, sticky.NewRTBurst = 100, 20
	sticky.EstConnLimit = 1000
	sticky.TCPStrict = true
	sticky.RstRTLimit, sticky.RstRTBurst = 10, 5
	sticky.Log, sticky.LogPrefix = model.LogForward, "stk"
	b = model.NewBackend("a")
	b.Addr = netip.MustParseAddr("10.200.0.11")
	sticky.Backends = []model.Backend{b}
	stls := model.NewFarm("stls")
	stls.VirtualAddr = netip.MustParseAddr("10.99.0.5")
	stls.VirtualPorts = []model.PortRange{{First: 53, Last: 53}}
	stls.Protocol = model.ProtoUDP
	stls.Mode = model.ModeStlsDNAT
	stls.Scheduler, stls.SchedParam = model.SchedHash, model.KeySrcIP
	b = model.NewBackend("a")
	b.Addr, b.Port = netip.MustParseAddr("10.200.0.11"), 5353
	stls.Backends = []model.Backend{b}
	// One backend, single ports: a direct farm (no chain of its own).
	one := model.NewFarm("one")
	one.VirtualAddr = netip.MustParseAddr("10.99.0.6")
	one.VirtualPorts = []model.PortRange{{First: 80, Last: 80}, {First: 443, Last: 443}}
	b = model.NewBackend("a")
	b.Addr = netip.MustParseAddr("10.200.0.11")
	one.Backends = []model.Backend{b}
	var d plan.Diff
	for _, f := range []model.Farm{web, dns, h, empty, sticky, stls, one} {
		d.Changes = append(d.Changes, plan.FarmChange{New: mustValid(t, p, &f)})
	}
	if err := p.Apply(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	got := normalize(testutil.Run(t, name, "nft", "list", "table", "inet", "xlb"))
	r := strings.NewReplacer(
		"WEB", chainName("web"), "EMPTY", chainName("empty"),
		"SEED", fmt.Sprintf("0x%08x", plan.FlowSeed),
		"MWEB", "m-"+nameHash("web"), "MDNS", "m-"+nameHash("dns6"), "MHASH", "m-"+nameHash("hash"),
		"STICKYF", "g-"+nameHash("sticky"), "STICKYL", "l-"+nameHash("sticky"), "STICKY", chainName("sticky"), "MSTICKY", "m-"+nameHash("sticky"),
		"ASTICKY", "a-"+nameHash("sticky"), "PSTICKY", "p-"+nameHash("sticky"),
		"NSTICKY", "nl-"+nameHash("sticky"), "RSTICKY", "rl-"+nameHash("sticky"), "ESTICKY", "el-"+nameHash("sticky"),
		// nft prints the slot map's mark data byte-swapped (display only).
		"ID_NFT_LISTS_SWAPPED", fmt.Sprintf("0x%08x", bits.ReverseBytes32(backendID(sticky.Backends[0]))),
		"ID", fmt.Sprintf("0x%08x", backendID(sticky.Backends[0])),
		"STLSR", "r-"+nameHash("stls"), "STLS", chainName("stls"), "MSTLS", "m-"+nameHash("stls"), "XSEED", fmt.Sprintf("0x%08x", plan.FlowSeed),
	)
	want := normalize(r.Replace(wantListing))
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("listing differs\n got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// wantListing is `nft list table inet xlb` (nft 1.0.6) for TestListing's
// farms. WEB, DNS, ... stand for the derived names.
const wantListing = `
table inet xlb {
	map svcx4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.99.0.1 . tcp . 80 : goto WEB, 10.99.0.4 . tcp . 443 : goto STICKY, 10.99.0.6 . tcp . 80 : goto direct4, 10.99.0.6 . tcp . 443 : goto direct4 }
	}
	map svcx6 {
		type ipv6_addr . inet_proto . inet_service : verdict
		elements = { fd00:99::1 . udp . 53 : goto grp6-0 }
	}
	set masqx4 {
		type ipv4_addr . inet_proto . inet_service
		elements = { 10.99.0.1 . tcp . 80, 10.99.0.4 . tcp . 443, 10.99.0.6 . tcp . 80, 10.99.0.6 . tcp . 443 }
	}
	set masqx6 {
		type ipv6_addr . inet_proto . inet_service
	}
	map snatx4 {
		type ipv4_addr . inet_proto . inet_service : ipv4_addr
	}
	map snatx6 {
		type ipv6_addr . inet_proto . inet_service : ipv6_addr
	}
	map svc4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		flags interval
		elements = { 10.99.0.1 . tcp . 8000-8010 : goto WEB, 10.99.0.2 . tcp . 0-65535 : goto grp4-0, 10.99.0.3 . 0-255 . 0-65535 : goto EMPTY }
	}
	map svc6 {
		type ipv6_addr . inet_proto . inet_service : verdict
		flags interval
	}
	set masq4 {
		type ipv4_addr . inet_proto . inet_service
		flags interval
		elements = { 10.99.0.1 . tcp . 8000-8010, 10.99.0.3 . 0-255 . 0-65535 }
	}
	set masq6 {
		type ipv6_addr . inet_proto . inet_service
		flags interval
	}
	map snat4 {
		type ipv4_addr . inet_proto . inet_service : ipv4_addr
		flags interval
		elements = { 10.99.0.2 . tcp . 0-65535 : 10.99.0.200 }
	}
	map snat6 {
		type ipv6_addr . inet_proto . inet_service : ipv6_addr
		flags interval
	}
	map MWEB-GEN {
		type 0 : ipv4_addr . inet_service
		size 2
		elements = { 0 : 10.200.0.11 . 8080, 1 : 10.200.0.12 . 8080 }
	}
	map MDNS-GEN {
		type 0 : ipv6_addr
		flags interval
		elements = { 0 : fd00:200::11, 1-2 : fd00:200::12 }
	}
	map MHASH-GEN {
		type 0 : ipv4_addr
		size 1
		elements = { 0 : 10.200.0.11 }
	}
	map fwm4 {
		type mark : verdict
	}
	map fwm6 {
		type mark : verdict
	}
	set masqm {
		type mark
	}
	map snatm4 {
		type mark : ipv4_addr
	}
	map snatm6 {
		type mark : ipv6_addr
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		meta nfproto ipv4 meta mark vmap @fwm4
		meta nfproto ipv6 meta mark vmap @fwm6
		meta mark 0x786d0000/16 accept
		ip daddr . meta l4proto . th dport vmap @svcx4
		ip6 daddr . meta l4proto . th dport vmap @svcx6
		ip daddr . meta l4proto . th dport vmap @svc4
		ip6 daddr . meta l4proto . th dport vmap @svc6
	}
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr . meta l4proto . th dport @nolocal4 accept
		ip6 daddr . meta l4proto . th dport @nolocal6 accept
		meta nfproto ipv4 meta mark vmap @fwm4
		meta nfproto ipv6 meta mark vmap @fwm6
		meta mark 0x786d0000/16 accept
		ip daddr . meta l4proto . th dport vmap @svcx4
		ip6 daddr . meta l4proto . th dport vmap @svcx6
		ip daddr . meta l4proto . th dport vmap @svc4
		ip6 daddr . meta l4proto . th dport vmap @svc6
	}
	chain checks {
		type filter hook output priority raw; policy accept;
		meta mark 0x786c6263 notrack
	}
	map log4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		flags interval
		elements = { 10.99.0.4 . tcp . 443 : jump STICKYL }
	}
	map log6 {
		type ipv6_addr . inet_proto . inet_service : verdict
		flags interval
	}
	chain STICKYL {
		log prefix "stk"
	}
	map snatb4 {
		type ipv4_addr . inet_proto . inet_service . ipv4_addr : ipv4_addr
		flags interval
	}
	map snatb6 {
		type ipv6_addr . inet_proto . inet_service . ipv6_addr : ipv6_addr
		flags interval
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark 0x786d0000/16 goto post-src
		ct original ip daddr . meta l4proto . ct original proto-dst vmap @log4
		ct original ip6 daddr . meta l4proto . ct original proto-dst vmap @log6
		snat ip to ct original ip daddr . meta l4proto . ct original proto-dst . ip daddr map @snatb4
		snat ip6 to ct original ip6 daddr . meta l4proto . ct original proto-dst . ip6 daddr map @snatb6
		snat ip to ct original ip daddr . meta l4proto . ct original proto-dst map @snatx4
		ct original ip daddr . meta l4proto . ct original proto-dst @masqx4 masquerade
		snat ip6 to ct original ip6 daddr . meta l4proto . ct original proto-dst map @snatx6
		ct original ip6 daddr . meta l4proto . ct original proto-dst @masqx6 masquerade
		snat ip to ct original ip daddr . meta l4proto . ct original proto-dst map @snat4
		ct original ip daddr . meta l4proto . ct original proto-dst @masq4 masquerade
		snat ip6 to ct original ip6 daddr . meta l4proto . ct original proto-dst map @snat6
		ct original ip6 daddr . meta l4proto . ct original proto-dst @masq6 masquerade
		meta nfproto ipv4 snat ip to meta mark map @snatm4
		meta nfproto ipv6 snat ip6 to meta mark map @snatm6
		meta mark @masqm masquerade
		ip saddr . ip daddr @hairpin4 masquerade
		ip6 saddr . ip6 daddr @hairpin6 masquerade
	}
	chain post-src {
		meta nfproto ipv4 snat ip to meta mark map @snatm4
		meta nfproto ipv6 snat ip6 to meta mark map @snatm6
		meta mark @masqm masquerade
		ip saddr . ip daddr @hairpin4 masquerade
		ip6 saddr . ip6 daddr @hairpin6 masquerade
	}
	set hairpin4 {
		type ipv4_addr . ipv4_addr
	}
	set hairpin6 {
		type ipv6_addr . ipv6_addr
		elements = { fd00:200::11 . fd00:200::11, fd00:200::12 . fd00:200::12 }
	}
	set nolocal4 {
		type ipv4_addr . inet_proto . inet_service
		flags interval
	}
	set nolocal6 {
		type ipv6_addr . inet_proto . inet_service
		flags interval
	}
	chain WEB {
		counter packets 0 bytes 0 dnat ip to numgen inc mod 2 map @MWEB-GEN
		counter packets 0 bytes 0 drop
	}
	chain grp6-0 {
		@nh,192,128 0xfd000099000000000000000000000001 udp dport 53 counter packets 0 bytes 0 dnat ip6 to numgen random mod 3 map @MDNS-GEN comment "farm dns6"
		counter packets 0 bytes 0 drop
	}
	chain grp4-0 {
		@nh,128,32 0xa630002 meta l4proto tcp meta nfproto ipv4 counter packets 0 bytes 0 dnat ip to jhash ip saddr . tcp sport mod 1 seed SEED map @MHASH-GEN comment "farm hash"
		counter packets 0 bytes 0 drop
	}
	chain EMPTY {
		meta l4proto tcp counter packets 0 bytes 0 reject with tcp reset
		counter packets 0 bytes 0 reject
	}
	map fsvc4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		flags interval
		elements = { 10.99.0.4 . tcp . 443 : goto STICKYF }
	}
	map fsvc6 {
		type ipv6_addr . inet_proto . inet_service : verdict
		flags interval
	}
	map stls4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		flags interval
		elements = { 10.99.0.5 . udp . 53 : goto STLS }
	}
	map stls6 {
		type ipv6_addr . inet_proto . inet_service : verdict
		flags interval
	}
	map stlsr4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		flags interval
		elements = { 10.200.0.11 . udp . 5353 : goto STLSR }
	}
	map stlsr6 {
		type ipv6_addr . inet_proto . inet_service : verdict
		flags interval
	}
	map MSTLS-GEN {
		type 0 : ipv4_addr
		size 1
		elements = { 0 : 10.200.0.11 }
	}
	map dst4 {
		type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
		elements = { 10.99.0.6 . tcp . 80 : 10.200.0.11 . 80, 10.99.0.6 . tcp . 443 : 10.200.0.11 . 443 }
	}
	map dst6 {
		type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service
	}
	chain direct4 {
		meta nfproto ipv4 counter dnat ip to ip daddr . meta l4proto . th dport map @dst4
		counter drop
	}
	chain direct6 {
		meta nfproto ipv6 counter dnat ip6 to ip6 daddr . meta l4proto . th dport map @dst6
		counter drop
	}
	chain raw {
		type filter hook prerouting priority raw; policy accept;
		ip daddr . meta l4proto . th dport vmap @stls4
		ip saddr . meta l4proto . th sport vmap @stlsr4
		ip6 daddr . meta l4proto . th dport vmap @stls6
		ip6 saddr . meta l4proto . th sport vmap @stlsr6
	}
	chain STLS {
		notrack ip daddr set jhash ip saddr mod 1 seed XSEED map @MSTLS-GEN th dport set 5353 counter accept
		counter drop
	}
	chain STLSR {
		meta nfproto ipv4 notrack ip saddr set 10.99.0.5 th sport set 53 counter accept
	}
	chain filter {
		type filter hook prerouting priority dstnat - 5; policy accept;
		ct label 127 accept
		ip daddr . meta l4proto . th dport vmap @fsvc4
		ip6 daddr . meta l4proto . th dport vmap @fsvc6
	}
	chain STICKYF {
		ct state invalid counter log prefix "tcp-strict-sticky " drop
		tcp flags rst add @RSTICKY-4-120 { ip saddr limit rate over 10/second } counter log prefix "rst-rtlimit-sticky " drop
	}
	set NSTICKY-4-120 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 2m
	}
	set RSTICKY-4-120 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 2m
	}
	set ESTICKY-4 {
		type ipv4_addr
		size 65535
		flags dynamic
	}
	map MSTICKY-GEN {
		type 0 : mark
		size 1
		elements = { 0 : ID_NFT_LISTS_SWAPPED }
	}
	map ASTICKY-GEN {
		type mark : ipv4_addr
		elements = { ID : 10.200.0.11 }
	}
	map PSTICKY-49-120 {
		type ipv4_addr . inet_service : mark
		size 65535
		flags dynamic,timeout
		timeout 2m
	}
	chain STICKY {
		add @NSTICKY-4-120 { ip saddr limit rate over 100/second burst 20 packets } counter log prefix "new-rtlimit-sticky " drop
		add @ESTICKY-4 { ip saddr ct count over 1000 } counter log prefix "est-connlimit-sticky " drop
		ct mark set ip saddr . th dport map @PSTICKY-49-120 update @PSTICKY-49-120 { ip saddr . th dport : ct mark } counter dnat ip to ct mark map @ASTICKY-GEN
		delete @PSTICKY-49-120 { ip saddr . th dport : ct mark }
		meta nfproto ipv4 ct mark set numgen inc mod 1 map @MSTICKY-GEN add @PSTICKY-49-120 { ip saddr . th dport : ct mark } counter dnat ip to ct mark map @ASTICKY-GEN
		ct mark set numgen inc mod 1 map @MSTICKY-GEN counter dnat ip to ct mark map @ASTICKY-GEN
		counter drop
	}
}
`

// ruleHandles returns a farm's rules with their handles (`nft -a`), the
// things a change to another farm must not touch: its own chain, or its
// rules in a group chain.
func ruleHandles(t *testing.T, ns, farm string) string {
	t.Helper()
	var out []string
	for _, r := range farmRuleLines(testutil.Run(t, ns, "nft", "-a", "list", "table", "inet", "xlb"), farm) {
		out = append(out, r.chain+": "+r.line)
	}
	if len(out) == 0 {
		t.Fatalf("farm %s has no rules in the kernel", farm)
	}
	return strings.Join(out, "\n")
}

// TestChangeTouchesOnlyItsOwn: adding, changing and deleting farm B leaves
// farm A's chain (rule handles), backend map and elements as they were.
func TestChangeTouchesOnlyItsOwn(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	name, ns := testutil.NewNetNS(t)
	p := newPlane(t, ns)
	mk := func(n string, vip string, backends ...string) *model.Farm {
		f := model.NewFarm(n)
		f.VirtualAddr = netip.MustParseAddr(vip)
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		for i, a := range backends {
			b := model.NewBackend(string(rune('a' + i)))
			b.Addr = netip.MustParseAddr(a)
			f.Backends = append(f.Backends, b)
		}
		return mustValid(t, p, &f)
	}
	apply := func(cs ...plan.FarmChange) {
		t.Helper()
		if err := p.Apply(context.Background(), plan.Diff{Changes: cs}); err != nil {
			t.Fatal(err)
		}
	}
	a := mk("a", "10.99.0.1", "10.200.0.11", "10.200.0.12")
	apply(plan.FarmChange{New: a})
	before := ruleHandles(t, name, "a")
	mapA := p.shards[0].farms["a"].mapName
	elemsA := testutil.Run(t, name, "nft", "list", "map", "inet", "xlb", mapA)

	b1 := mk("b", "10.99.0.2", "10.200.0.13")
	apply(plan.FarmChange{New: b1})
	b2 := mk("b", "10.99.0.2", "10.200.0.13", "10.200.0.14")
	apply(plan.FarmChange{Old: b1, New: b2})
	apply(plan.FarmChange{Old: b2})

	if after := ruleHandles(t, name, "a"); after != before {
		t.Errorf("farm a's chain changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if p.shards[0].farms["a"].mapName != mapA {
		t.Errorf("farm a's map renamed")
	}
	if got := testutil.Run(t, name, "nft", "list", "map", "inet", "xlb", mapA); got != elemsA {
		t.Errorf("farm a's map changed:\n%s\nwas:\n%s", got, elemsA)
	}
	if out := testutil.Run(t, name, "nft", "list", "table", "inet", "xlb"); hasFarmRules(out, "b") || strings.Contains(out, "10.99.0.2") {
		t.Errorf("farm b left objects behind:\n%s", out)
	}
}

// TestApplyAtomic: an Apply the kernel rejects (a second farm on a VIP and
// port that farm a already has: the interval map refuses the overlap)
// changes nothing, neither in the kernel nor in the plane's memory.
func TestApplyAtomic(t *testing.T) {
	e := newEnv(t, 2, false)
	t.Parallel()
	e.startServers(t, 8080)
	vip := testutil.VIP4(1)
	prev := map[string]*model.Farm{}
	a := e.farm("a", vip, 80, model.ProtoTCP, 8080)
	e.put(t, prev, a)
	before := e.nft(t, "-a", "list", "table", "inet", "xlb")

	a2 := a.Clone()
	a2.Backends = a2.Backends[:1]
	clash := e.farm("clash", vip, 80, model.ProtoTCP, 8080)
	d := plan.Diff{Changes: []plan.FarmChange{
		{Old: prev["a"], New: mustValid(t, e.p, &a2)},
		{New: mustValid(t, e.p, &clash)},
	}}
	if err := e.p.Apply(context.Background(), d); err == nil {
		t.Fatal("overlapping farms applied, want the kernel to refuse")
	} else {
		t.Logf("rejected as expected: %v", err)
	}
	if after := e.nft(t, "-a", "list", "table", "inet", "xlb"); after != before {
		t.Fatalf("failed Apply changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	c := e.count(t, 10, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n })
	if c["b0"] != 5 || c["b1"] != 5 {
		t.Errorf("after a failed Apply: %v, want both backends as before", c)
	}
	// The plane still knows what the kernel holds: the same change without
	// the clash applies cleanly.
	e.put(t, prev, a2)
	c = e.count(t, 4, func() string { n, _ := e.askTCP(t, netip.AddrPortFrom(vip, 80)); return n })
	if c["b0"] != 4 {
		t.Errorf("after the good Apply: %v, want all on b0", c)
	}
}

// TestReconcile damages the table by hand with nft, closes the plane (the
// rules stay), and reconciles from a new plane as a restarted daemon would:
// hand-deleted elements and chains come back, strays go, and a long-lived
// TCP connection survives all of it.
func TestReconcile(t *testing.T) {
	e := newEnv(t, 2, false)
	t.Parallel()
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	fa := e.farm("a", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	fb := e.farm("b.farm-2", testutil.VIP4(2), 80, model.ProtoTCP, 8080)
	fc := e.farm("c", testutil.VIP4(3), 80, model.ProtoTCP, 8080)
	e.put(t, prev, fa, fb, fc)

	held, err := testutil.DialTCP(e.Client.NS, netip.AddrPortFrom(testutil.VIP4(3), 80), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	echo := func(what string) {
		t.Helper()
		if _, err := io.WriteString(held, what+"\n"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if line, err := testutil.ReadLine(held, time.Second); err != nil || line != what {
			t.Fatalf("%s: echo %q, %v", what, line, err)
		}
	}
	if _, err := testutil.ReadLine(held, time.Second); err != nil {
		t.Fatal(err)
	}
	echo("before")

	nft := func(args ...string) { e.nft(t, args...) }
	nft("delete", "element", "inet", "xlb", "svcx4", "{ 10.99.0.1 . tcp . 80 }")
	nft("delete", "element", "inet", "xlb", "svcx4", "{ 10.99.0.2 . tcp . 80 }")
	// b's rules (in a group chain: two backends) deleted by hand.
	for _, r := range farmRuleLines(e.nft(t, "-a", "list", "table", "inet", "xlb"), "b.farm-2") {
		nft("delete", "rule", "inet", "xlb", r.chain, "handle", r.handle)
	}
	if hasFarmRules(e.nft(t, "list", "table", "inet", "xlb"), "b.farm-2") {
		t.Fatal("b.farm-2's rules are still there")
	}
	nft("add", "chain", "inet", "xlb", "f-stray")
	nft("add", "map", "inet", "xlb", "m-stray", "{ type ipv4_addr : ipv4_addr; }")
	nft("add", "element", "inet", "xlb", "svc4", "{ 10.99.0.9 . tcp . 80 : goto f-stray }")
	nft("add", "rule", "inet", "xlb", "prerouting", "counter")
	for _, vip := range []netip.Addr{testutil.VIP4(1), testutil.VIP4(2)} {
		if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(vip, 80)); err == nil {
			t.Fatalf("%s answered after its element was deleted", vip)
		}
	}

	// Restart: the old plane lets go, traffic keeps flowing.
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	echo("closed")
	e.askTCP(t, netip.AddrPortFrom(testutil.VIP4(3), 80))

	p2 := newPlane(t, e.LB.NS)
	echo("new plane")
	if err := p2.Reconcile(context.Background(), []*model.Farm{prev["a"], prev["b.farm-2"], prev["c"]}); err != nil {
		t.Fatal(err)
	}
	echo("reconciled")
	for _, vip := range []netip.Addr{testutil.VIP4(1), testutil.VIP4(2), testutil.VIP4(3)} {
		e.askTCP(t, netip.AddrPortFrom(vip, 80))
	}
	out := e.nft(t, "list", "table", "inet", "xlb")
	for _, stray := range []string{"f-stray", "m-stray", "10.99.0.9", "counter packets 0 bytes 0\n"} {
		if strings.Contains(out, stray) {
			t.Errorf("stray %q survived Reconcile:\n%s", stray, out)
		}
	}
	if n := strings.Count(out, "map @m-"); n != 3 {
		t.Errorf("%d farm maps in use, want 3:\n%s", n, out)
	}
	if n := strings.Count(out, "\tmap m-"); n != 3 {
		t.Errorf("%d farm maps, want 3 (old generations must go):\n%s", n, out)
	}

	// Reconcile removes a farm that is no longer wanted.
	if err := p2.Reconcile(context.Background(), []*model.Farm{prev["a"], prev["c"]}); err != nil {
		t.Fatal(err)
	}
	echo("reconciled again")
	if _, err := testutil.AskTCP(e.Client.NS, netip.AddrPortFrom(testutil.VIP4(2), 80)); err == nil {
		t.Errorf("removed farm still answers")
	}
	if out := e.nft(t, "list", "table", "inet", "xlb"); hasFarmRules(out, "b.farm-2") {
		t.Errorf("removed farm's rules survived:\n%s", out)
	}
	// Apply keeps working after Reconcile.
	e.p = p2
	delete(prev, "b.farm-2")
	fa2 := prev["a"].Clone()
	fa2.Backends = fa2.Backends[1:]
	e.put(t, prev, fa2)
	if n, _ := e.askTCP(t, netip.AddrPortFrom(testutil.VIP4(1), 80)); n != "b1" {
		t.Errorf("after Apply: %s answered, want b1", n)
	}
	echo("end")
}

// TestReconcileEmptyKernel: Reconcile on a namespace without the table
// creates everything.
func TestReconcileEmptyKernel(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	e.nft(t, "delete", "table", "inet", "xlb")
	f := e.farm("a", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	if err := e.p.Reconcile(context.Background(), []*model.Farm{mustValid(t, e.p, &f)}); err != nil {
		t.Fatal(err)
	}
	e.askTCP(t, netip.AddrPortFrom(testutil.VIP4(1), 80))
}

// TestFilterObjectsLifecycle: a farm's filter chain and helper object come
// and go with the fields that need them, and Reconcile removes stray ones.
func TestFilterObjectsLifecycle(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	name, ns := testutil.NewNetNS(t)
	p := newPlane(t, ns)
	f := model.NewFarm("ftp")
	f.VirtualAddr = netip.MustParseAddr("10.99.0.1")
	f.VirtualPorts = []model.PortRange{{First: 21, Last: 21}}
	b := model.NewBackend("a")
	b.Addr = netip.MustParseAddr("10.200.0.11")
	f.Backends = []model.Backend{b}
	f.Helper = model.HelperFTP
	f.TCPStrict = true
	list := func() string { return testutil.Run(t, name, "nft", "list", "table", "inet", "xlb") }
	apply := func(old, nf *model.Farm) {
		t.Helper()
		if err := p.Apply(context.Background(), plan.Diff{Changes: []plan.FarmChange{{Old: old, New: nf}}}); err != nil {
			t.Fatal(err)
		}
	}
	v1 := mustValid(t, p, &f)
	apply(nil, v1)
	out := list()
	obj := helperObjName(v1)
	for _, want := range []string{"ct helper " + obj, `type "ftp" protocol tcp`, `ct helper set "` + obj + `"`, "ct state invalid", "chain g-" + nameHash("ftp")} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}
	g := f.Clone()
	g.Helper, g.TCPStrict = model.HelperNone, false
	v2 := mustValid(t, p, &g)
	apply(v1, v2)
	if out := list(); strings.Contains(out, "ct helper") || strings.Contains(out, "chain g-") || strings.Contains(out, "goto g-") {
		t.Errorf("helper and filter left behind:\n%s", out)
	}
	// A stray helper object (e.g. from a farm deleted while xlb was down)
	// is removed by Reconcile; the farm's own is kept.
	apply(v2, v1)
	testutil.Run(t, name, "nft", "add", "ct", "helper", "inet", "xlb", "h-stray", `{ type "tftp" protocol udp; }`)
	if err := p.Reconcile(context.Background(), []*model.Farm{v1}); err != nil {
		t.Fatal(err)
	}
	if out := list(); strings.Contains(out, "h-stray") || !strings.Contains(out, obj) {
		t.Errorf("after reconcile:\n%s", out)
	}
}

// TestApplyMatchesReconcile walks farms through changes that switch every
// feature on and off (persistence, marks, limits, filters, helpers, logs,
// stateless, firewall marks, states) with Apply, and after each step
// compares the table with what a fresh plane's Reconcile builds from the
// same farms in another namespace: Apply must neither leave objects behind
// nor miss any.
func TestApplyMatchesReconcile(t *testing.T) {
	testutil.RequireRoot(t)
	t.Parallel()
	nameA, nsA := testutil.NewNetNS(t)
	nameB, nsB := testutil.NewNetNS(t)
	pa := newPlane(t, nsA)
	base := func(name string, vip int) model.Farm {
		f := model.NewFarm(name)
		f.VirtualAddr = netip.AddrFrom4([4]byte{10, 99, 0, byte(vip)})
		f.VirtualPorts = []model.PortRange{{First: 80, Last: 80}}
		for i := range 2 {
			b := model.NewBackend(fmt.Sprintf("b%d", i))
			b.Addr = netip.AddrFrom4([4]byte{10, 200, 0, byte(11 + i)})
			b.Port = 8080
			f.Backends = append(f.Backends, b)
		}
		return f
	}
	steps := []func(f *model.Farm){
		func(f *model.Farm) {},
		func(f *model.Farm) { f.Persistence, f.Backends[0].Mark = model.KeySrcIP, 7 },
		func(f *model.Farm) { f.TCPStrict, f.Helper, f.Log = true, model.HelperFTP, model.LogForward },
		func(f *model.Farm) { f.Backends[1].EstConnLimit, f.RstRTLimit = 3, 10 },
		func(f *model.Farm) { f.Helper, f.Protocol = model.HelperTFTP, model.ProtoUDP },
		func(f *model.Farm) { f.State = model.StateDown },
		func(f *model.Farm) { f.Backends[0].State, f.Backends[1].State = model.StateDown, model.StateDown },
		func(f *model.Farm) {
			f.Mode, f.Scheduler, f.SchedParam = model.ModeStlsDNAT, model.SchedHash, model.KeySrcIP
		},
		func(f *model.Farm) {
			// A mark of its own per farm (the engine refuses two farms on one mark).
			mark := uint32(f.VirtualAddr.As4()[3]) + 8
			f.VirtualAddr, f.VirtualPorts, f.Mark, f.Scheduler, f.SchedParam = netip.Addr{}, nil, mark, model.SchedMaglev, 0
			f.SourceAddr = netip.MustParseAddr("10.200.0.250")
			f.Persistence = model.KeySrcIP | model.KeySrcPort
		},
		func(f *model.Farm) {
			f.Scheduler, f.SchedParam, f.NewRTLimit, f.EstConnLimit = model.SchedSymhash, model.KeySrcIP, 5, 9
		},
	}
	cur := map[string]*model.Farm{}
	list := func(ns string) []string {
		return normalize(testutil.Run(t, ns, "nft", "list", "table", "inet", "xlb"))
	}
	for i, step := range steps {
		// Farm "x" goes from step i-1's settings to step i's, farm "y"
		// from step i+2's to i+3's (so every feature is also switched
		// off), farm "z" is added and deleted in turn.
		var d plan.Diff
		x := base("x", 1)
		step(&x)
		y := base("y", 2)
		steps[(i+3)%len(steps)](&y)
		for _, f := range []model.Farm{x, y} {
			nf := mustValid(t, pa, &f)
			d.Changes = append(d.Changes, plan.FarmChange{Old: cur[nf.Name], New: nf})
			cur[nf.Name] = nf
		}
		if i%2 == 0 {
			z := base("z", 3)
			step(&z)
			nz := mustValid(t, pa, &z)
			d.Changes = append(d.Changes, plan.FarmChange{Old: cur["z"], New: nz})
			cur["z"] = nz
		} else if cur["z"] != nil {
			d.Changes = append(d.Changes, plan.FarmChange{Old: cur["z"]})
			delete(cur, "z")
		}
		if err := pa.Apply(context.Background(), d); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var farms []*model.Farm
		for _, f := range cur {
			farms = append(farms, f)
		}
		pb := newPlane(t, nsB)
		if err := pb.Reconcile(context.Background(), farms); err != nil {
			t.Fatalf("step %d: reconcile: %v", i, err)
		}
		a, b := list(nameA), list(nameB)
		if strings.Join(a, "\n") != strings.Join(b, "\n") {
			t.Fatalf("step %d: Apply and Reconcile differ\napply:\n%s\nreconcile:\n%s", i, strings.Join(a, "\n"), strings.Join(b, "\n"))
		}
	}
}

// TestReconcileFilterPriority: a filter chain left at another priority
// (mangle, -150, as versions before the tables' chain ran first) is
// replaced at start, since the kernel cannot change a base chain's
// priority and re-adding it fails; without that, Reconcile failed with
// "operation not supported".
func TestReconcileFilterPriority(t *testing.T) {
	e := newEnv(t, 1, false)
	t.Parallel()
	e.startServers(t, 8080)
	prev := map[string]*model.Farm{}
	f := e.farm("filtered", testutil.VIP4(1), 80, model.ProtoTCP, 8080)
	f.RstRTLimit, f.RstRTBurst = 100, 100 // a filter: the filter chain exists
	e.put(t, prev, f)
	for _, args := range [][]string{
		{"flush", "chain", "inet", "xlb", "filter"},
		{"delete", "chain", "inet", "xlb", "filter"},
		{"add", "chain", "inet", "xlb", "filter", "{ type filter hook prerouting priority mangle; }"},
	} {
		e.nft(t, args...)
	}
	if err := e.p.Reconcile(context.Background(), []*model.Farm{prev["filtered"]}); err != nil {
		t.Fatal(err)
	}
	out := e.nft(t, "list", "chain", "inet", "xlb", "filter")
	if !strings.Contains(out, "hook prerouting priority dstnat - 5;") || !strings.Contains(out, "vmap @fsvc4") {
		t.Errorf("filter chain after Reconcile, want priority -105 (dstnat - 5) with its rules:\n%s", out)
	}
	e.askTCP(t, netip.AddrPortFrom(testutil.VIP4(1), 80))
}
