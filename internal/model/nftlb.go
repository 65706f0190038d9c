package model

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Fields of nftlb 1.0 beyond the core model: rate units, verdicts, the
// per-limit log prefixes, nfqueue, flow offload, intra-connect, static
// sessions. Their wire forms are nftlb's, so a farm as nftlb's GET /farms
// prints it decodes unchanged. What a data plane does not implement of them
// it refuses (dataplane.CheckNftlbFields).

// RateUnit is the time unit of a rate limit ("10/second").
type RateUnit uint8

const (
	PerSecond RateUnit = iota
	PerMinute
	PerHour
	PerDay
	PerWeek
)

var rateUnitSpec = enumSpec[RateUnit]{[]string{"second", "minute", "hour", "day", "week"}}

func (u RateUnit) String() string { return rateUnitSpec.name(u) }

// Duration is the unit's length (nft's: a day is 86400 s, a week 7 days).
func (u RateUnit) Duration() time.Duration {
	return [...]time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}[min(int(u), int(PerWeek))]
}

// parseRate parses nftlb's "<number>[/<unit>]"; "" is 0/second (unset).
func parseRate(v string, max uint64) (uint32, RateUnit, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, PerSecond, nil
	}
	num, unit, hasUnit := strings.Cut(v, "/")
	n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
	if err != nil || n > max {
		return 0, 0, fmt.Errorf("must be a rate <number>[/<unit>], the number 0-%d and the unit one of %s (e.g. 10/second)", max, rateUnitSpec.allowed())
	}
	u := PerSecond
	if hasUnit {
		var ok bool
		if u, ok = rateUnitSpec.parse(strings.TrimSpace(unit)); !ok {
			return 0, 0, fmt.Errorf("unit %q: allowed units are %s", unit, rateUnitSpec.allowed())
		}
	}
	return uint32(n), u, nil
}

// rateField is a rate limit as nftlb prints it: "<n>/<unit>".
func rateField(name string, n func(*Farm) *uint32, u func(*Farm) *RateUnit) scalarField[Farm] {
	return scalarField[Farm]{
		name: name,
		json: jsonNumber, // a bare number is per second
		decode: func(f *Farm, v string) error {
			num, unit, err := parseRate(v, 1<<31-1)
			if err != nil {
				return err
			}
			*n(f), *u(f) = num, unit
			return nil
		},
		append: func(dst []byte, f *Farm) []byte {
			dst = strconv.AppendUint(append(dst, '"'), uint64(*n(f)), 10)
			dst = append(append(dst, '/'), u(f).String()...)
			return append(dst, '"')
		},
	}
}

// Verdict is what nftlb does when a limit or a policy matches: a set of
// log, drop and accept ("log drop accept", its default: log, and the list
// type's own verdict).
type Verdict uint8

const (
	VerdictLog Verdict = 1 << iota
	VerdictDrop
	VerdictAccept
)

// DefaultVerdict is nftlb's default verdict.
const DefaultVerdict = VerdictLog | VerdictDrop | VerdictAccept

var verdictSpec = flagSpec[Verdict]{"none", []string{"log", "drop", "accept"}}

func (v Verdict) String() string { return verdictSpec.name(v) }

// onOffField is a switch printed "on" or "off" (true and false are
// accepted).
func onOffField[T any](name string, ptr func(*T) *bool) scalarField[T] {
	return scalarField[T]{
		name: name,
		json: jsonBool,
		decode: func(t *T, v string) error {
			switch strings.TrimSpace(v) {
			case "on", "true":
				*ptr(t) = true
			case "off", "false", "":
				*ptr(t) = false
			default:
				return fmt.Errorf("allowed values are on, off")
			}
			return nil
		},
		append: func(dst []byte, t *T) []byte {
			if *ptr(t) {
				return append(dst, `"on"`...)
			}
			return append(dst, `"off"`...)
		},
	}
}

// stringField is free text kept as given (log prefixes).
func stringField[T any](name string, ptr func(*T) *string) scalarField[T] {
	return scalarField[T]{
		name:   name,
		decode: func(t *T, v string) error { *ptr(t) = strings.Clone(v); return nil }, // v may be part of a request body
		append: func(dst []byte, t *T) []byte { return appendJSONString(dst, *ptr(t)) },
	}
}

