package model

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func noFarm(string) (*Farm, bool) { return nil, false }

func decodeOne(t *testing.T, body string) Farm {
	t.Helper()
	fs, err := DecodeFarms([]byte(body), noFarm)
	if err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	if len(fs) != 1 {
		t.Fatalf("decode %s: got %d farms", body, len(fs))
	}
	return fs[0]
}

// An nftlb client sends every value as a string; that must work unchanged.
func TestDecodeNftlbStrings(t *testing.T) {
	f := decodeOne(t, `{"farms":[{"name":"web","family":"ipv4","virtual-addr":"10.0.0.1","virtual-ports":"80,443,1000-2000",
		"protocol":"tcp","mode":"dnat","scheduler":"hash","sched-param":"srcip srcport","persistence":"srcip","persist-ttl":"120",
		"helper":"ftp","log":"input forward","log-prefix":"web ","mark":"0x10","priority":"2","state":"up",
		"new-rtlimit":"100","new-rtlimit-burst":"10","rst-rtlimit":"5","rst-rtlimit-burst":"2","est-connlimit":"1000","tcp-strict":"on",
		"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":"8080","weight":"3","priority":"1","mark":"0x1","est-connlimit":"50","state":"down"}],
		"policies":[{"name":"blocklist"}]}]}`)
	if f.VirtualAddr.String() != "10.0.0.1" || len(f.VirtualPorts) != 3 || f.VirtualPorts[2] != (PortRange{1000, 2000}) {
		t.Errorf("addr/ports: %v %v", f.VirtualAddr, f.VirtualPorts)
	}
	if f.Mode != ModeDNAT || f.Scheduler != SchedHash || f.SchedParam != KeySrcIP|KeySrcPort || f.Persistence != KeySrcIP || f.PersistTTL != 120 {
		t.Errorf("mode/sched/persist: %+v", f)
	}
	if f.Helper != HelperFTP || f.Log != LogInput|LogForward || f.Mark != 0x10 || !f.TCPStrict {
		t.Errorf("helper/log/mark: %+v", f)
	}
	if f.NewRTLimit != 100 || f.NewRTBurst != 10 || f.RstRTLimit != 5 || f.RstRTBurst != 2 || f.EstConnLimit != 1000 {
		t.Errorf("limits: %+v", f)
	}
	b := f.Backends[0]
	if b.Addr.String() != "10.1.0.1" || b.Port != 8080 || b.Weight != 3 || b.Mark != 1 || b.EstConnLimit != 50 || b.State != StateDown {
		t.Errorf("backend: %+v", b)
	}
	if len(f.Policies) != 1 || f.Policies[0].Name != "blocklist" {
		t.Errorf("policies: %+v", f.Policies)
	}
}

// Plain JSON numbers and booleans are accepted too.
func TestDecodeNumbers(t *testing.T) {
	f := decodeOne(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":80,"tcp-strict":true,
		"backends":[{"name":"b1","ip-addr":"10.1.0.1","port":8080,"weight":2}]}`)
	if f.VirtualPorts[0] != (PortRange{80, 80}) || !f.TCPStrict || f.Backends[0].Port != 8080 || f.Backends[0].Weight != 2 {
		t.Errorf("got %+v", f)
	}
}

// GET returns every field with nftlb's defaults filled in, as strings.
func TestEncodeDefaults(t *testing.T) {
	f := decodeOne(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","backends":[{"name":"b1","ip-addr":"10.1.0.1"}]}`)
	var out map[string]any
	if err := json.Unmarshal(f.AppendJSON(nil), &out); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"name": "web", "family": "ipv4", "virtual-addr": "10.0.0.1", "virtual-ports": "80", "protocol": "tcp",
		"mode": "snat", "scheduler": "rr", "sched-param": "none", "persistence": "none", "persist-ttl": "60",
		"helper": "none", "log": "none", "mark": "0x0", "priority": "1", "state": "up", "new-rtlimit": "0/second",
		"est-connlimit": "0", "tcp-strict": "off", "source-addr": "", "log-prefix": "", "log-rtlimit": "0/second",
		"limits-ttl": "120", "rst-rtlimit": "0/second", "queue": "-1", "verdict": "log drop accept",
	}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("field %q = %v, want %q", k, out[k], v)
		}
	}
	b := out["backends"].([]any)[0].(map[string]any)
	for k, v := range map[string]string{"name": "b1", "ip-addr": "10.1.0.1", "port": "", "weight": "1", "priority": "1", "mark": "0x0", "state": "up"} {
		if b[k] != v {
			t.Errorf("backend field %q = %v, want %q", k, b[k], v)
		}
	}
}

