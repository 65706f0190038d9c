package model

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Active health checks: a farm carries a "check" object, and a backend may
// carry one too, whose fields override the farm's for that backend. A
// checker never rewrites any of this: health is kept apart from the
// configured state (see internal/health and the engine's effective farms).
//
//	"check": {"type": "http", "path": "/health", "status": "200-399",
//	          "inter": "1s", "timeout": "500ms", "rise": "2", "fall": "3"}
//
// Values are strings, as every nftlb value; numbers are accepted too.
// Durations need a unit ("500ms", "1s", "2m"). In a request a check object
// is a patch, as farms and backends are: the fields it names replace the
// current ones; "check": null removes the check.

// CheckType is the kind of active check.
type CheckType uint8

const (
	// CheckUnset: a farm without a check; a backend that takes its farm's.
	CheckUnset CheckType = iota
	// CheckNone: a backend that is not checked although its farm is.
	CheckNone
	CheckTCP   // a TCP connect (then, with send/expect, an exchange)
	CheckHTTP  // an HTTP request; the status (and body) decide
	CheckHTTPS // the same over TLS
	CheckUDP   // a datagram; an ICMP port unreachable is down
	CheckExec  // a command: exit 0 up, anything else down
	CheckAgent // HAProxy's agent check: a TCP agent answers up, down, drain, maint or NN%
)

var checkTypeSpec = enumSpec[CheckType]{[]string{"", "none", "tcp", "http", "https", "udp", "exec", "agent"}}

const checkTypesAllowed = "none, tcp, http, https, udp, exec, agent"

func (t CheckType) String() string { return checkTypeSpec.name(t) }

// UsesPort reports whether checks of this type connect to a port.
func (t CheckType) UsesPort() bool { return t >= CheckTCP && t != CheckExec }

// OnDown says what happens to a backend's established connections when its
// check says it is down. New connections never go to it either way.
type OnDown uint8

const (
	OnDownKeep  OnDown = iota // established connections go on (a drain)
	OnDownFlush               // they are cut: the data plane's tracked flows of the backend are deleted
)

var onDownSpec = enumSpec[OnDown]{[]string{"keep", "flush"}}

func (o OnDown) String() string { return onDownSpec.name(o) }

// InitState is the state a check starts in.
type InitState uint8

const (
	InitUp   InitState = iota // serving until fall failures
	InitDown                  // out until rise passes
)

var initStateSpec = enumSpec[InitState]{[]string{"up", "down"}}

func (s InitState) String() string { return initStateSpec.name(s) }

// StatusRange is an inclusive range of HTTP status codes.
type StatusRange struct{ First, Last uint16 }

// Check configures an active health check. Zero fields take the defaults
// (a backend's zero fields take its farm's check first); see Resolve.
// Values are immutable once in a farm handed to the engine.
type Check struct {
	Type CheckType
	// Port is where checks connect; 0: the backend's port, or the farm's
	// virtual port when the backend has none (and the farm has one).
	Port uint16
	// SourceAddr is the checks' source address; invalid: the kernel's choice.
	SourceAddr netip.Addr

	Inter     time.Duration // between checks while the state is settled
	FastInter time.Duration // while the state is changing (a check failed while up, or passed while down)
	DownInter time.Duration // while down
	Timeout   time.Duration // of one check
	Warmup    time.Duration // the weight ramps up over this long after coming up
	Rise      uint32        // consecutive passes to come up
	Fall      uint32        // consecutive failures to go down

	// http, https.
	Method     string
	Path       string
	Host       string        // Host header, and the TLS server name (SNI)
	Status     []StatusRange // expected status codes; empty: 200-399
	BodyRegex  string        // the body must match
	BodyDigest string        // hex MD5 (32 digits) or SHA-256 (64) of the body
	// https: Verify checks the backend's certificate (against CAFile, or
	// the system's roots) and its name (host, else the backend's address).
	Verify bool
	CAFile string // PEM file of the CAs to trust (an absolute path)

	// tcp, udp, agent: Send is sent after connecting (udp: the datagram);
	// tcp, udp: Expect must appear in the answer. "hex:..." spells bytes.
	Send   string
	Expect string

	// InitState is a new check's state before its first results: up
	// (keepalived's default; `fall` failures take it down) or down (it
	// needs `rise` passes: keepalived's alpha, HAProxy's init-state
	// fully-down).
	InitState InitState

	// tcp: HalfOpen sends a SYN and takes the SYN-ACK (up) or RST (down)
	// without completing the connection (IPv4; much cheaper than a
	// connect, see internal/health/synprobe.go).
	HalfOpen bool

	// exec: run with /bin/sh -c; exit 0 up, else down; a stdout line
	// "weight N" sets the backend's weight (keepalived's misc_dynamic).
	Command string

	// Farm only: what a backend that goes down does to its connections,
	// and the quorum below which the sorry server serves instead.
	OnDown      OnDown
	Inhibit     bool   // keepalived's inhibit_on_failure: a down backend stays listed with weight 0
	Quorum      uint32 // backends up for the farm to serve from its backends; 0: 1
	Hysteresis  uint32 // quorum is lost below quorum-hysteresis, regained at quorum+hysteresis
	SorryServer string // a backend of the farm that serves (alone) only while the quorum is lost; it is not checked

	// Passive (farm only) ejects backends whose forwarded connections
	// fail (passive.go); nil: none. Never part of a resolved check.
	Passive *PassiveCheck
}