var queueField = scalarField[Farm]{
	name: "queue",
	json: jsonNumber,
	decode: func(f *Farm, v string) error {
		v = strings.TrimSpace(v)
		if v == "" || v == "-1" {
			f.Queue = -1
			return nil
		}
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return fmt.Errorf("must be an nfqueue number 0-65535, or -1 for none")
		}
		f.Queue = int32(n)
		return nil
	},
	append: func(dst []byte, f *Farm) []byte {
		return append(strconv.AppendInt(append(dst, '"'), int64(f.Queue), 10), '"')
	},
}

var verdictField = scalarField[Farm]{
	name: "verdict",
	decode: func(f *Farm, v string) error {
		if strings.TrimSpace(v) == "" {
			f.Verdict = DefaultVerdict
			return nil
		}
		x, ok := verdictSpec.parse(v)
		if !ok || x == 0 {
			return fmt.Errorf("allowed values are log, drop, accept (several separated by spaces)")
		}
		f.Verdict = x
		return nil
	},
	append: func(dst []byte, f *Farm) []byte { return verdictSpec.appendQuoted(dst, f.Verdict, ' ') },
}

// newnameField renames the farm: the farm named "name" takes the name
// given here (nftlb's "newname"). It is never printed.
var newnameField = scalarField[Farm]{
	name: "newname",
	decode: func(f *Farm, v string) error {
		if !ValidName(v) {
			return fmt.Errorf("must be %s", nameRule)
		}
		if v != f.Name {
			if f.renamedFrom == "" {
				f.renamedFrom = f.Name
			}
			f.Name = strings.Clone(v)
		}
		return nil
	},
}

// RenamedFrom returns the farm's old name if the body that decoded it
// renamed it ("newname"), else "".
func (f *Farm) RenamedFrom() string { return f.renamedFrom }

// StaticSession is a persistence session set by configuration (nftlb's
// static sessions): the client key, as the farm's persistence spells it
// ("10.0.0.7", "10.0.0.7 443"), and the backend's name.
type StaticSession struct {
	Client  string
	Backend string
}

// SessionKey is a static session's client read by the farm's persistence:
// the fields the persistence names are set.
type SessionKey struct {
	SrcIP, DstIP     netip.Addr
	SrcPort, DstPort uint16
	SrcMAC           net.HardwareAddr
}

// sessionFields are the persistence fields in the order a client spells
// them (nftlb's order of its meta flags, xlb's order in session lists).
var sessionFields = []HashKey{KeySrcIP, KeyDstIP, KeySrcPort, KeyDstPort, KeySrcMAC}

// ParseSessionClient reads a static session's client by the persistence
// k: the values of k's fields in the order srcip, dstip, srcport, dstport,
// srcmac, separated by spaces (as nftlb prints them: "10.0.0.7 443") or by
// '-' (as GET /farms/{name}/sessions lists them: "10.0.0.7-443").
func ParseSessionClient(k HashKey, client string) (SessionKey, error) {
	var key SessionKey
	var parts []string
	if strings.ContainsAny(client, " \t") {
		parts = strings.Fields(client)
	} else {
		parts = strings.Split(client, "-")
	}
	var want []string
	for _, f := range sessionFields {
		if k&f != 0 {
			want = append(want, f.String())
		}
	}
	if len(parts) != len(want) {
		return key, fmt.Errorf("has %d values; persistence %q takes %d: %s, separated by spaces or '-'",
			len(parts), persistenceName(k), len(want), strings.Join(want, ", "))
	}
	i := 0
	for _, f := range sessionFields {
		if k&f == 0 {
			continue
		}
		v := parts[i]
		i++
		switch f {
		case KeySrcIP, KeyDstIP:
			a, err := netip.ParseAddr(v)
			if err != nil || a.Zone() != "" || a.Is4In6() {
				return key, fmt.Errorf("%s %q is not an IPv4 or IPv6 address", f, v)
			}
			if f == KeySrcIP {
				key.SrcIP = a
			} else {
				key.DstIP = a
			}
		case KeySrcPort, KeyDstPort:
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return key, fmt.Errorf("%s %q is not a port (0-65535)", f, v)
			}
			if f == KeySrcPort {
				key.SrcPort = uint16(n)
			} else {
				key.DstPort = uint16(n)
			}
		case KeySrcMAC:
			m, err := net.ParseMAC(v)
			if err != nil || len(m) != 6 {
				return key, fmt.Errorf("%s %q is not a MAC address (aa:bb:cc:dd:ee:ff)", f, v)
			}
			key.SrcMAC = m
		}
	}
	if key.SrcIP.IsValid() && key.DstIP.IsValid() && key.SrcIP.Is4() != key.DstIP.Is4() {
		return key, fmt.Errorf("srcip %s and dstip %s are of different families", key.SrcIP, key.DstIP)
	}
	return key, nil
}