// A family dual farm may have an IPv4 and an IPv6 VIP.
func TestDualVirtualAddrs(t *testing.T) {
	f := decodeOne(t, `{"name":"d","family":"dual","virtual-addr":"fd00::1,10.0.0.1","virtual-ports":"80",
		"backends":[{"name":"b4","ip-addr":"10.1.0.1"},{"name":"b6","ip-addr":"fd00:1::1"}]}`)
	if f.VirtualAddr.String() != "fd00::1" || f.VirtualAddr2.String() != "10.0.0.1" || len(f.VirtualAddrs()) != 2 {
		t.Fatalf("decoded %v %v", f.VirtualAddr, f.VirtualAddr2)
	}
	enc := f.AppendJSON(nil)
	if !strings.Contains(string(enc), `"virtual-addr":"fd00::1,10.0.0.1"`) {
		t.Errorf("encoded %s", enc)
	}
	if g := decodeOne(t, string(enc)); string(g.AppendJSON(nil)) != string(enc) {
		t.Errorf("round trip differs")
	}
	// A patch with one address drops the second.
	one, err := DecodeFarms([]byte(`{"name":"d","virtual-addr":"10.0.0.1"}`), func(string) (*Farm, bool) { return &f, true })
	if err != nil || one[0].VirtualAddr2.IsValid() {
		t.Errorf("patch to one address: %v %v", err, one)
	}
}

// The dsr fields (nftlb's iface, oface, ether-addr) survive a round trip.
func TestRoundTripDSR(t *testing.T) {
	f := decodeOne(t, `{"name":"d","virtual-addr":"10.0.0.1","virtual-ports":"80","mode":"dsr","iface":"eth0","oface":"eth1",
		"ether-addr":"02:AA:00:00:00:01","backends":[{"name":"b1","ip-addr":"10.1.0.1","ether-addr":"02-00-00-00-00-0b"}]}`)
	if f.Iface != "eth0" || f.Oface != "eth1" || f.EtherAddr.String() != "02:aa:00:00:00:01" || f.Backends[0].EtherAddr.String() != "02:00:00:00:00:0b" {
		t.Fatalf("decoded %+v", f)
	}
	enc := f.AppendJSON(nil)
	for _, w := range []string{`"iface":"eth0"`, `"oface":"eth1"`, `"ether-addr":"02:aa:00:00:00:01"`, `"ether-addr":"02:00:00:00:00:0b"`} {
		if !strings.Contains(string(enc), w) {
			t.Errorf("%s lacks %s", enc, w)
		}
	}
	g := decodeOne(t, string(enc))
	if got := string(g.AppendJSON(nil)); got != string(enc) {
		t.Errorf("round trip differs:\n%s\n%s", enc, got)
	}
	// Clearing them works (empty string), so the farm can leave mode dsr.
	h := decodeOne(t, `{"name":"d","virtual-addr":"10.0.0.1","mode":"dsr","iface":"","ether-addr":""}`)
	if h.Iface != "" || !h.EtherAddr.IsZero() {
		t.Errorf("not cleared: %+v", h)
	}
}

