package model

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

// nftlbAllFields is a farm as Debian's nftlb 1.0.7 prints it in GET /farms
// (every field set; its trailing spaces in multi-word values included).
const nftlbAllFields = `{"farms": [{
	"name": "all", "family": "ipv4", "virtual-addr": "10.0.0.1", "virtual-ports": "80,443,1000-2000",
	"source-addr": "10.0.0.254", "mode": "snat", "protocol": "tcp", "scheduler": "hash",
	"sched-param": "srcip srcport ", "persistence": "srcip srcport ", "persist-ttl": "120", "helper": "none",
	"log": "input forward ", "log-prefix": "mylog", "log-rtlimit": "5/minute", "mark": "0x10", "priority": "1",
	"state": "config_error", "limits-ttl": "60", "new-rtlimit": "10/second", "new-rtlimit-burst": "5",
	"new-rtlimit-log-prefix": "NEWLIM", "rst-rtlimit": "3/second", "rst-rtlimit-burst": "2",
	"rst-rtlimit-log-prefix": "RSTLIM", "est-connlimit": "100", "est-connlimit-log-prefix": "ESTLIM",
	"tcp-strict": "on", "tcp-strict-log-prefix": "STRICT", "queue": "3", "verdict": "drop ",
	"flow-offload": "on", "intra-connect": "on",
	"addresses": [{"name": "all-addr", "family": "ipv4", "ip-addr": "10.0.0.1", "ports": "80,443,1000-2000", "protocol": "tcp", "used": "1"}],
	"backends": [{"name": "b1", "ip-addr": "10.1.0.1", "port": "8080", "source-addr": "10.0.0.254", "weight": "5",
		"priority": "1", "mark": "0x20", "est-connlimit": "10", "est-connlimit-log-prefix": "BEST", "state": "up"}],
	"policies": []}]}`

// nftlb's own output decodes, and every value it printed reads back the
// same (trailing spaces aside, and config_error, which means up).
func TestDecodeNftlbOutput(t *testing.T) {
	fs, err := DecodeFarms([]byte(nftlbAllFields), noFarm)
	if err != nil {
		t.Fatal(err)
	}
	var in, out struct {
		Farms []map[string]any `json:"farms"`
	}
	if err := json.Unmarshal([]byte(nftlbAllFields), &in); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(AppendFarmsJSON(nil, []*Farm{&fs[0]}), &out); err != nil {
		t.Fatal(err)
	}
	for k, v := range in.Farms[0] {
		want, got := v, out.Farms[0][k]
		if s, ok := want.(string); ok {
			want = strings.TrimSpace(s)
		}
		if k == "state" {
			want = "up"
		}
		if k == "addresses" || k == "backends" || k == "policies" {
			// xlb prints every field; nftlb's must all be there.
			for i, w := range want.([]any) {
				g := got.([]any)[i].(map[string]any)
				for wk, wv := range w.(map[string]any) {
					if g[wk] != wv {
						t.Errorf("%s[%d].%s = %v, nftlb printed %v", k, i, wk, g[wk], wv)
					}
				}
			}
			continue
		}
		if got != want {
			t.Errorf("%s = %v, nftlb printed %v", k, got, want)
		}
	}
	f := fs[0]
	if f.LogRTLimit != 5 || f.LogRTUnit != PerMinute || f.Queue != 3 || f.Verdict != VerdictDrop || !f.FlowOffload || f.IntraConnectOff {
		t.Errorf("decoded %+v", f)
	}
	if field, _, ok := f.NftlbFieldInUse(); !ok || field != "log-rtlimit" {
		t.Errorf("NftlbFieldInUse = %q %v", field, ok)
	}
}