// Check defaults (HAProxy's inter, rise and fall).
const (
	DefaultCheckInter   = 2 * time.Second
	DefaultCheckTimeout = time.Second
	DefaultCheckRise    = 2
	DefaultCheckFall    = 3
	MinCheckInter       = 10 * time.Millisecond
	MaxCheckInter       = 24 * time.Hour
	MinCheckTimeout     = time.Millisecond
	MaxCheckTimeout     = time.Hour
	MaxCheckWarmup      = time.Hour
	MaxCheckCount       = 1000 // rise, fall
	MaxCheckText        = 1024 // path, host, send, expect, command, regex
)

// DefaultStatus is the expected HTTP status of a check without "status".
var DefaultStatus = []StatusRange{{200, 399}}

// farmOnlyCheckFields may appear only in a farm's check.
var farmOnlyCheckFields = []string{"on-down", "inhibit", "quorum", "hysteresis", "sorry-server", "passive"}

// durationField decodes a duration of lo to hi; lo 0 allows 0 (none).
func durationField[T any](name string, lo, hi time.Duration, ptr func(*T) *time.Duration) scalarField[T] {
	return scalarField[T]{
		name: name,
		decode: func(c *T, v string) error {
			v = strings.TrimSpace(v)
			d, err := time.ParseDuration(v)
			if err != nil || d < lo || d > hi {
				return fmt.Errorf("must be a duration of %s to %s with a unit, e.g. 500ms, 1s, 2m", fmtDur(lo), hi)
			}
			*ptr(c) = d
			return nil
		},
		append: func(dst []byte, c *T) []byte { return appendJSONString(dst, ptr(c).String()) },
	}
}

func textField(name string, ptr func(*Check) *string) scalarField[Check] {
	return scalarField[Check]{
		name: name,
		decode: func(c *Check, v string) error {
			if len(v) > MaxCheckText {
				return fmt.Errorf("at most %d bytes", MaxCheckText)
			}
			*ptr(c) = strings.Clone(v) // v may be part of a request body
			return nil
		},
		append: func(dst []byte, c *Check) []byte { return appendJSONString(dst, *ptr(c)) },
	}
}

func checkUintField(name string, ptr func(*Check) *uint32) scalarField[Check] {
	return uintField(name, MaxCheckCount, 0, ptr)
}

