package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// The encoder of commit ec7b831, kept as the oracle of TestAppendJSONUnchanged:
// the farm's JSON is the journal's record and the API's GET response, so
// a faster encoder must write the same bytes. Extended with nftlb 1.0's
// fields (in nftlb's order), addresses and the "available" state.

type oldEncoder[T any] struct {
	name   string
	encode func(t *T) string
}

func oldRate(n uint32, u RateUnit) string { return fmt.Sprintf("%d/%s", n, u) }

func oldOnOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func oldAddr(a netip.Addr) string {
	if a.IsValid() {
		return a.String()
	}
	return ""
}

var oldFarmEncoders = []oldEncoder[Farm]{
	{"name", func(f *Farm) string { return f.Name }},
	{"family", func(f *Farm) string { return familySpec.name(f.Family) }},
	{"virtual-addr", func(f *Farm) string {
		switch {
		case !f.VirtualAddr.IsValid():
			return ""
		case f.VirtualAddr2.IsValid():
			return f.VirtualAddr.String() + "," + f.VirtualAddr2.String()
		}
		return f.VirtualAddr.String()
	}},
	{"virtual-ports", func(f *Farm) string { return formatPorts(f.VirtualPorts) }},
	{"source-addr", func(f *Farm) string { return oldAddr(f.SourceAddr) }},
	{"mode", func(f *Farm) string { return modeSpec.name(f.Mode) }},
	{"responsettl", func(f *Farm) string { return strconv.FormatUint(uint64(f.ResponseTTL), 10) }},
	{"protocol", func(f *Farm) string { return protocolSpec.name(f.Protocol) }},
	{"scheduler", func(f *Farm) string { return schedulerSpec.name(f.Scheduler) }},
	{"sched-param", func(f *Farm) string { return f.SchedParam.String() }},
	{"persistence", func(f *Farm) string { return persistenceName(f.Persistence) }},
	{"persist-ttl", func(f *Farm) string { return strconv.FormatUint(uint64(f.PersistTTL), 10) }},
	{"helper", func(f *Farm) string { return helperSpec.name(f.Helper) }},
	{"log", func(f *Farm) string { return f.Log.String() }},
	{"log-prefix", func(f *Farm) string { return f.LogPrefix }},
	{"log-rtlimit", func(f *Farm) string { return oldRate(f.LogRTLimit, f.LogRTUnit) }},
	{"mark", func(f *Farm) string { return "0x" + strconv.FormatUint(uint64(f.Mark), 16) }},
	{"priority", func(f *Farm) string { return strconv.FormatUint(uint64(f.PriorityLevel()), 10) }},
	{"state", func(f *Farm) string { return stateSpec.name(f.State) }},
	{"limits-ttl", func(f *Farm) string { return strconv.FormatUint(uint64(f.LimitsTTL), 10) }},
	{"new-rtlimit", func(f *Farm) string { return oldRate(f.NewRTLimit, f.NewRTUnit) }},
	{"new-rtlimit-burst", func(f *Farm) string { return strconv.FormatUint(uint64(f.NewRTBurst), 10) }},
	{"new-rtlimit-log-prefix", func(f *Farm) string { return f.NewRTLogPrefix }},
	{"rst-rtlimit", func(f *Farm) string { return oldRate(f.RstRTLimit, f.RstRTUnit) }},
	{"rst-rtlimit-burst", func(f *Farm) string { return strconv.FormatUint(uint64(f.RstRTBurst), 10) }},
	{"rst-rtlimit-log-prefix", func(f *Farm) string { return f.RstRTLogPrefix }},
	{"est-connlimit", func(f *Farm) string { return strconv.FormatUint(uint64(f.EstConnLimit), 10) }},
	{"est-connlimit-log-prefix", func(f *Farm) string { return f.EstConnLogPrefix }},
	{"tcp-strict", func(f *Farm) string { return oldOnOff(f.TCPStrict) }},
	{"tcp-strict-log-prefix", func(f *Farm) string { return f.TCPStrictLogPrefix }},
	{"queue", func(f *Farm) string { return strconv.Itoa(int(f.Queue)) }},
	{"verdict", func(f *Farm) string { return f.Verdict.String() }},
	{"flow-offload", func(f *Farm) string { return oldOnOff(f.FlowOffload) }},
	{"intra-connect", func(f *Farm) string { return oldOnOff(!f.IntraConnectOff) }},
	{"iface", func(f *Farm) string { return f.Iface }},
	{"oface", func(f *Farm) string { return f.Oface }},
	{"ether-addr", func(f *Farm) string { return f.EtherAddr.String() }},
}