// Empty strings in number fields mean unset (the field's default).
func TestEmptyNumbersAreDefaults(t *testing.T) {
	f := decodeOne(t, `{"name":"w","virtual-addr":"10.0.0.1","persist-ttl":"","est-connlimit":"","new-rtlimit":"","queue":"","mark":"",
		"backends":[{"name":"b","ip-addr":"10.1.0.1","port":""}]}`)
	if f.PersistTTL != DefaultTTL || f.Queue != -1 {
		t.Errorf("decoded %+v", f)
	}
}

// A priority (farm or backend) or a backend weight must be a number:
// nftlb refuses "" and 0 there ("must be >=1"; xlb takes weight 0, drain).
func TestPriorityAndWeightNeedNumbers(t *testing.T) {
	for _, body := range []string{
		`{"name":"w","priority":""}`, `{"name":"w","priority":"0"}`, `{"name":"w","priority":"abc"}`,
		`{"name":"w","backends":[{"name":"b","priority":""}]}`, `{"name":"w","backends":[{"name":"b","priority":"0"}]}`,
		`{"name":"w","backends":[{"name":"b","weight":""}]}`, `{"name":"w","backends":[{"name":"b","weight":"-1"}]}`,
	} {
		if _, err := DecodeFarms([]byte(body), noFarm); err == nil || !strings.Contains(err.Error(), "whole number") {
			t.Errorf("%s: %v, want a whole number error", body, err)
		}
	}
	f := decodeOne(t, `{"name":"w","priority":"5000","backends":[{"name":"b","ip-addr":"10.1.0.1","priority":"5000","weight":"0"}]}`)
	if f.Backends[0].Priority != 5000 || f.Backends[0].Weight != 0 || f.PriorityLevel() != 1 {
		t.Errorf("decoded %+v, level %d", f.Backends[0], f.PriorityLevel())
	}
}

// "newname" renames; the farm remembers its old name for the engine.
func TestNewname(t *testing.T) {
	old := decodeOne(t, `{"name":"a","virtual-addr":"10.0.0.1"}`)
	fs, err := DecodeFarms([]byte(`{"farms":[{"name":"a","newname":"b"}]}`), func(n string) (*Farm, bool) {
		if n == "a" {
			return &old, true
		}
		return nil, false
	})
	if err != nil || fs[0].Name != "b" || fs[0].RenamedFrom() != "a" || fs[0].VirtualAddr.String() != "10.0.0.1" {
		t.Fatalf("%v %+v", err, fs)
	}
	if strings.Contains(string(fs[0].AppendJSON(nil)), "newname") {
		t.Error("newname is printed")
	}
	if c := fs[0].Clone(); c.RenamedFrom() != "" {
		t.Error("a clone keeps the rename")
	}
}

// A farm's addresses: the first is its own (virtual-addr), further ones
// are kept by name; one given by name only takes the lookup's values.
func TestFarmAddresses(t *testing.T) {
	lookup := func(n string) (Address, bool) {
		if n == "shared" {
			return Address{Name: "shared", Family: FamilyIPv4, Addr: mustAddr("10.9.0.1"), Ports: []PortRange{{8080, 8080}}, Protocol: ProtoUDP}, true
		}
		return Address{}, false
	}
	fs, err := DecodeFarmsWith([]byte(`{"farms":[{"name":"k","addresses":[{"name":"k-svc","family":"ipv4","ip-addr":"10.96.0.10","ports":"53","protocol":"udp"},
		{"name":"ext","family":"ipv4","ip-addr":"192.0.2.1","ports":"53","protocol":"udp"}]},
		{"name":"r","addresses":[{"name":"shared"}]}]}`), noFarm, lookup)
	if err != nil {
		t.Fatal(err)
	}
	k, r := fs[0], fs[1]
	if k.VirtualAddr.String() != "10.96.0.10" || k.Protocol != ProtoUDP || k.OwnAddressName() != "k-svc" || len(k.Addresses) != 1 || k.Addresses[0].Addr.String() != "192.0.2.1" {
		t.Errorf("k = %+v", k)
	}
	if r.VirtualAddr.String() != "10.9.0.1" || r.OwnAddressName() != "shared" || r.Protocol != ProtoUDP {
		t.Errorf("r = %+v", r)
	}
	if !strings.Contains(string(k.AppendJSON(nil)), `"addresses":[{"name":"k-svc","family":"ipv4","ip-addr":"10.96.0.10","ports":"53","protocol":"udp","used":"1"},{"name":"ext"`) {
		t.Errorf("encoded %s", k.AppendJSON(nil))
	}
	// Round trip.
	if g := decodeOne(t, string(k.AppendJSON(nil))); string(g.AppendJSON(nil)) != string(k.AppendJSON(nil)) {
		t.Errorf("round trip:\n%s\n%s", g.AppendJSON(nil), k.AppendJSON(nil))
	}
	// Removing the own address promotes the next one.
	if !k.RemoveAddress("k-svc") || k.VirtualAddr.String() != "192.0.2.1" || k.OwnAddressName() != "ext" || len(k.Addresses) != 0 {
		t.Errorf("after remove: %+v", k)
	}
	if !k.RemoveAddress("ext") || k.Listens() {
		t.Errorf("after removing all: %+v", k)
	}
}