// checkFields are the members of a check object, in output order. Only
// fields with a value are written (a backend's check lists what it
// overrides).
var checkFields = []scalarField[Check]{
	{
		name: "type",
		decode: func(c *Check, v string) error {
			t, ok := checkTypeSpec.parse(strings.TrimSpace(v))
			if !ok || t == CheckUnset {
				return fmt.Errorf("allowed values are %s", checkTypesAllowed)
			}
			c.Type = t
			return nil
		},
		append: func(dst []byte, c *Check) []byte { return appendJSONString(dst, c.Type.String()) },
	},
	{
		name: "port",
		decode: func(c *Check, v string) error {
			if strings.TrimSpace(v) == "" {
				c.Port = 0
				return nil
			}
			n, err := parseUint("port", v, 65535)
			if err != nil {
				return fmt.Errorf("must be a port 1-65535, or empty for the backend's port")
			}
			c.Port = uint16(n)
			return nil
		},
		append: func(dst []byte, c *Check) []byte { return appendQuotedUint(dst, "", uint64(c.Port), 10) },
	},
	addrField("source-addr", func(c *Check) *netip.Addr { return &c.SourceAddr }),
	durationField("inter", MinCheckInter, MaxCheckInter, func(c *Check) *time.Duration { return &c.Inter }),
	durationField("fastinter", MinCheckInter, MaxCheckInter, func(c *Check) *time.Duration { return &c.FastInter }),
	durationField("downinter", MinCheckInter, MaxCheckInter, func(c *Check) *time.Duration { return &c.DownInter }),
	durationField("timeout", MinCheckTimeout, MaxCheckTimeout, func(c *Check) *time.Duration { return &c.Timeout }),
	checkUintField("rise", func(c *Check) *uint32 { return &c.Rise }),
	checkUintField("fall", func(c *Check) *uint32 { return &c.Fall }),
	durationField("warmup", 0, MaxCheckWarmup, func(c *Check) *time.Duration { return &c.Warmup }),
	textField("method", func(c *Check) *string { return &c.Method }),
	textField("path", func(c *Check) *string { return &c.Path }),
	textField("host", func(c *Check) *string { return &c.Host }),
	{
		name: "status",
		decode: func(c *Check, v string) error {
			rs, err := ParseStatusRanges(v)
			if err != nil {
				return err
			}
			c.Status = rs
			return nil
		},
		append: func(dst []byte, c *Check) []byte { return appendJSONString(dst, FormatStatusRanges(c.Status)) },
	},
	textField("body-regex", func(c *Check) *string { return &c.BodyRegex }),
	textField("body-digest", func(c *Check) *string { return &c.BodyDigest }),
	textField("send", func(c *Check) *string { return &c.Send }),
	textField("expect", func(c *Check) *string { return &c.Expect }),
	textField("command", func(c *Check) *string { return &c.Command }),
	onOffField("half-open", func(c *Check) *bool { return &c.HalfOpen }),
	onOffField("verify", func(c *Check) *bool { return &c.Verify }),
	textField("ca-file", func(c *Check) *string { return &c.CAFile }),
	enumField("init-state", initStateSpec, func(c *Check) *InitState { return &c.InitState }),
	enumField("on-down", onDownSpec, func(c *Check) *OnDown { return &c.OnDown }),
	onOffField("inhibit", func(c *Check) *bool { return &c.Inhibit }),
	uintField("quorum", MaxBackends, 0, func(c *Check) *uint32 { return &c.Quorum }),
	uintField("hysteresis", MaxBackends, 0, func(c *Check) *uint32 { return &c.Hysteresis }),
	textField("sorry-server", func(c *Check) *string { return &c.SorryServer }),
}

// set reports whether field i of checkFields has a value in c (is written).
func (c *Check) set(i int) bool {
	switch checkFields[i].name {
	case "type":
		return c.Type != CheckUnset
	case "port":
		return c.Port != 0
	case "source-addr":
		return c.SourceAddr.IsValid()
	case "inter":
		return c.Inter != 0
	case "fastinter":
		return c.FastInter != 0
	case "downinter":
		return c.DownInter != 0
	case "timeout":
		return c.Timeout != 0
	case "rise":
		return c.Rise != 0
	case "fall":
		return c.Fall != 0
	case "warmup":
		return c.Warmup != 0
	case "method":
		return c.Method != ""
	case "path":
		return c.Path != ""
	case "host":
		return c.Host != ""
	case "status":
		return len(c.Status) > 0
	case "body-regex":
		return c.BodyRegex != ""
	case "body-digest":
		return c.BodyDigest != ""
	case "send":
		return c.Send != ""
	case "expect":
		return c.Expect != ""
	case "command":
		return c.Command != ""
	case "half-open":
		return c.HalfOpen
	case "verify":
		return c.Verify
	case "ca-file":
		return c.CAFile != ""
	case "init-state":
		return c.InitState != InitUp
	case "on-down":
		return c.OnDown != OnDownKeep
	case "inhibit":
		return c.Inhibit
	case "quorum":
		return c.Quorum != 0
	case "hysteresis":
		return c.Hysteresis != 0
	case "sorry-server":
		return c.SorryServer != ""
	}
	return false
}