// Is4 reports whether the key's addresses are IPv4 (ok false if it has
// none).
func (k SessionKey) Is4() (v4, ok bool) {
	switch {
	case k.SrcIP.IsValid():
		return k.SrcIP.Is4(), true
	case k.DstIP.IsValid():
		return k.DstIP.Is4(), true
	}
	return false, false
}

// validateSessions checks the farm's static sessions: each names a backend
// of the farm and a client its persistence can read, of the farm's family,
// once.
func (f *Farm) validateSessions() error {
	seen := map[string]bool{}
	for _, s := range f.Sessions {
		label := fmt.Sprintf("farm %q session %q", f.Name, s.Client)
		if s.Client == "" {
			return &FieldError{Object: farmObject(f.Name), Field: "sessions.client", Problem: "is required"}
		}
		if _, i := f.Backend(s.Backend); i < 0 {
			return &FieldError{Object: label, Field: "backend", Value: s.Backend, Problem: "names no backend of the farm"}
		}
		if f.Persistence == 0 {
			return &FieldError{Object: label, Field: "client", Value: s.Client, Problem: "static sessions need persistence (srcip, srcport, ...)"}
		}
		k, err := ParseSessionClient(f.Persistence, s.Client)
		if err != nil {
			return &FieldError{Object: label, Field: "client", Value: s.Client, Problem: err.Error()}
		}
		if v4, ok := k.Is4(); ok && f.Family != FamilyDual && v4 != (f.Family == FamilyIPv4) {
			return &FieldError{Object: label, Field: "client", Value: s.Client, Problem: "is not of the farm's family " + f.Family.String()}
		}
		canon := fmt.Sprintf("%s %s %d %d %s", k.SrcIP, k.DstIP, k.SrcPort, k.DstPort, k.SrcMAC)
		if seen[canon] {
			return &FieldError{Object: label, Field: "client", Value: s.Client, Problem: "is listed twice"}
		}
		seen[canon] = true
	}
	return nil
}

// NftlbFieldInUse names the first nftlb 1.0 field (or value) the farm uses
// beyond what every data plane does (its value as nftlb prints it), or ok
// false. A plane that implements some of them names those in implemented
// (by field name) and is told about the others only.
func (f *Farm) NftlbFieldInUse(implemented ...string) (field, value string, ok bool) {
	for _, u := range f.nftlbFieldsInUse() {
		if !slices.Contains(implemented, u[0]) {
			return u[0], u[1], true
		}
	}
	return "", "", false
}