// Encoding then decoding gives the same farm, byte for byte.
func TestRoundTrip(t *testing.T) {
	f := decodeOne(t, `{"name":"web","family":"ipv6","virtual-addr":"fd00::1","virtual-ports":"80,8000-8100","scheduler":"weight",
		"persistence":"srcip-srcport","log":"forward","log-prefix":"a\"b","backends":[{"name":"b1","ip-addr":"fd00:1::1","weight":"5"}]}`)
	enc := f.AppendJSON(nil)
	g := decodeOne(t, string(enc))
	if got := string(g.AppendJSON(nil)); got != string(enc) {
		t.Errorf("round trip differs:\n%s\n%s", enc, got)
	}
	if g.Persistence != KeySrcIP|KeySrcPort {
		t.Errorf("persistence %v", g.Persistence)
	}
}

// A patch changes only the fields it names; backends are upserted by name.
func TestPatchSemantics(t *testing.T) {
	base := decodeOne(t, `{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","scheduler":"weight",
		"backends":[{"name":"b1","ip-addr":"10.1.0.1","weight":"5"}]}`)
	cur := func(n string) (*Farm, bool) { return &base, n == "web" }
	fs, err := DecodeFarms([]byte(`{"farms":[{"name":"web","backends":[{"name":"b1","state":"down"},{"name":"b2","ip-addr":"10.1.0.2"}]}]}`), cur)
	if err != nil {
		t.Fatal(err)
	}
	f := fs[0]
	if f.Scheduler != SchedWeight || f.VirtualAddr.String() != "10.0.0.1" {
		t.Errorf("unnamed fields changed: %+v", f)
	}
	if len(f.Backends) != 2 || f.Backends[0].Weight != 5 || f.Backends[0].State != StateDown || f.Backends[1].Name != "b2" {
		t.Errorf("backends: %+v", f.Backends)
	}
	if base.Backends[0].State != StateUp {
		t.Error("patch changed the base farm")
	}
}

func TestHashDefaultsToSrcIP(t *testing.T) {
	f := decodeOne(t, `{"name":"web","virtual-addr":"10.0.0.1","scheduler":"hash"}`)
	if f.SchedParam != KeySrcIP {
		t.Errorf("sched-param %v, want srcip", f.SchedParam)
	}
}

