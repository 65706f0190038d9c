package model

import (
	"fmt"
	"strconv"
	"strings"
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

// NftlbFieldInUse names the first nftlb 1.0 field (or value) the farm uses
// that no data plane implements yet (dataplane.CheckNftlbFields refuses
// it), and its value; ok is false when the farm uses none.
func (f *Farm) NftlbFieldInUse() (field, value string, ok bool) {
	switch {
	case f.Mode == ModeLocal:
		return "mode", f.Mode.String(), true
	case f.NewRTLimit != 0 && f.NewRTUnit != PerSecond:
		return "new-rtlimit", fmt.Sprintf("%d/%s", f.NewRTLimit, f.NewRTUnit), true
	case f.RstRTLimit != 0 && f.RstRTUnit != PerSecond:
		return "rst-rtlimit", fmt.Sprintf("%d/%s", f.RstRTLimit, f.RstRTUnit), true
	case f.LogRTLimit != 0:
		return "log-rtlimit", fmt.Sprintf("%d/%s", f.LogRTLimit, f.LogRTUnit), true
	case f.LimitsTTL != DefaultLimitsTTL:
		return "limits-ttl", fmt.Sprint(f.LimitsTTL), true
	case f.NewRTLogPrefix != "":
		return "new-rtlimit-log-prefix", f.NewRTLogPrefix, true
	case f.RstRTLogPrefix != "":
		return "rst-rtlimit-log-prefix", f.RstRTLogPrefix, true
	case f.EstConnLogPrefix != "":
		return "est-connlimit-log-prefix", f.EstConnLogPrefix, true
	case f.TCPStrictLogPrefix != "":
		return "tcp-strict-log-prefix", f.TCPStrictLogPrefix, true
	case f.Queue != -1:
		return "queue", fmt.Sprint(f.Queue), true
	case f.Verdict != DefaultVerdict:
		return "verdict", f.Verdict.String(), true
	case f.FlowOffload:
		return "flow-offload", "on", true
	case len(f.Addresses) > 0:
		return "addresses", f.Addresses[0].Name, true
	case len(f.Sessions) > 0:
		return "sessions", f.Sessions[0].Client, true
	case f.Protocol == ProtoAll && len(f.VirtualPorts) > 0:
		return "virtual-ports", formatPorts(f.VirtualPorts), true
	case f.Mode == ModeStlsDNAT && (f.Iface != "" || f.Oface != "" || !f.EtherAddr.IsZero()):
		return "iface", f.Iface + "," + f.Oface + "," + f.EtherAddr.String(), true
	}
	for _, b := range f.Backends {
		switch {
		case b.SourceAddr.IsValid():
			return "backends.source-addr", b.SourceAddr.String(), true
		case b.EstConnLogPrefix != "":
			return "backends.est-connlimit-log-prefix", b.EstConnLogPrefix, true
		case b.Port != 0 && f.Protocol == ProtoAll:
			return "backends.port", fmt.Sprint(b.Port), true
		}
	}
	return "", "", false
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