var oldBackendEncoders = []oldEncoder[Backend]{
	{"name", func(b *Backend) string { return b.Name }},
	{"ip-addr", func(b *Backend) string { return oldAddr(b.Addr) }},
	{"port", func(b *Backend) string {
		if b.Port == 0 {
			return ""
		}
		return strconv.Itoa(int(b.Port))
	}},
	{"source-addr", func(b *Backend) string { return oldAddr(b.SourceAddr) }},
	{"weight", func(b *Backend) string { return strconv.FormatUint(uint64(b.Weight), 10) }},
	{"priority", func(b *Backend) string { return strconv.FormatUint(uint64(b.Priority), 10) }},
	{"mark", func(b *Backend) string { return "0x" + strconv.FormatUint(uint64(b.Mark), 16) }},
	{"est-connlimit", func(b *Backend) string { return strconv.FormatUint(uint64(b.EstConnLimit), 10) }},
	{"est-connlimit-log-prefix", func(b *Backend) string { return b.EstConnLogPrefix }},
	{"state", func(b *Backend) string { return stateSpec.name(b.State) }},
	{"ether-addr", func(b *Backend) string { return b.EtherAddr.String() }},
}

func oldAppendJSON(f *Farm, dst []byte) []byte {
	dst = append(dst, '{')
	for i, e := range oldFarmEncoders {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = oldAppendJSONString(dst, e.name)
		dst = append(dst, ':')
		dst = oldAppendJSONString(dst, e.encode(f))
	}
	dst = append(dst, `,"addresses":[`...)
	for i, a := range f.AllAddresses() {
		if i > 0 {
			dst = append(dst, ',')
		}
		ip := oldAddr(a.Addr)
		if a.Addr.IsValid() && a.Addr2.IsValid() {
			ip += "," + a.Addr2.String()
		}
		dst = fmt.Appendf(dst, `{"name":%s,"family":%s,"ip-addr":%s,"ports":%s,"protocol":%s,"used":"1"}`,
			oldAppendJSONString(nil, a.Name), oldAppendJSONString(nil, a.Family.String()), oldAppendJSONString(nil, ip),
			oldAppendJSONString(nil, formatPorts(a.Ports)), oldAppendJSONString(nil, a.Protocol.String()))
	}
	dst = append(dst, `],"backends":[`...)
	level := f.PriorityLevel()
	for i := range f.Backends {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '{')
		for j, e := range oldBackendEncoders {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = oldAppendJSONString(dst, e.name)
			dst = append(dst, ':')
			if b := &f.Backends[i]; e.name == "state" && b.State == StateUp && b.Priority > level {
				dst = oldAppendJSONString(dst, "available")
				continue
			}
			dst = oldAppendJSONString(dst, e.encode(&f.Backends[i]))
		}
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if len(f.Sessions) > 0 {
		dst = append(dst, `,"sessions":[`...)
		for i, x := range f.Sessions {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = fmt.Appendf(dst, `{"client":%s,"backend":%s}`, oldAppendJSONString(nil, x.Client), oldAppendJSONString(nil, x.Backend))
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"policies":[`...)
	for i, p := range f.Policies {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"name":`...)
		dst = oldAppendJSONString(dst, p.Name)
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

func oldAppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r < 0x20 || r == utf8.RuneError:
			dst = fmt.Appendf(dst, `\u%04x`, r)
		default:
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// randomFarm fills every field of a farm with values valid or not (the
// encoder writes whatever a farm holds): odd strings, zones, flags beyond
// the known ones, enums out of range.
func randomFarm(r *rand.Rand) Farm {
	strs := []string{"", "web", "a\"b\\c", "tab\there", "é😀", "bad\xffutf8\xc3", "\x00\x1f\x7f", "<>&\u2028", "eth0", strings.Repeat("x", 70)}
	addrs := []netip.Addr{{}, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("fd00::1"),
		netip.MustParseAddr("::ffff:10.1.2.3"), netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr(`fe80::2%we"ird\zone` + "\xff"),
		netip.MustParseAddr(`fe80::3%back\slash`), netip.MustParseAddr("fe80::4%tab\t"), netip.MustParseAddr("fe80::5%é"),
		netip.MustParseAddr("2001:db8:1234:5678:9abc:def0:1234:5678"), netip.MustParseAddr("::")}
	u32 := func() uint32 {
		switch r.IntN(4) {
		case 0:
			return 0
		case 1:
			return uint32(r.IntN(100))
		case 2:
			return 0xffffffff
		}
		return r.Uint32()
	}
	ether := func() EtherAddr {
		if r.IntN(2) == 0 {
			return EtherAddr{}
		}
		var e EtherAddr
		for i := range e {
			e[i] = byte(r.Uint32())
		}
		return e
	}
	f := Farm{
		Name: strs[r.IntN(len(strs))], Family: Family(r.IntN(5)),
		VirtualAddr: addrs[r.IntN(len(addrs))], VirtualAddr2: addrs[r.IntN(len(addrs))], SourceAddr: addrs[r.IntN(len(addrs))],
		Protocol: Protocol(r.IntN(6)), Mode: Mode(r.IntN(6)), Scheduler: Scheduler(r.IntN(7)),
		SchedParam: HashKey(r.Uint32()), Persistence: HashKey(r.Uint32()), PersistTTL: u32(),
		Helper: Helper(r.IntN(13)), Log: LogHook(r.Uint32()), LogPrefix: strs[r.IntN(len(strs))],
		Mark: u32(), State: State(r.IntN(4)),
		NewRTLimit: u32(), NewRTBurst: u32(), RstRTLimit: u32(), RstRTBurst: u32(), EstConnLimit: u32(),
		TCPStrict: r.IntN(2) == 0, Iface: strs[r.IntN(len(strs))], Oface: strs[r.IntN(len(strs))], EtherAddr: ether(),
		NewRTUnit: RateUnit(r.IntN(6)), RstRTUnit: RateUnit(r.IntN(6)), LogRTLimit: u32(), LogRTUnit: RateUnit(r.IntN(6)),
		LimitsTTL: u32(), NewRTLogPrefix: strs[r.IntN(len(strs))], RstRTLogPrefix: strs[r.IntN(len(strs))],
		EstConnLogPrefix: strs[r.IntN(len(strs))], TCPStrictLogPrefix: strs[r.IntN(len(strs))],
		Queue: int32(u32()), Verdict: Verdict(r.Uint32()), FlowOffload: r.IntN(2) == 0, ResponseTTL: u32(), IntraConnectOff: r.IntN(2) == 0,
		AddrName: strs[r.IntN(len(strs))],
	}
	for range r.IntN(3) {
		f.Addresses = append(f.Addresses, Address{Name: strs[r.IntN(len(strs))], Family: Family(r.IntN(5)),
			Addr: addrs[r.IntN(len(addrs))], Addr2: addrs[r.IntN(len(addrs))], Protocol: Protocol(r.IntN(6))})
	}
	for range r.IntN(2) {
		f.Sessions = append(f.Sessions, StaticSession{Client: strs[r.IntN(len(strs))], Backend: strs[r.IntN(len(strs))]})
	}
	if r.IntN(4) == 0 {
		f.SchedParam, f.Persistence, f.Log = 0, 0, 0
	}
	for range r.IntN(5) {
		lo := uint16(r.Uint32())
		f.VirtualPorts = append(f.VirtualPorts, PortRange{lo, lo + uint16(r.IntN(3))*uint16(r.Uint32())})
	}
	for range r.IntN(6) {
		f.Backends = append(f.Backends, Backend{Name: strs[r.IntN(len(strs))], Addr: addrs[r.IntN(len(addrs))],
			Port: uint16(r.Uint32() >> uint(r.IntN(2)*31)), Weight: u32(), Priority: u32(), Mark: u32(), EstConnLimit: u32(),
			State: State(r.IntN(4)), EtherAddr: ether(), SourceAddr: addrs[r.IntN(len(addrs))], EstConnLogPrefix: strs[r.IntN(len(strs))]})
	}
	for range r.IntN(3) {
		f.Policies = append(f.Policies, PolicyRef{Name: strs[r.IntN(len(strs))]})
	}
	return f
}

// The encoder writes the same bytes as before, for the farms of the other
// tests' shapes and for farms with every field drawn at random.
func TestAppendJSONUnchanged(t *testing.T) {
	farms := []Farm{NewFarm("empty"), {}}
	big, err := DecodeFarms(farmBody(100), noFarm)
	if err != nil {
		t.Fatal(err)
	}
	farms = append(farms, big...)
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		farms = append(farms, randomFarm(r))
	}
	for i := range farms {
		f := &farms[i]
		want := string(oldAppendJSON(f, []byte("prefix")))
		if got := string(f.appendJSON([]byte("prefix"))); got != want {
			t.Fatalf("farm %d (%+v):\n got %s\nwant %s", i, *f, got, want)
		}
	}
}