// Every field rejects a bad value with an error naming the field, the value
// and what is allowed.
func TestFieldErrors(t *testing.T) {
	const farm = `{"name":"web","virtual-addr":"10.0.0.1",%s}`
	const backend = `{"name":"web","virtual-addr":"10.0.0.1","backends":[{"name":"b1","ip-addr":"10.1.0.1",%s}]}`
	cases := []struct {
		tmpl, field, body string
		want              []string
	}{
		{farm, "family", `"family":"ipx"`, []string{`"family"`, `"ipx"`, "ipv4, ipv6, dual"}},
		{farm, "family", `"family":"ipv6"`, []string{`"virtual-addr"`, "ipv4 address", "family is ipv6"}},
		{`{"name":"web",%s}`, "virtual-addr", `"virtual-addr":"10.0.0.300"`, []string{`"virtual-addr"`, `"10.0.0.300"`, "IPv4 or IPv6"}},
		{farm, "virtual-ports", `"virtual-ports":"80,70000"`, []string{`"virtual-ports"`, "1-65535"}},
		{farm, "virtual-ports", `"virtual-ports":"90-80"`, []string{`"virtual-ports"`, "low-high"}},
		{farm, "virtual-ports", `"virtual-ports":"80,70-90"`, []string{`"virtual-ports"`, "overlaps"}},
		{farm, "virtual-ports", `"virtual-ports":"0"`, []string{`"virtual-ports"`}},
		{farm, "source-addr", `"source-addr":"nope"`, []string{`"source-addr"`, `"nope"`}},
		{farm, "source-addr", `"mode":"dnat","source-addr":"10.0.0.9"`, []string{`"source-addr"`, "only used by mode snat"}},
		{farm, "mode", `"mode":"nat"`, []string{`"mode"`, `"nat"`, "snat, dnat, dsr, stlsdnat"}},
		{farm, "protocol", `"protocol":"icmp"`, []string{`"protocol"`, "tcp, udp, sctp, all"}},
		{farm, "scheduler", `"scheduler":"foo"`, []string{`"scheduler"`, `"foo"`, "rr, weight, hash, symhash, maglev"}},
		{farm, "sched-param", `"scheduler":"hash","sched-param":"srcip bogus"`, []string{`"sched-param"`, "srcip, dstip, srcport, dstport, srcmac"}},
		{farm, "sched-param", `"scheduler":"rr","sched-param":"srcip"`, []string{`"sched-param"`, "only used by schedulers hash"}},
		{farm, "persistence", `"persistence":"cookie"`, []string{`"persistence"`, "srcip srcport"}},
		{farm, "persist-ttl", `"persistence":"srcip","persist-ttl":"0"`, []string{`"persist-ttl"`, "1 second"}},
		{farm, "persist-ttl", `"persist-ttl":"-5"`, []string{`"persist-ttl"`, "whole number"}},
		{farm, "helper", `"helper":"http"`, []string{`"helper"`, "ftp", "tftp", "netbios-ns"}},
		{farm, "helper", `"helper":"ftp","protocol":"udp"`, []string{`"helper"`, `"ftp"`, "protocol tcp", "protocol udp"}},
		{farm, "helper", `"helper":"tftp"`, []string{`"helper"`, `"tftp"`, "protocol udp", "has protocol tcp"}},
		{farm, "helper", `"helper":"ftp","mode":"stlsdnat"`, []string{`"helper"`, "stlsdnat"}},
		{farm, "helper", `"helper":"ftp","mode":"dsr"`, []string{`"helper"`, "dsr"}},
		{farm, "persistence", `"persistence":"srcip","mode":"stlsdnat"`, []string{`"persistence"`, `"srcip"`, "stlsdnat"}},
		{farm, "persistence", `"persistence":"srcip-srcport","protocol":"all"`, []string{`"persistence"`, `"srcip srcport"`, "protocol all"}},
		{farm, "est-connlimit", `"est-connlimit":"5","mode":"stlsdnat"`, []string{`"est-connlimit"`, "stlsdnat"}},
		{farm, "tcp-strict", `"tcp-strict":"on","mode":"stlsdnat"`, []string{`"tcp-strict"`, "stlsdnat"}},
		{`{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","mode":"dsr","backends":[{"name":"b1","ip-addr":"10.1.0.1",%s}]}`, "dsr port", `"port":"8080"`, []string{`backend "b1"`, `"port"`, `"8080"`, "dsr"}},
		{`{"name":"web",%s}`, "virtual-addr", `"family":"dual","virtual-addr":"10.0.0.1,10.0.0.2"`, []string{`"virtual-addr"`, `"10.0.0.1,10.0.0.2"`, "one IPv4 and one IPv6"}},
		{`{"name":"web",%s}`, "virtual-addr", `"virtual-addr":"10.0.0.1,fd00::1"`, []string{`"virtual-addr"`, "need family dual", "family ipv4"}},
		{`{"name":"web",%s}`, "virtual-addr", `"family":"dual","virtual-addr":"10.0.0.1,fd00::1,fd00::2"`, []string{`"virtual-addr"`, "one of each separated by a comma"}},
		{farm, "iface", `"iface":"eth0"`, []string{`"iface"`, `"eth0"`, "only used by modes dsr and stlsdnat"}},
		{farm, "oface", `"mode":"dsr","oface":"a/b"`, []string{`"oface"`, `"a/b"`, "interface name"}},
		{farm, "iface", `"mode":"dsr","iface":"0123456789abcdef"`, []string{`"iface"`, "1 to 15 characters"}},
		{farm, "ether-addr", `"mode":"dsr","ether-addr":"02:00:00:00:00"`, []string{`"ether-addr"`, `"02:00:00:00:00"`, "aa:bb:cc:dd:ee:ff"}},
		{farm, "ether-addr", `"mode":"dsr","ether-addr":"ff:ff:ff:ff:ff:ff"`, []string{`"ether-addr"`, "unicast"}},
		{farm, "ether-addr", `"ether-addr":"02:00:00:00:00:01"`, []string{`"ether-addr"`, "only used by modes dsr and stlsdnat"}},
		{farm, "oface", `"mode":"stlsdnat","scheduler":"hash","oface":"eth1"`, []string{`"oface"`, `"eth1"`, "needs iface in mode stlsdnat"}},
		{farm, "ether-addr", `"mode":"stlsdnat","scheduler":"hash","ether-addr":"02:00:00:00:00:01"`, []string{`"ether-addr"`, "needs iface in mode stlsdnat"}},
		{farm, "ether-addr", `"mode":"stlsdnat","scheduler":"hash","iface":"eth0","ether-addr":"02:00:00:00:00:0g"`, []string{`"ether-addr"`, `"02:00:00:00:00:0g"`, "aa:bb:cc:dd:ee:ff"}},
		{backend, "ether-addr", `"ether-addr":"02:00:00:00:00:01"`, []string{`backend "b1"`, `"ether-addr"`, "only used by modes dsr and stlsdnat"}},
		{backend, "ether-addr", `"ether-addr":"01:00:5e:00:00:01"`, []string{`backend "b1"`, `"ether-addr"`, "unicast"}},
		{farm, "log", `"log":"everywhere"`, []string{`"log"`, "input, forward, output"}},
		{farm, "log-prefix", `"log-prefix":"01234567890123456789012345678901234567890123456789012"`, []string{`"log-prefix"`, "at most 52"}},
		{farm, "new-rtlimit", `"new-rtlimit":"5/fortnight"`, []string{`"new-rtlimit"`, `"fortnight"`, "second, minute, hour, day, week"}},
		{farm, "queue", `"queue":"70000"`, []string{`"queue"`, "0-65535"}},
		{farm, "verdict", `"verdict":"reject"`, []string{`"verdict"`, "log, drop, accept"}},
		{farm, "newname", `"newname":"a b"`, []string{`"newname"`, "1 to 64"}},
		{farm, "addresses", `"addresses":[{"name":"nowhere"}]`, []string{`"addresses"`, `"nowhere"`, "no farm has an address"}},
		{farm, "addresses", `"addresses":[{"name":"a2","ip-addr":"fd00::1"}]`, []string{`address "a2"`, `"ip-addr"`, "family ipv4"}},
		{farm, "addresses", `"addresses":[{"name":"a2","colour":"red"}]`, []string{`address "a2"`, `"colour"`, "unknown field"}},
		{farm, "addresses", `"addresses":[{"name":"a2","ip-addr":"","ports":"30080"}]`, []string{`address "a2"`, `"ip-addr"`, "cannot be empty"}},
		{farm, "sessions", `"sessions":[{"client":"10.0.0.9","backend":"b9"}]`, []string{`session "10.0.0.9"`, `"b9"`, "no backend"}},
		{backend, "source-addr", `"source-addr":"fd00::1"`, []string{`backend "b1"`, `"source-addr"`, "family ipv4"}},
		{backend, "state", `"state":"resting"`, []string{`"state"`, "up, down, off", "available"}},
		{farm, "mark", `"mark":"0x1ffffffff"`, []string{`"mark"`, "32-bit"}},
		{farm, "priority", `"priority":"0"`, []string{`"priority"`, "1-2147483647"}},
		{farm, "state", `"state":"sleeping"`, []string{`"state"`, "up, down, off"}},
		{farm, "new-rtlimit", `"new-rtlimit":"fast"`, []string{`"new-rtlimit"`, "rate"}},
		{farm, "rst-rtlimit", `"rst-rtlimit":"x"`, []string{`"rst-rtlimit"`}},
		{farm, "est-connlimit", `"est-connlimit":"1.5"`, []string{`"est-connlimit"`}},
		{farm, "tcp-strict", `"tcp-strict":"maybe"`, []string{`"tcp-strict"`, "on, off"}},
		{farm, "unknown", `"colour":"blue"`, []string{`"colour"`, "unknown field", "virtual-addr"}},
		{farm, "object value", `"mode":{"a":1}`, []string{`"mode"`, "must be a JSON string"}},
		{farm, "policies", `"policies":[{"name":"bad name"}]`, []string{`"policies"`, "bad name"}},
		{`{"name":"bad/name","virtual-addr":"10.0.0.1"%s}`, "name", ``, []string{`"name"`, `"bad/name"`}},
		{`{"name":"web","virtual-addr":"10.0.0.1","backends":[{"name":"b1",%s}]}`, "ip-addr", `"port":"80","ip-addr":"fd00::1"`, []string{`backend "b1"`, `"ip-addr"`, "family ipv4"}},
		{backend, "port", `"port":"65536"`, []string{`backend "b1"`, `"port"`, "1-65535"}},
		{backend, "weight", `"weight":"10001"`, []string{`"weight"`, "0-10000"}},
		{backend, "priority", `"priority":"0"`, []string{`"priority"`, "1-2147483647"}},
		{backend, "mark", `"mark":"zz"`, []string{`"mark"`}},
		{backend, "est-connlimit", `"est-connlimit":"-1"`, []string{`"est-connlimit"`}},
		{backend, "unknown", `"colour":"red"`, []string{`"colour"`, "unknown field", "ip-addr"}},
		{`{"name":"web","virtual-addr":"10.0.0.1","backends":[{"name":"b1"%s}]}`, "ip-addr missing", ``, []string{`"ip-addr"`, "required"}},
		{`{"name":"web","virtual-addr":"10.0.0.1","backends":[{"name":"b1","ip-addr":"10.1.0.1"},{"name":"b1","ip-addr":"10.1.0.2"}%s]}`, "duplicate backend", ``, []string{`backends[1].name`, `"b1"`, "earlier in the same request"}},
		{`{"name":"web","virtual-addr":"10.0.0.1","backends":[{"ip-addr":"10.1.0.1"%s}]}`, "backend name", ``, []string{`backends[0].name`, "required"}},
	}
	for _, c := range cases {
		body := strings.Replace(c.tmpl, "%s", c.body, 1)
		if c.body == "" {
			body = strings.Replace(c.tmpl, "%s", "", 1)
		}
		_, err := DecodeFarms([]byte(body), noFarm)
		if err == nil {
			t.Errorf("%s: %s accepted", c.field, body)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.field, err, w)
			}
		}
	}
}