// appendCheckJSON appends the check as a JSON object of its set fields.
func appendCheckJSON(dst []byte, c *Check) []byte {
	dst = append(dst, '{')
	first := true
	for i := range checkFields {
		if !c.set(i) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, checkFields[i].name)
		dst = append(dst, ':')
		dst = checkFields[i].append(dst, c)
	}
	if c.Passive != nil {
		if !first {
			dst = append(dst, ',')
		}
		dst = append(dst, `"passive":`...)
		dst = appendPassiveJSON(dst, c.Passive)
	}
	return append(dst, '}')
}

// decodeCheck patches cur (nil: none) with the check object at tape index
// v, or removes it (null). The result is a new Check: farms share theirs.
func decodeCheck(d *doc, v int, name objName, cur *Check) (*Check, error) {
	switch d.toks[v].kind {
	case 'n':
		return nil, nil
	case '{':
	default:
		return nil, &FieldError{Object: name.String(), Field: "check", Value: truncate(d.raw(v)),
			Problem: "must be an object, e.g. {\"type\": \"tcp\", \"inter\": \"1s\"}, or null"}
	}
	var c Check
	if cur != nil {
		c = *cur
		c.Status = append([]StatusRange(nil), cur.Status...)
	}
	if err := decodeMembers(d, v, name, &c, checkFields, []string{"passive"}); err != nil {
		if fe, ok := err.(*FieldError); ok {
			fe.Field = "check." + fe.Field
		}
		return nil, err
	}
	if pv := d.lastMember(v, "passive"); pv >= 0 && !name.isBackend {
		p, err := decodePassive(d, pv, name, c.Passive)
		if err != nil {
			return nil, err
		}
		c.Passive = p
	}
	if name.isBackend {
		for k, end := d.children(v); k < end; k = d.toks[k+1].next {
			for _, f := range farmOnlyCheckFields {
				if d.key(k) == f {
					return nil, fieldError(name.String(), "check."+f, "", "is set in the farm's check only (it applies to the whole farm)")
				}
			}
		}
	}
	return &c, nil
}

// ParseStatusRanges parses "200-399,404" (codes 100-599).
func ParseStatusRanges(v string) ([]StatusRange, error) {
	rs, bad := parseRangeList(v, 100, 599)
	if bad != "" {
		return nil, fmt.Errorf("must be HTTP status codes 100-599 or ranges low-high separated by commas, e.g. 200-399,404 (bad part %q)", bad)
	}
	var out []StatusRange
	for _, r := range rs {
		out = append(out, StatusRange(r))
	}
	return out, nil
}

// FormatStatusRanges writes ranges as ParseStatusRanges reads them.
func FormatStatusRanges(rs []StatusRange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		if r.First == r.Last {
			parts[i] = strconv.Itoa(int(r.First))
		} else {
			parts[i] = fmt.Sprintf("%d-%d", r.First, r.Last)
		}
	}
	return strings.Join(parts, ",")
}

// StatusOK reports whether code is in the ranges (DefaultStatus if none).
func StatusOK(rs []StatusRange, code int) bool {
	if len(rs) == 0 {
		rs = DefaultStatus
	}
	for _, r := range rs {
		if code >= int(r.First) && code <= int(r.Last) {
			return true
		}
	}
	return false
}

// DecodePayload returns the bytes a send or expect value spells: "hex:..."
// is hexadecimal, anything else is the text itself.
func DecodePayload(v string) ([]byte, error) {
	if h, ok := strings.CutPrefix(v, "hex:"); ok {
		b, err := hex.DecodeString(strings.ReplaceAll(h, " ", ""))
		if err != nil {
			return nil, fmt.Errorf("after \"hex:\" must come hexadecimal digits")
		}
		return b, nil
	}
	return []byte(v), nil
}

