package model

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Passive health checks: Envoy's consecutive-failure outlier detection on
// the connections the data plane forwards. A farm's check may carry a
// "passive" object; the data plane then watches each new TCP connection's
// handshake (eBPF: in its own conntrack; nft: from netfilter's conntrack
// events) (a RST from the backend, an ICMP unreachable (eBPF), or no answer to the SYN within timeout is a failure;
// the backend's SYN-ACK a success), and a backend with `failures`
// consecutive failures is ejected for ejection-time × the number of its
// ejections in a row (at most max-ejection-time), as long as no more than
// max-ejected percent of the farm's backends are ejected at once (one
// always may be).
//
//	"check": {"passive": {"failures": "5", "timeout": "1s", "ejection-time": "30s",
//	          "max-ejection-time": "5m", "max-ejected": "10%"}}
//
// A farm check with only "passive" has no active checks. The object is a
// patch like the check it is in; "passive": null removes it.

// PassiveCheck configures passive checks (farm only).
type PassiveCheck struct {
	Failures        uint32        // consecutive connection failures that eject a backend
	Timeout         time.Duration // a SYN without an answer this long is a failure
	EjectionTime    time.Duration // the first ejection's length; the n-th in a row lasts n times as long
	MaxEjectionTime time.Duration // the longest ejection
	MaxEjected      uint32        // percent of the farm's backends ejected at once (at least one); 0: unset (10)
	MaxEjectedSet   bool          // max-ejected was given (0 % is a value)
}

// Passive check defaults (Envoy's outlier detection: consecutive failures
// 5, base ejection time 30 s, max ejection time 300 s, max ejection
// percent 10; a SYN is retransmitted after 1 s, so an answer later than
// that is already a failure for the client).
const (
	DefaultPassiveFailures     = 5
	DefaultPassiveTimeout      = time.Second
	DefaultPassiveEjectionTime = 30 * time.Second
	DefaultPassiveMaxEjection  = 300 * time.Second
	DefaultPassiveMaxEjected   = 10
	MinPassiveTimeout          = 10 * time.Millisecond
	MaxPassiveTimeout          = time.Minute
	MinPassiveEjectionTime     = 100 * time.Millisecond
	MaxPassiveEjectionTime     = 24 * time.Hour
)

var passiveFields = []scalarField[PassiveCheck]{
	uintField("failures", MaxCheckCount, 0, func(p *PassiveCheck) *uint32 { return &p.Failures }),
	durationField("timeout", MinPassiveTimeout, MaxPassiveTimeout, func(p *PassiveCheck) *time.Duration { return &p.Timeout }),
	durationField("ejection-time", MinPassiveEjectionTime, MaxPassiveEjectionTime, func(p *PassiveCheck) *time.Duration { return &p.EjectionTime }),
	durationField("max-ejection-time", MinPassiveEjectionTime, MaxPassiveEjectionTime, func(p *PassiveCheck) *time.Duration { return &p.MaxEjectionTime }),
	{
		name: "max-ejected",
		json: jsonNumber,
		decode: func(p *PassiveCheck, v string) error {
			v = strings.TrimSuffix(strings.TrimSpace(v), "%")
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 8)
			if err != nil || n > 100 {
				return fmt.Errorf("must be a percentage 0-100, e.g. 10%% (at least one backend may always be ejected)")
			}
			p.MaxEjected, p.MaxEjectedSet = uint32(n), true
			return nil
		},
		append: func(dst []byte, p *PassiveCheck) []byte {
			dst = strconv.AppendUint(append(dst, '"'), uint64(p.MaxEjected), 10)
			return append(dst, `%"`...)
		},
	},
}

// set reports whether field i of passiveFields has a value in p.
func (p *PassiveCheck) set(i int) bool {
	switch passiveFields[i].name {
	case "failures":
		return p.Failures != 0
	case "timeout":
		return p.Timeout != 0
	case "ejection-time":
		return p.EjectionTime != 0
	case "max-ejection-time":
		return p.MaxEjectionTime != 0
	case "max-ejected":
		return p.MaxEjectedSet
	}
	return false
}

// appendPassiveJSON appends p as a JSON object of its set fields.
func appendPassiveJSON(dst []byte, p *PassiveCheck) []byte {
	dst = append(dst, '{')
	first := true
	for i := range passiveFields {
		if !p.set(i) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, passiveFields[i].name)
		dst = append(dst, ':')
		dst = passiveFields[i].append(dst, p)
	}
	return append(dst, '}')
}