func TestDecodeEnvelopeErrors(t *testing.T) {
	for body, want := range map[string]string{
		`not json`:               "not a JSON object",
		`{"farms":{}}`:           "array",
		`{"farms":[],"extra":1}`: `"extra"`,
		`{"farms":[{"name":"a","virtual-addr":"10.0.0.1"},{"name":"a","virtual-addr":"10.0.0.2"}]}`: "twice",
		`{"farms":[1]}`: "JSON object",
	} {
		if _, err := DecodeFarms([]byte(body), noFarm); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want mention of %q", body, err, want)
		}
	}
}

// nftlb's priority rule (backends.c, backend_s_gen_priority): the level
// starts at 1 and rises by one for each backend of exactly that level that
// does not serve, repeated at the new level; backends up at or below it
// serve, those above print "available", and the farm prints the level.
func TestActiveBackendsPriorityGroups(t *testing.T) {
	for _, c := range []struct {
		backends string
		level    uint32
		active   string
		standby  string
	}{
		{`{"name":"a","ip-addr":"10.1.0.1","priority":"1"},{"name":"b","ip-addr":"10.1.0.2","priority":"1"},{"name":"c","ip-addr":"10.1.0.3","priority":"2"}`, 1, "a b", "c"},
		// One of level 1 down: level 2, the spare c serves beside b.
		{`{"name":"a","ip-addr":"10.1.0.4","priority":"1","state":"down"},{"name":"b","ip-addr":"10.1.0.5","priority":"1"},{"name":"c","ip-addr":"10.1.0.6","priority":"2"}`, 2, "b c", ""},
		// Two down at level 1: level 3 (c and d both step in).
		{`{"name":"a","ip-addr":"10.1.0.7","priority":"1","state":"down"},{"name":"b","ip-addr":"10.1.0.8","priority":"1","state":"off"},{"name":"c","ip-addr":"10.1.0.9","priority":"2"},{"name":"d","ip-addr":"10.1.0.10","priority":"3"},{"name":"e","ip-addr":"10.1.0.11","priority":"4"}`, 3, "c d", "e"},
		// Level 2 reached, a spare there down too: level 3.
		{`{"name":"a","ip-addr":"10.1.0.12","priority":"1","state":"down"},{"name":"b","ip-addr":"10.1.0.13","priority":"2","state":"down"},{"name":"c","ip-addr":"10.1.0.14","priority":"3"},{"name":"d","ip-addr":"10.1.0.15","priority":"4"}`, 3, "c", "d"},
		// A backend drained to weight 0 serves no new connections: it
		// counts as down for the level.
		{`{"name":"a","ip-addr":"10.1.0.16","priority":"1","weight":"0"},{"name":"b","ip-addr":"10.1.0.17","priority":"2"}`, 2, "b", ""},
		// Down backends above the level do not count.
		{`{"name":"a","ip-addr":"10.1.0.18","priority":"1"},{"name":"b","ip-addr":"10.1.0.19","priority":"2","state":"down"},{"name":"c","ip-addr":"10.1.0.20","priority":"3"}`, 1, "a", "c"},
		{``, 1, "", ""},
	} {
		f := decodeOne(t, `{"name":"web","virtual-addr":"10.0.0.1","backends":[`+c.backends+`]}`)
		var active, standby []string
		for _, b := range f.ActiveBackends() {
			active = append(active, b.Name)
		}
		level := f.PriorityLevel()
		for i := range f.Backends {
			if f.Backends[i].Standby(level) {
				standby = append(standby, f.Backends[i].Name)
			}
		}
		if level != c.level || strings.Join(active, " ") != c.active || strings.Join(standby, " ") != c.standby {
			t.Errorf("%s: level %d, active %v, standby %v; want %d, %q, %q", c.backends, level, active, standby, c.level, c.active, c.standby)
		}
		out := string(f.AppendJSON(nil))
		if want := fmt.Sprintf(`"priority":"%d"`, c.level); !strings.Contains(out, want) {
			t.Errorf("%s: GET prints %s, want %s", c.backends, out, want)
		}
		if n := strings.Count(out, `"state":"available"`); n != len(standby) {
			t.Errorf("%s: GET prints %d backends available, want %d: %s", c.backends, n, len(standby), out)
		}
	}
}