// A backend on standby behind a lower priority level prints "available",
// which reads back as up.
func TestAvailableState(t *testing.T) {
	f := decodeOne(t, `{"name":"p","virtual-addr":"10.0.0.1","backends":[{"name":"b1","ip-addr":"10.1.0.1","priority":"1","state":"down"},
		{"name":"b2","ip-addr":"10.1.0.2","priority":"2"},{"name":"b3","ip-addr":"10.1.0.3","priority":"3"}]}`)
	enc := string(f.AppendJSON(nil))
	for _, want := range []string{`"name":"b1"`, `"state":"down"`, `"priority":"2","mark":"0x0","est-connlimit":"0","est-connlimit-log-prefix":"","state":"up"`, `"priority":"3","mark":"0x0","est-connlimit":"0","est-connlimit-log-prefix":"","state":"available"`} {
		if !strings.Contains(enc, want) {
			t.Errorf("%s lacks %s", enc, want)
		}
	}
	if g := decodeOne(t, enc); g.Backends[2].State != StateUp {
		t.Errorf("available read back as %v", g.Backends[2].State)
	}
}

// Static sessions name a backend of the farm and need persistence.
func TestStaticSessions(t *testing.T) {
	f := decodeOne(t, `{"name":"s","virtual-addr":"10.0.0.1","persistence":"srcip","backends":[{"name":"b1","ip-addr":"10.1.0.1"}],
		"sessions":[{"client":"10.3.3.3","backend":"b1"}]}`)
	if len(f.Sessions) != 1 || f.Sessions[0] != (StaticSession{"10.3.3.3", "b1"}) {
		t.Fatalf("%+v", f.Sessions)
	}
	if _, err := DecodeFarms([]byte(`{"name":"s","virtual-addr":"10.0.0.1","backends":[{"name":"b1","ip-addr":"10.1.0.1"}],
		"sessions":[{"client":"10.3.3.3","backend":"b1"}]}`), noFarm); err == nil || !strings.Contains(err.Error(), "need persistence") {
		t.Errorf("sessions without persistence: %v", err)
	}
	// The client is read by the farm's persistence; what it cannot read
	// is refused naming the session, the field and the value.
	for persistence, cases := range map[string]map[string]string{
		"srcip": {"10.3.3.3": "", "10.3.3.300": `"10.3.3.300" is not an IPv4`, "fd00::3": "not of the farm's family ipv4",
			"10.3.3.3 80": "has 2 values; persistence \"srcip\" takes 1: srcip"},
		"srcip srcport": {"10.3.3.3 80": "", "10.3.3.3-80": "", "10.3.3.3 http": `srcport "http" is not a port`, "10.3.3.3": "has 1 values"},
		"srcmac":        {"02:00:00:00:00:01": "", "02:00:00:00:00": "is not a MAC address"},
	} {
		for client, want := range cases {
			body := `{"name":"s","virtual-addr":"10.0.0.1","persistence":"` + persistence + `","backends":[{"name":"b1","ip-addr":"10.1.0.1"}],
				"sessions":[{"client":"` + client + `","backend":"b1"}]}`
			_, err := DecodeFarms([]byte(body), noFarm)
			switch {
			case want == "" && err != nil:
				t.Errorf("%s client %q: %v", persistence, client, err)
			case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `session "`+client+`"`)):
				t.Errorf("%s client %q: %v, want an error with %q", persistence, client, err, want)
			}
		}
	}
	if _, err := DecodeFarms([]byte(`{"name":"s","virtual-addr":"10.0.0.1","persistence":"srcip","backends":[{"name":"b1","ip-addr":"10.1.0.1"}],
		"sessions":[{"client":"10.3.3.3","backend":"b1"},{"client":" 10.3.3.3","backend":"b1"}]}`), noFarm); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("a client twice: %v", err)
	}
	k, err := ParseSessionClient(KeySrcIP|KeyDstPort|KeySrcMAC, "10.3.3.3 443 02:00:00:00:00:01")
	if err != nil || k.SrcIP != netip.MustParseAddr("10.3.3.3") || k.DstPort != 443 || k.SrcMAC.String() != "02:00:00:00:00:01" {
		t.Errorf("srcip dstport srcmac: %+v, %v", k, err)
	}
}