// decodePassive patches cur (nil: none) with the passive object at tape
// index v, or removes it (null).
func decodePassive(d *doc, v int, name objName, cur *PassiveCheck) (*PassiveCheck, error) {
	switch d.toks[v].kind {
	case 'n':
		return nil, nil
	case '{':
	default:
		return nil, &FieldError{Object: name.String(), Field: "check.passive", Value: truncate(d.raw(v)),
			Problem: "must be an object, e.g. {\"failures\": \"5\", \"ejection-time\": \"30s\"}, or null"}
	}
	var p PassiveCheck
	if cur != nil {
		p = *cur
	}
	if err := decodeMembers(d, v, name, &p, passiveFields, nil); err != nil {
		if fe, ok := err.(*FieldError); ok {
			fe.Field = "check.passive." + fe.Field
		}
		return nil, err
	}
	return &p, nil
}

// Resolved returns p with the defaults filled in.
func (p PassiveCheck) Resolved() PassiveCheck {
	if p.Failures == 0 {
		p.Failures = DefaultPassiveFailures
	}
	if p.Timeout == 0 {
		p.Timeout = DefaultPassiveTimeout
	}
	if p.EjectionTime == 0 {
		p.EjectionTime = DefaultPassiveEjectionTime
	}
	if p.MaxEjectionTime == 0 {
		p.MaxEjectionTime = max(DefaultPassiveMaxEjection, p.EjectionTime)
	}
	if !p.MaxEjectedSet {
		p.MaxEjected, p.MaxEjectedSet = DefaultPassiveMaxEjected, true
	}
	return p
}

// MaxEjectedOf returns how many of n backends may be ejected at once:
// max-ejected percent of them, rounded down, but at least one (Envoy
// ejects a host when none is ejected, whatever the percentage).
func (p PassiveCheck) MaxEjectedOf(n int) int {
	return max(1, n*int(p.Resolved().MaxEjected)/100)
}

// EjectionFor returns the length of a backend's n-th ejection in a row
// (n >= 1): ejection-time × n, at most max-ejection-time.
func (p PassiveCheck) EjectionFor(n uint32) time.Duration {
	r := p.Resolved()
	n = max(n, 1)
	if r.EjectionTime > r.MaxEjectionTime/time.Duration(n) {
		return r.MaxEjectionTime
	}
	return min(r.EjectionTime*time.Duration(n), r.MaxEjectionTime)
}

// validatePassive checks a farm's passive object: its own values, and
// that the farm is one whose handshakes the balancer sees.
func (f *Farm) validatePassive(p *PassiveCheck) error {
	bad := func(field, value, problem string) error {
		return &FieldError{Object: farmObject(f.Name), Field: "check.passive." + field, Value: value, Problem: problem}
	}
	r := p.Resolved()
	if p.MaxEjectionTime != 0 && r.MaxEjectionTime < r.EjectionTime {
		return bad("max-ejection-time", p.MaxEjectionTime.String(), "must not be shorter than ejection-time ("+r.EjectionTime.String()+")")
	}
	obj := func(field, value, problem string) error {
		return &FieldError{Object: farmObject(f.Name), Field: field, Value: value, Problem: problem}
	}
	switch f.Mode {
	case ModeDSR, ModeStlsDNAT:
		return obj("mode", f.Mode.String(), "passive checks watch each connection's handshake in the balancer's conntrack, "+
			"which a "+f.Mode.String()+" farm does not have (replies bypass it or are not tracked): use snat or dnat, or active checks")
	}
	if f.Protocol != ProtoTCP {
		return obj("protocol", f.Protocol.String(), "passive checks watch TCP handshakes: the farm's protocol must be tcp")
	}
	return nil
}

// PassiveKey identifies what backend i's passive check watches: its
// address and port and the farm's passive configuration. An ejection made
// under another key is about a configuration that has changed since.
// "" when the farm has no passive check.
func (f *Farm) PassiveKey(i int) string {
	if f.Check == nil || f.Check.Passive == nil {
		return ""
	}
	b := &f.Backends[i]
	if f.Check.SorryServer == b.Name {
		return ""
	}
	dst := b.Addr.AppendTo(make([]byte, 0, 96))
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, uint64(b.Port), 10)
	dst = append(dst, ' ')
	return string(appendPassiveJSON(dst, f.Check.Passive))
}