// Resolve returns the check that runs on backend i of f: the farm's check
// with the backend's fields over it and the defaults filled in. ok is
// false when the backend is not checked: neither has a check, the result
// is type none, or the backend is the farm's sorry server (not checked, as
// in keepalived).
func (f *Farm) Resolve(i int) (c Check, ok bool) {
	b := &f.Backends[i]
	if f.Check != nil {
		c = *f.Check
		c.Passive = nil // not an active check's: PassiveKey
		if c.SorryServer == b.Name {
			return Check{}, false
		}
	}
	if o := b.Check; o != nil {
		overlay(&c, o)
	}
	if c.Type == CheckUnset || c.Type == CheckNone {
		return Check{}, false
	}
	if c.Port == 0 {
		c.Port = b.Port
		if c.Port == 0 && len(f.VirtualPorts) > 0 {
			c.Port = f.VirtualPorts[0].First
		}
	}
	if c.Inter == 0 {
		c.Inter = DefaultCheckInter
	}
	if c.FastInter == 0 {
		c.FastInter = c.Inter
	}
	if c.DownInter == 0 {
		c.DownInter = c.Inter
	}
	if c.Timeout == 0 {
		c.Timeout = min(DefaultCheckTimeout, c.Inter)
	}
	if c.Rise == 0 {
		c.Rise = DefaultCheckRise
	}
	if c.Fall == 0 {
		c.Fall = DefaultCheckFall
	}
	if c.Type == CheckHTTP || c.Type == CheckHTTPS {
		if c.Method == "" {
			c.Method = "GET"
		}
		if c.Path == "" {
			c.Path = "/"
		}
		if len(c.Status) == 0 {
			c.Status = DefaultStatus
		}
	}
	return c, true
}

