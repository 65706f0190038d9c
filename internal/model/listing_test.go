package model

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func testServices(port uint16, proto Protocol) (string, bool) {
	names := map[serviceKey]string{
		{80, ProtoTCP}:  "http",
		{443, ProtoTCP}: "https",
		{53, ProtoUDP}:  "domain",
	}
	n, ok := names[serviceKey{port, proto}]
	return n, ok
}

func listingFarm(t *testing.T, body string) Farm {
	t.Helper()
	fs, err := DecodeFarms([]byte(body), func(string) (*Farm, bool) { return nil, false })
	if err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return fs[0]
}

func TestListing(t *testing.T) {
	cases := []struct {
		name, body       string
		numeric, byNames string
	}{
		{
			name: "snat rr",
			body: `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","backends":[
				{"name":"b1","ip-addr":"10.200.0.11","port":"80"},{"name":"b2","ip-addr":"10.200.0.12","weight":"3","state":"down"}]}`,
			numeric: "TCP  10.0.0.1:80 rr\n" +
				"  -> 10.200.0.11:80               Masq    1      up\n" +
				"  -> 10.200.0.12:80               Masq    3      down\n",
			byNames: "TCP  10.0.0.1:http rr\n" +
				"  -> 10.200.0.11:http             Masq    1      up\n" +
				"  -> 10.200.0.12:http             Masq    3      down\n",
		},
		{
			name: "several ports, persistence, dsr",
			body: `{"name":"w2","virtual-addr":"10.0.0.2","virtual-ports":"80,443,1000-2000","mode":"dsr","scheduler":"weight",
				"persistence":"srcip","persist-ttl":"300","backends":[{"name":"b1","ip-addr":"10.200.0.11"}]}`,
			numeric: "TCP  10.0.0.2:80,443,1000-2000 weight persistent 300\n" +
				"  -> 10.200.0.11:80,443,1000-2000 Route   1      up\n",
			byNames: "TCP  10.0.0.2:http,https,1000-2000 weight persistent 300\n" +
				"  -> 10.200.0.11:http,https,1000-2000 Route   1      up\n",
		},
		{
			name: "ipv6 udp hash",
			body: `{"name":"dns6","family":"ipv6","virtual-addr":"2001:db8::53","virtual-ports":"53","protocol":"udp","mode":"dnat",
				"scheduler":"hash","sched-param":"srcip srcport","persistence":"srcip-srcport","backends":[{"name":"b1","ip-addr":"2001:db8::1:1","port":"5353","priority":"2"}]}`,
			numeric: "UDP  [2001:db8::53]:53 hash (srcip srcport) persistent 60 (srcip-srcport)\n" +
				"  -> [2001:db8::1:1]:5353         Dnat    1      up priority 2\n",
			byNames: "UDP  [2001:db8::53]:domain hash (srcip srcport) persistent 60 (srcip-srcport)\n" +
				"  -> [2001:db8::1:1]:5353         Dnat    1      up priority 2\n",
		},
		{
			name: "firewall mark, stateless, off",
			body: `{"name":"fwm","mark":"0x10","mode":"stlsdnat","state":"off","backends":[{"name":"b1","ip-addr":"10.200.0.11"}]}`,
			numeric: "FWM  16 rr off\n" +
				"  -> 10.200.0.11:0                Stls    1      up\n",
		},
		{
			name:    "all protocols, no backends",
			body:    `{"name":"any","virtual-addr":"10.0.0.3","protocol":"all","est-connlimit":"10","new-rtlimit":"5","new-rtlimit-burst":"2"}`,
			numeric: "ALL  10.0.0.3:0 rr new-rtlimit 5/2 est-connlimit 10\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := listingFarm(t, c.body)
			if got := string(f.appendListing(nil, true, testServices)); got != c.numeric {
				t.Errorf("numeric:\n got %q\nwant %q", got, c.numeric)
			}
			want := c.byNames
			if want == "" {
				want = c.numeric
			}
			if got := string(f.appendListing(nil, false, testServices)); got != want {
				t.Errorf("names:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestListingCached(t *testing.T) {
	f := listingFarm(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","backends":[{"name":"b1","ip-addr":"10.200.0.11"}]}`)
	plain := string(f.AppendListing(nil, true))
	f.Seal()
	for range 2 {
		if got := string(f.AppendListing([]byte("x"), true)); got != "x"+plain {
			t.Fatalf("sealed listing %q, want %q", got, "x"+plain)
		}
	}
	if got := string(f.AppendListing(nil, false)); !strings.HasPrefix(got, "TCP  10.0.0.1:") {
		t.Fatalf("named listing %q", got)
	}
}

func TestParseServices(t *testing.T) {
	m := parseServices(strings.NewReader(`# comment
http		80/tcp		www		# WorldWideWeb HTTP
www-alt		80/tcp
https		443/tcp
https		443/udp				# HTTP/3
bad		x/tcp
odd		99/ddp
`))
	want := map[serviceKey]string{{80, ProtoTCP}: "http", {443, ProtoTCP}: "https", {443, ProtoUDP}: "https"}
	if len(m) != len(want) {
		t.Fatalf("got %v, want %v", m, want)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%v: got %q, want %q", k, m[k], v)
		}
	}
}

func BenchmarkListing16k(b *testing.B) {
	farms := make([]*Farm, 16000)
	for i := range farms {
		f := NewFarm(fmt.Sprintf("f%05d", i))
		f.VirtualAddr = netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1})
		f.VirtualPorts = []PortRange{{80, 80}}
		b1 := NewBackend("b1")
		b1.Addr = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		f.Backends = []Backend{b1}
		f.Seal()
		farms[i] = &f
	}
	var buf []byte
	for b.Loop() {
		buf = append(buf[:0], ListingHeader...)
		for _, f := range farms {
			buf = f.AppendListing(buf, true)
		}
	}
}