// nftlbFieldsInUse lists the nftlb 1.0 fields the farm uses at values
// other than nftlb's defaults, as {field, value}.
func (f *Farm) nftlbFieldsInUse() [][2]string {
	var out [][2]string
	use := func(field, value string) { out = append(out, [2]string{field, value}) }
	if f.Mode == ModeLocal {
		use("mode", f.Mode.String())
	}
	if f.NewRTLimit != 0 && f.NewRTUnit != PerSecond {
		use("new-rtlimit", fmt.Sprintf("%d/%s", f.NewRTLimit, f.NewRTUnit))
	}
	if f.RstRTLimit != 0 && f.RstRTUnit != PerSecond {
		use("rst-rtlimit", fmt.Sprintf("%d/%s", f.RstRTLimit, f.RstRTUnit))
	}
	if f.LogRTLimit != 0 {
		use("log-rtlimit", fmt.Sprintf("%d/%s", f.LogRTLimit, f.LogRTUnit))
	}
	if f.LimitsTTL != DefaultLimitsTTL {
		use("limits-ttl", fmt.Sprint(f.LimitsTTL))
	}
	for _, x := range [][2]string{{"new-rtlimit-log-prefix", f.NewRTLogPrefix}, {"rst-rtlimit-log-prefix", f.RstRTLogPrefix},
		{"est-connlimit-log-prefix", f.EstConnLogPrefix}, {"tcp-strict-log-prefix", f.TCPStrictLogPrefix}} {
		if x[1] != "" {
			use(x[0], x[1])
		}
	}
	if f.Queue != -1 {
		use("queue", fmt.Sprint(f.Queue))
	}
	if f.Verdict != DefaultVerdict {
		use("verdict", f.Verdict.String())
	}
	if f.FlowOffload {
		use("flow-offload", "on")
	}
	if f.IntraConnectOff {
		use("intra-connect", "off")
	}
	if len(f.Addresses) > 0 {
		use("addresses", f.Addresses[0].Name)
	}
	if len(f.Sessions) > 0 {
		use("sessions", f.Sessions[0].Client)
	}
	if f.Protocol == ProtoAll && len(f.VirtualPorts) > 0 {
		use("virtual-ports", formatPorts(f.VirtualPorts))
	}
	if f.StlsAtIngress() {
		use("iface", f.Iface)
	}
	for _, b := range f.Backends {
		// Each on its own: a plane that implements one must still see
		// the others.
		if b.SourceAddr.IsValid() {
			use("backends.source-addr", b.SourceAddr.String())
		}
		if b.EstConnLogPrefix != "" {
			use("backends.est-connlimit-log-prefix", b.EstConnLogPrefix)
		}
		if b.Port != 0 && f.Protocol == ProtoAll {
			use("backends.port", fmt.Sprint(b.Port))
		}
	}
	return out
}

// decodeSessions sets the farm's static sessions from the value at ss: an
// array of {"client": ..., "backend": ...} (nftlb's "expiration" of a
// dynamic session is read-only and ignored). The list replaces the farm's.
func decodeSessions(f *Farm, d *doc, ss int) error {
	bad := func(problem string) error {
		return &FieldError{Object: farmObject(f.Name), Field: "sessions", Problem: problem}
	}
	switch d.toks[ss].kind {
	case 'n':
		f.Sessions = nil
		return nil
	case '[':
	default:
		return bad("must be an array of {\"client\": ..., \"backend\": ...} objects")
	}
	f.Sessions = nil
	for e, end := d.children(ss); e < end; e = d.toks[e].next {
		if d.toks[e].kind != '{' {
			return bad("must be an array of {\"client\": ..., \"backend\": ...} objects")
		}
		var s StaticSession
		for k, kend := d.children(e); k < kend; k = d.toks[k+1].next {
			text, ok := d.scalar(k + 1)
			if !ok {
				return bad("values of a session must be strings")
			}
			switch key := d.key(k); key {
			case "client":
				s.Client = strings.Clone(strings.TrimSpace(text))
			case "backend":
				s.Backend = strings.Clone(text)
			case "expiration":
			default:
				return &FieldError{Object: farmObject(f.Name), Field: "sessions." + strings.Clone(clip(key)),
					Problem: "unknown field; known fields are client, backend, expiration", UnknownField: true}
			}
		}
		f.Sessions = append(f.Sessions, s)
	}
	return nil
}

func (f *Farm) appendStaticSessionsJSON(dst []byte) []byte {
	dst = append(dst, '[')
	for i, s := range f.Sessions {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"client":`...)
		dst = appendJSONString(dst, s.Client)
		dst = append(dst, `,"backend":`...)
		dst = appendJSONString(dst, s.Backend)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}