// overlay sets on c every field o sets (a backend's override).
func overlay(c, o *Check) {
	if o.Type != CheckUnset {
		if o.Type != c.Type {
			// Another kind of check: the farm's type-specific fields do
			// not carry over.
			*c = Check{OnDown: c.OnDown, Inhibit: c.Inhibit, Quorum: c.Quorum, Hysteresis: c.Hysteresis, SorryServer: c.SorryServer,
				SourceAddr: c.SourceAddr, Inter: c.Inter, FastInter: c.FastInter, DownInter: c.DownInter,
				Timeout: c.Timeout, Warmup: c.Warmup, Rise: c.Rise, Fall: c.Fall, InitState: c.InitState}
		}
		c.Type = o.Type
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	setD := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	setU := func(dst *uint32, v uint32) {
		if v != 0 {
			*dst = v
		}
	}
	if o.Port != 0 {
		c.Port = o.Port
	}
	if o.SourceAddr.IsValid() {
		c.SourceAddr = o.SourceAddr
	}
	setD(&c.Inter, o.Inter)
	setD(&c.FastInter, o.FastInter)
	setD(&c.DownInter, o.DownInter)
	setD(&c.Timeout, o.Timeout)
	setD(&c.Warmup, o.Warmup)
	setU(&c.Rise, o.Rise)
	setU(&c.Fall, o.Fall)
	set(&c.Method, o.Method)
	set(&c.Path, o.Path)
	set(&c.Host, o.Host)
	if len(o.Status) > 0 {
		c.Status = o.Status
	}
	set(&c.BodyRegex, o.BodyRegex)
	set(&c.BodyDigest, o.BodyDigest)
	set(&c.Send, o.Send)
	set(&c.Expect, o.Expect)
	set(&c.Command, o.Command)
	if o.HalfOpen {
		c.HalfOpen = true
	}
	if o.Verify {
		c.Verify = true
	}
	set(&c.CAFile, o.CAFile)
	if o.InitState != InitUp {
		c.InitState = o.InitState
	}
}

// HasChecks reports whether any backend of f is checked, or f has a sorry
// server (whose serving depends on the others' health).
func (f *Farm) HasChecks() bool {
	if f.Check != nil && (f.Check.Type != CheckUnset || f.Check.Passive != nil) {
		return true
	}
	for i := range f.Backends {
		if c := f.Backends[i].Check; c != nil && c.Type != CheckUnset && c.Type != CheckNone {
			return true
		}
	}
	return false
}

// validateChecks checks the farm's check, each backend's override and
// each resolved check. It returns the first problem as a *FieldError.
func (f *Farm) validateChecks() error {
	if c := f.Check; c != nil {
		if err := validateCheck(farmObject(f.Name), c); err != nil {
			return err
		}
		bad := func(field, value, problem string) error {
			return &FieldError{Object: farmObject(f.Name), Field: "check." + field, Value: value, Problem: problem}
		}
		if c.Type == CheckNone {
			return bad("type", "none", "a farm without checks has no check object (\"check\": null); type none is for a backend of a checked farm")
		}
		if c.SorryServer != "" {
			if _, i := f.Backend(c.SorryServer); i < 0 {
				return bad("sorry-server", c.SorryServer, "must name a backend of the farm")
			}
		}
		q := max(c.Quorum, 1)
		if c.Hysteresis >= q {
			return bad("hysteresis", fmt.Sprint(c.Hysteresis), fmt.Sprintf("must be below the quorum (%d)", q))
		}
		if c.Inhibit && c.OnDown == OnDownFlush {
			return bad("inhibit", "on", "inhibit keeps a down backend's connections (weight 0); on-down flush cuts them: choose one")
		}
		if c.Passive != nil {
			if err := f.validatePassive(c.Passive); err != nil {
				return err
			}
		}
	}
	for i := range f.Backends {
		b := &f.Backends[i]
		if b.Check != nil {
			if err := validateCheck(backendObject(f.Name, b.Name), b.Check); err != nil {
				return err
			}
		}
		c, ok := f.Resolve(i)
		if !ok {
			continue
		}
		bad := func(field, value, problem string) error {
			return &FieldError{Object: backendObject(f.Name, b.Name), Field: "check." + field, Value: value, Problem: problem}
		}
		if c.Type.UsesPort() && c.Port == 0 {
			return bad("port", "", "the "+c.Type.String()+" check needs a port: the backend has none and the farm no single virtual port; set check port")
		}
		if c.Type == CheckExec && c.Command == "" {
			return bad("command", "", "check type exec needs a command")
		}
		if c.SourceAddr.IsValid() && c.SourceAddr.Is4() != b.Addr.Is4() {
			return bad("source-addr", c.SourceAddr.String(), "is not of the backend's address family ("+b.Addr.String()+")")
		}
		if err := checkTypeFields(c, bad); err != nil {
			return err
		}
	}
	return nil
}

// validateCheck checks the values of one check object on its own.
func validateCheck(obj string, c *Check) error {
	bad := func(field, value, problem string) error {
		return &FieldError{Object: obj, Field: "check." + field, Value: value, Problem: problem}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"inter", c.Inter}, {"fastinter", c.FastInter}, {"downinter", c.DownInter}} {
		if d.v != 0 && (d.v < MinCheckInter || d.v > MaxCheckInter) || d.v < 0 {
			return bad(d.field, d.v.String(), fmt.Sprintf("must be %s to %s", MinCheckInter, MaxCheckInter))
		}
	}
	if c.Timeout < 0 || c.Timeout != 0 && (c.Timeout < MinCheckTimeout || c.Timeout > MaxCheckTimeout) {
		return bad("timeout", c.Timeout.String(), fmt.Sprintf("must be %s to %s", MinCheckTimeout, MaxCheckTimeout))
	}
	if c.Warmup < 0 || c.Warmup > MaxCheckWarmup {
		return bad("warmup", c.Warmup.String(), fmt.Sprintf("must be 0 (none) to %s", MaxCheckWarmup))
	}
	if c.SourceAddr.IsValid() && (c.SourceAddr.Zone() != "" || c.SourceAddr.Is4In6()) {
		return bad("source-addr", c.SourceAddr.String(), "must be a plain IPv4 or IPv6 address")
	}
	if c.Method != "" {
		for _, r := range c.Method {
			if r < 'A' || r > 'Z' {
				return bad("method", c.Method, "must be an HTTP method in capitals, e.g. GET, HEAD, OPTIONS")
			}
		}
	}
	if c.Path != "" && (c.Path[0] != '/' || strings.ContainsAny(c.Path, " \t\r\n")) {
		return bad("path", c.Path, "must start with '/' and hold no white space")
	}
	if strings.ContainsAny(c.Host, " \t\r\n/") {
		return bad("host", c.Host, "must be a host name (no white space or '/')")
	}
	if c.BodyRegex != "" {
		if _, err := regexp.Compile(c.BodyRegex); err != nil {
			return bad("body-regex", c.BodyRegex, "does not compile: "+strings.TrimPrefix(err.Error(), "error parsing regexp: "))
		}
	}
	if c.BodyDigest != "" {
		if _, err := hex.DecodeString(c.BodyDigest); err != nil || len(c.BodyDigest) != 32 && len(c.BodyDigest) != 64 {
			return bad("body-digest", c.BodyDigest, "must be an MD5 (32 hexadecimal digits) or SHA-256 (64) digest of the body")
		}
		if c.BodyRegex != "" {
			return bad("body-digest", c.BodyDigest, "set body-regex or body-digest, not both")
		}
	}
	for _, p := range []struct{ field, v string }{{"send", c.Send}, {"expect", c.Expect}} {
		if _, err := DecodePayload(p.v); err != nil {
			return bad(p.field, p.v, err.Error())
		}
	}
	if c.CAFile != "" && (!strings.HasPrefix(c.CAFile, "/") || strings.ContainsAny(c.CAFile, "\x00\n")) {
		return bad("ca-file", c.CAFile, "must be an absolute path of a PEM file")
	}
	if strings.ContainsAny(c.Command, "\x00") {
		return bad("command", c.Command, "must not hold NUL bytes")
	}
	return nil
}