// Decoding errors nftlb answers apart are typed.
func TestDecodeErrorKinds(t *testing.T) {
	for body, want := range map[string]string{
		`not json`:                    "structure",
		`{"farms":{"name":"x"}}`:      "structure",
		`{"farms":[{"mode":"dnat"}]}`: "name",
		`{"farms":[{"name":"x","virtual-addr":"10.0.0.1","colour":"red"}]}`: "unknown",
		`{"farms":[{"name":"x","virtual-addr":"10.0.0.1","mode":"red"}]}`:   "value",
	} {
		_, err := DecodeFarms([]byte(body), noFarm)
		var got string
		switch e := err.(type) {
		case *StructureError:
			got = "structure"
		case *MissingNameError:
			got = "name"
		case *FieldError:
			got = "value"
			if e.UnknownField {
				got = "unknown"
			}
		}
		if got != want {
			t.Errorf("%s: %T %v, want %s", body, err, err, want)
		}
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// intra-connect: xlb's default is on (printed), "off" turns it off, "" is
// the default.
func TestIntraConnect(t *testing.T) {
	for body, off := range map[string]bool{
		`{"name":"w","virtual-addr":"10.0.0.1"}`:                         false,
		`{"name":"w","virtual-addr":"10.0.0.1","intra-connect":""}`:      false,
		`{"name":"w","virtual-addr":"10.0.0.1","intra-connect":"on"}`:    false,
		`{"name":"w","virtual-addr":"10.0.0.1","intra-connect":"off"}`:   true,
		`{"name":"w","virtual-addr":"10.0.0.1","intra-connect":false}`:   true,
		`{"name":"w","virtual-addr":"10.0.0.1","intra-connect":"false"}`: true,
	} {
		f := decodeOne(t, body)
		want := `"intra-connect":"on"`
		if off {
			want = `"intra-connect":"off"`
		}
		if f.IntraConnectOff != off || !strings.Contains(string(f.AppendJSON(nil)), want) {
			t.Errorf("%s: off %v, printed %s; want off %v, %s", body, f.IntraConnectOff, f.AppendJSON(nil), off, want)
		}
	}
	if _, err := DecodeFarms([]byte(`{"name":"w","intra-connect":"maybe"}`), noFarm); err == nil || !strings.Contains(err.Error(), "on, off") {
		t.Errorf("intra-connect maybe: %v", err)
	}
}