func TestMarkFarmNeedsNoVIP(t *testing.T) {
	f := decodeOne(t, `{"name":"fw","mark":"0x20","protocol":"all"}`)
	if !f.IsMarkFarm() {
		t.Error("farm with a mark and no virtual-addr is a firewall-mark farm")
	}
}

func FuzzDecodeFarms(f *testing.F) {
	f.Add([]byte(`{"farms":[{"name":"web","virtual-addr":"10.0.0.1","virtual-ports":"80","backends":[{"name":"b","ip-addr":"10.0.0.2"}]}]}`))
	f.Add([]byte(`{"name":"x","mark":"1"}`))
	f.Add([]byte("{\"name\":\"x\",\"virtual-addr\":\"10.0.0.1\",\"log-prefix\":\"" + strings.Repeat("\xff", 24) + "\"}"))
	f.Add([]byte(`{"name":"x","virtual-addr":"10.0.0.1","log-prefix":"\u0000\ud800"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fs, err := DecodeFarms(body, noFarm)
		if err != nil {
			return
		}
		for i := range fs {
			// Whatever decodes must encode and decode to the same thing.
			enc := fs[i].AppendJSON(nil)
			g, err := DecodeFarms(enc, noFarm)
			if err != nil {
				t.Fatalf("re-decode of %s: %v", enc, err)
			}
			if string(g[0].AppendJSON(nil)) != string(enc) {
				t.Fatalf("round trip differs for %s", enc)
			}
		}
	})
}