// checkTypeFields refuses fields the resolved check's type does not use.
func checkTypeFields(c Check, bad func(field, value, problem string) error) error {
	t := c.Type
	isHTTP := t == CheckHTTP || t == CheckHTTPS
	for _, x := range []struct {
		field, value string
		ok           bool
	}{
		{"method", c.Method, isHTTP}, {"path", c.Path, isHTTP}, {"host", c.Host, isHTTP},
		{"body-regex", c.BodyRegex, isHTTP}, {"body-digest", c.BodyDigest, isHTTP},
		{"send", c.Send, t == CheckTCP || t == CheckUDP || t == CheckAgent},
		{"expect", c.Expect, t == CheckTCP || t == CheckUDP},
		{"command", c.Command, t == CheckExec},
	} {
		if x.value != "" && !x.ok {
			return bad(x.field, x.value, "is not used by check type "+t.String())
		}
	}
	if c.Verify && t != CheckHTTPS {
		return bad("verify", "on", "is used by check type https only")
	}
	if c.CAFile != "" && !(t == CheckHTTPS && c.Verify) {
		return bad("ca-file", c.CAFile, "is used by check type https with verify on only")
	}
	if c.HalfOpen && (t != CheckTCP || c.Send != "" || c.Expect != "") {
		return bad("half-open", "on", "is a tcp check without send or expect (a SYN answered by a SYN-ACK): not check type "+t.String()+" or with send/expect")
	}
	if !isHTTP && len(c.Status) > 0 && !equalStatus(c.Status, DefaultStatus) {
		return bad("status", FormatStatusRanges(c.Status), "is used by check types http and https only")
	}
	return nil
}

func equalStatus(a, b []StatusRange) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// fmtDur writes d as a duration value, "0" for none.
func fmtDur(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// CheckKey identifies what backend i's resolved check c runs against: the
// backend's address and the whole check. A health result reported under
// another key is about a configuration that has changed since.
func (f *Farm) CheckKey(i int, c *Check) string {
	b := &f.Backends[i]
	dst := b.Addr.AppendTo(make([]byte, 0, 128))
	dst = append(dst, ' ')
	return string(appendCheckJSON(dst, c))
}
