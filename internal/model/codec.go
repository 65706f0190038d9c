package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// The wire format is nftlb's: every scalar is a JSON string ("port": "80"),
// though JSON numbers and booleans are accepted on input so hand-written
// requests work too. A decoded object is a patch: fields it names replace the
// base's, backends are matched by name and patched the same way (nftlb's
// upsert semantics).

type scalarField[T any] struct {
	name string
	// json are the JSON value types the field takes besides a string:
	// numbers for numeric fields, booleans for on/off ones. Text (names,
	// addresses, prefixes) must be a JSON string.
	json jsonTypes
	// decode sets the field from v, the value as text. v may be a
	// substring of a whole request body: a decode that keeps v must keep
	// a clone of it.
	decode func(t *T, v string) error
	// append appends the value as a JSON string, quotes included.
	append func(dst []byte, t *T) []byte
	// omit, when set, leaves the field out of the encoding when it
	// reports true (an xlb field unset, so nftlb's output stays as it
	// was).
	omit func(t *T) bool
}

func parseUint(field, v string, max uint64) (uint64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 0, 64)
	if err != nil || n > max {
		return 0, fmt.Errorf("must be a whole number 0-%d", max)
	}
	return n, nil
}

// jsonTypes are the JSON types of a field's value other than a string.
type jsonTypes uint8

const (
	jsonNumber jsonTypes = 1 << iota
	jsonBool
)

// allows reports whether a value of tape kind k may set the field, and
// if not, what the field takes.
func (j jsonTypes) allows(k byte) (bool, string) {
	switch {
	case k == '"':
		return true, ""
	case (k == '-' || k >= '0' && k <= '9') && j&jsonNumber != 0:
		return true, ""
	case (k == 't' || k == 'f') && j&jsonBool != 0:
		return true, ""
	}
	switch j {
	case jsonNumber:
		return false, "must be a string or a number"
	case jsonBool:
		return false, "must be a string or a boolean"
	}
	return false, "must be a JSON string"
}

// names lists the OpenAPI types of the field's values.
func (j jsonTypes) names() []string {
	out := []string{"string"}
	if j&jsonNumber != 0 {
		out = append(out, "integer")
	}
	if j&jsonBool != 0 {
		out = append(out, "boolean")
	}
	return out
}

// FieldTypes returns, for each scalar field of a farm (object "farm") or a
// backend ("backend"), the JSON types its value may have in a request, as
// OpenAPI names them ("string", "integer", "boolean"). The OpenAPI test
// holds api/openapi.yaml to it.
func FieldTypes(object string) map[string][]string {
	out := map[string][]string{}
	switch object {
	case "farm":
		for _, f := range farmFields {
			out[f.name] = f.json.names()
		}
	case "backend":
		for _, f := range backendFields {
			out[f.name] = f.json.names()
		}
	}
	return out
}

// uintField is a number field; "" (nftlb's unset) is the field's default,
// def.
func uintField[T any](name string, max uint64, def uint32, ptr func(*T) *uint32) scalarField[T] {
	return scalarField[T]{
		name: name,
		json: jsonNumber,
		decode: func(t *T, v string) error {
			if strings.TrimSpace(v) == "" {
				*ptr(t) = def
				return nil
			}
			n, err := parseUint(name, v, max)
			if err != nil {
				return err
			}
			*ptr(t) = uint32(n)
			return nil
		},
		append: func(dst []byte, t *T) []byte { return appendQuotedUint(dst, "", uint64(*ptr(t)), 10) },
	}
}

// dstmacWhy says why nftlb's dstmac key is refused, when v has it: at
// prerouting the destination MAC of every client's packet is the LB's own.
func dstmacWhy(v string) string {
	if strings.Contains(v, "dstmac") {
		return "; not dstmac (nftlb's): a packet reaching the LB carries the LB's own MAC as its destination, so every client would get the same key (all on one backend)"
	}
	return ""
}

// levelField is a number of at least 1 that nftlb requires ("" and 0 are
// errors there, "must be >=1"): a backend's priority.
func levelField[T any](name string, max uint64, ptr func(*T) *uint32) scalarField[T] {
	return scalarField[T]{
		name: name,
		json: jsonNumber,
		decode: func(t *T, v string) error {
			n, err := parseUint(name, v, max)
			if err != nil || n < 1 {
				return fmt.Errorf("must be a whole number 1-%d", max)
			}
			*ptr(t) = uint32(n)
			return nil
		},
		append: func(dst []byte, t *T) []byte { return appendQuotedUint(dst, "", uint64(*ptr(t)), 10) },
	}
}

// farmPriorityField is a farm's "priority": nftlb computes it from its
// backends (Farm.PriorityLevel) and prints that, and takes a posted value
// (a number of at least 1, as it checks) without using it. So does xlb: a
// farm's GET output posts back as the same configuration.
var farmPriorityField = scalarField[Farm]{
	name: "priority",
	json: jsonNumber,
	decode: func(_ *Farm, v string) error {
		if n, err := parseUint("priority", v, 1<<31-1); err != nil || n < 1 {
			return fmt.Errorf("must be a whole number 1-%d (nftlb computes a farm's priority from its backends and prints that; a posted value is checked and not used)", 1<<31-1)
		}
		return nil
	},
	append: func(dst []byte, f *Farm) []byte { return appendQuotedUint(dst, "", uint64(f.PriorityLevel()), 10) },
}

func markField[T any](ptr func(*T) *uint32) scalarField[T] {
	return scalarField[T]{
		name: "mark",
		json: jsonNumber,
		decode: func(t *T, v string) error {
			if strings.TrimSpace(v) == "" {
				*ptr(t) = 0
				return nil
			}
			n, err := parseUint("mark", v, 0xffffffff)
			if err != nil {
				return fmt.Errorf("must be a 32-bit number, e.g. 0x10")
			}
			*ptr(t) = uint32(n)
			return nil
		},
		append: func(dst []byte, t *T) []byte { return appendQuotedUint(dst, "0x", uint64(*ptr(t)), 16) },
	}
}

// stateField is a farm's or backend's state. nftlb also prints
// "available" (a backend up but on standby behind a lower priority level)
// and "config_error" (an object nftlb could not program); both mean up
// when given back.
func stateField[T any](ptr func(*T) *State) scalarField[T] {
	f := enumField("state", stateSpec, ptr)
	decode := f.decode
	f.decode = func(t *T, v string) error {
		if v == "available" || v == "config_error" {
			*ptr(t) = StateUp
			return nil
		}
		if err := decode(t, v); err != nil {
			return fmt.Errorf("allowed values are %s (and nftlb's available and config_error, which mean up)", stateSpec.allowed())
		}
		return nil
	}
	return f
}

func enumField[T any, E ~uint8](name string, spec enumSpec[E], ptr func(*T) *E) scalarField[T] {
	return scalarField[T]{
		name: name,
		decode: func(t *T, v string) error {
			e, ok := spec.parse(v)
			if !ok {
				return fmt.Errorf("allowed values are %s", spec.allowed())
			}
			*ptr(t) = e
			return nil
		},
		append: func(dst []byte, t *T) []byte { return appendJSONString(dst, spec.name(*ptr(t))) },
	}
}

func addrField[T any](name string, ptr func(*T) *netip.Addr) scalarField[T] {
	return scalarField[T]{
		name: name,
		decode: func(t *T, v string) error {
			if v == "" {
				*ptr(t) = netip.Addr{}
				return nil
			}
			a, err := netip.ParseAddr(v)
			if err != nil {
				return fmt.Errorf("must be an IPv4 or IPv6 address")
			}
			*ptr(t) = a
			return nil
		},
		append: func(dst []byte, t *T) []byte {
			start := len(dst)
			dst = appendAddr(append(dst, '"'), *ptr(t))
			return closeJSONString(dst, start)
		},
	}
}

func etherField[T any](ptr func(*T) *EtherAddr) scalarField[T] {
	return scalarField[T]{
		name: "ether-addr",
		decode: func(t *T, v string) error {
			a, err := ParseEtherAddr(strings.TrimSpace(v))
			if err != nil {
				return err
			}
			*ptr(t) = a
			return nil
		},
		append: func(dst []byte, t *T) []byte { return ptr(t).appendQuoted(dst) },
	}
}

func ifaceField(name string, ptr func(*Farm) *string) scalarField[Farm] {
	return scalarField[Farm]{
		name: name,
		decode: func(f *Farm, v string) error {
			if v != "" && !ValidIfName(v) {
				return fmt.Errorf("must be an interface name: 1 to 15 characters, no '/', ':' or white space")
			}
			*ptr(f) = strings.Clone(v) // v may be part of a request body
			return nil
		},
		append: func(dst []byte, f *Farm) []byte { return appendJSONString(dst, *ptr(f)) },
	}
}

var farmFields = []scalarField[Farm]{
	{name: "name", append: func(dst []byte, f *Farm) []byte { return appendJSONString(dst, f.Name) }}, // decoded by DecodeFarms
	enumField("family", familySpec, func(f *Farm) *Family { return &f.Family }),
	{
		// One address, or (family dual) an IPv4 and an IPv6 address
		// separated by a comma.
		name: "virtual-addr",
		decode: func(f *Farm, v string) error {
			// No white space is trimmed: " 10.0.0.1" is refused, as
			// in ip-addr, rather than quietly read as another value.
			first, second, two := strings.Cut(v, ",")
			f.VirtualAddr, f.VirtualAddr2 = netip.Addr{}, netip.Addr{}
			if first == "" && !two {
				return nil
			}
			a, err := netip.ParseAddr(first)
			if err != nil {
				return fmt.Errorf("must be an IPv4 or IPv6 address, or (family dual) one of each separated by a comma")
			}
			f.VirtualAddr = a
			if two {
				b, err := netip.ParseAddr(second)
				if err != nil || strings.Contains(second, ",") {
					return fmt.Errorf("must be an IPv4 or IPv6 address, or (family dual) one of each separated by a comma")
				}
				f.VirtualAddr2 = b
			}
			return nil
		},
		append: func(dst []byte, f *Farm) []byte {
			start := len(dst)
			dst = appendAddr(append(dst, '"'), f.VirtualAddr)
			if f.VirtualAddr.IsValid() && f.VirtualAddr2.IsValid() {
				dst = appendAddr(append(dst, ','), f.VirtualAddr2)
			}
			return closeJSONString(dst, start)
		},
	},
	{
		name: "virtual-ports",
		json: jsonNumber, // "virtual-ports": 80
		decode: func(f *Farm, v string) error {
			ps, err := ParsePorts(v)
			if err != nil {
				return err
			}
			f.VirtualPorts = ps
			return nil
		},
		append: func(dst []byte, f *Farm) []byte { return append(appendPorts(append(dst, '"'), f.VirtualPorts), '"') },
	},
	addrField("source-addr", func(f *Farm) *netip.Addr { return &f.SourceAddr }),
	enumField("mode", modeSpec, func(f *Farm) *Mode { return &f.Mode }),
	uintField("responsettl", 1<<31-1, DefaultTTL, func(f *Farm) *uint32 { return &f.ResponseTTL }),
	enumField("protocol", protocolSpec, func(f *Farm) *Protocol { return &f.Protocol }),
	enumField("scheduler", schedulerSpec, func(f *Farm) *Scheduler { return &f.Scheduler }),
	{
		name: "sched-param",
		decode: func(f *Farm, v string) error {
			k, ok := hashKeySpec.parse(v)
			if !ok {
				return fmt.Errorf("allowed values are %s%s", hashKeySpec.allowed(), dstmacWhy(v))
			}
			f.SchedParam = k
			return nil
		},
		append: func(dst []byte, f *Farm) []byte { return hashKeySpec.appendQuoted(dst, f.SchedParam, ' ') },
	},
	{
		name: "persistence",
		decode: func(f *Farm, v string) error {
			k, ok := parsePersistence(v)
			if !ok {
				return fmt.Errorf("allowed values are none, srcip, dstip, srcport, dstport, srcmac and combinations separated by spaces (e.g. \"srcip srcport\"; srcip-srcport is accepted too)%s", dstmacWhy(v))
			}
			f.Persistence = k
			return nil
		},
		append: func(dst []byte, f *Farm) []byte { return persistenceSpec.appendQuoted(dst, f.Persistence, ' ') },
	},
	uintField("persist-ttl", 1<<31-1, DefaultTTL, func(f *Farm) *uint32 { return &f.PersistTTL }),
	enumField("helper", helperSpec, func(f *Farm) *Helper { return &f.Helper }),
	{
		name: "log",
		decode: func(f *Farm, v string) error {
			l, ok := logSpec.parse(v)
			if !ok {
				return fmt.Errorf("allowed values are %s", logSpec.allowed())
			}
			f.Log = l
			return nil
		},
		append: func(dst []byte, f *Farm) []byte { return logSpec.appendQuoted(dst, f.Log, ' ') },
	},
	stringField("log-prefix", func(f *Farm) *string { return &f.LogPrefix }),
	rateField("log-rtlimit", func(f *Farm) *uint32 { return &f.LogRTLimit }, func(f *Farm) *RateUnit { return &f.LogRTUnit }),
	markField(func(f *Farm) *uint32 { return &f.Mark }),
	farmPriorityField,
	stateField(func(f *Farm) *State { return &f.State }),
	uintField("limits-ttl", 1<<31-1, DefaultLimitsTTL, func(f *Farm) *uint32 { return &f.LimitsTTL }),
	rateField("new-rtlimit", func(f *Farm) *uint32 { return &f.NewRTLimit }, func(f *Farm) *RateUnit { return &f.NewRTUnit }),
	uintField("new-rtlimit-burst", 1<<31-1, 0, func(f *Farm) *uint32 { return &f.NewRTBurst }),
	stringField("new-rtlimit-log-prefix", func(f *Farm) *string { return &f.NewRTLogPrefix }),
	rateField("rst-rtlimit", func(f *Farm) *uint32 { return &f.RstRTLimit }, func(f *Farm) *RateUnit { return &f.RstRTUnit }),
	uintField("rst-rtlimit-burst", 1<<31-1, 0, func(f *Farm) *uint32 { return &f.RstRTBurst }),
	stringField("rst-rtlimit-log-prefix", func(f *Farm) *string { return &f.RstRTLogPrefix }),
	uintField("est-connlimit", 1<<31-1, 0, func(f *Farm) *uint32 { return &f.EstConnLimit }),
	stringField("est-connlimit-log-prefix", func(f *Farm) *string { return &f.EstConnLogPrefix }),
	onOffField("tcp-strict", func(f *Farm) *bool { return &f.TCPStrict }),
	stringField("tcp-strict-log-prefix", func(f *Farm) *string { return &f.TCPStrictLogPrefix }),
	queueField,
	verdictField,
	onOffField("flow-offload", func(f *Farm) *bool { return &f.FlowOffload }),
	{
		// Printed "on" by default (xlb's default; nftlb's is off and it
		// prints nothing then): "" is the default.
		name: "intra-connect",
		json: jsonBool,
		decode: func(f *Farm, v string) error {
			switch strings.TrimSpace(v) {
			case "on", "true", "":
				f.IntraConnectOff = false
			case "off", "false":
				f.IntraConnectOff = true
			default:
				return fmt.Errorf("allowed values are on, off")
			}
			return nil
		},
		append: func(dst []byte, f *Farm) []byte {
			if f.IntraConnectOff {
				return append(dst, `"off"`...)
			}
			return append(dst, `"on"`...)
		},
	},
	ifaceField("iface", func(f *Farm) *string { return &f.Iface }),
	ifaceField("oface", func(f *Farm) *string { return &f.Oface }),
	etherField(func(f *Farm) *EtherAddr { return &f.EtherAddr }),
	{
		// xlb's own field: printed only when set.
		name:   "source-table",
		decode: func(f *Farm, v string) error { f.SourceTable = strings.Clone(v); return nil },
		append: func(dst []byte, f *Farm) []byte { return appendJSONString(dst, f.SourceTable) },
		omit:   func(f *Farm) bool { return f.SourceTable == "" },
	},
	newnameField,
}

var backendFields = []scalarField[Backend]{
	{name: "name", append: func(dst []byte, b *Backend) []byte { return appendJSONString(dst, b.Name) }},
	addrField("ip-addr", func(b *Backend) *netip.Addr { return &b.Addr }),
	{
		name: "port",
		json: jsonNumber,
		decode: func(b *Backend, v string) error {
			if v == "" {
				b.Port = 0
				return nil
			}
			n, err := parseUint("port", v, 65535)
			if err != nil {
				return fmt.Errorf("must be a port 1-65535, or empty for the client's destination port")
			}
			b.Port = uint16(n)
			return nil
		},
		append: func(dst []byte, b *Backend) []byte {
			if b.Port == 0 {
				return append(dst, `""`...)
			}
			return appendQuotedUint(dst, "", uint64(b.Port), 10)
		},
	},
	addrField("source-addr", func(b *Backend) *netip.Addr { return &b.SourceAddr }),
	{
		// nftlb refuses "" (must be >=1); xlb also takes 0 (drain).
		name: "weight",
		json: jsonNumber,
		decode: func(b *Backend, v string) error {
			n, err := parseUint("weight", v, MaxWeight)
			if err != nil {
				return fmt.Errorf("must be a whole number 0-%d (0 drains: no new connections)", MaxWeight)
			}
			b.Weight = uint32(n)
			return nil
		},
		append: func(dst []byte, b *Backend) []byte { return appendQuotedUint(dst, "", uint64(b.Weight), 10) },
	},
	levelField("priority", MaxBackendPriority, func(b *Backend) *uint32 { return &b.Priority }),
	markField(func(b *Backend) *uint32 { return &b.Mark }),
	uintField("est-connlimit", 1<<31-1, 0, func(b *Backend) *uint32 { return &b.EstConnLimit }),
	{name: "est-connlimit-log-prefix",
		decode: func(b *Backend, v string) error { b.EstConnLogPrefix = strings.Clone(v); return nil },
		append: func(dst []byte, b *Backend) []byte { return appendJSONString(dst, b.EstConnLogPrefix) }},
	stateField(func(b *Backend) *State { return &b.State }),
	etherField(func(b *Backend) *EtherAddr { return &b.EtherAddr }),
}

// ParsePorts parses nftlb's virtual-ports: "80,443,1000-2000"; "" means every port.
func ParsePorts(v string) ([]PortRange, error) {
	out, bad := parseRangeList(v, 1, 65535)
	if bad != "" {
		return nil, fmt.Errorf("must be ports 1-65535 or ranges low-high separated by commas, e.g. 80,443,1000-2000 (bad part %q)", bad)
	}
	return out, nil
}

// parseRangeList parses a list of numbers and ranges low-high separated
// by commas, each within [low, high] (a range not backwards); "" is none.
// It returns the first part that is not, if any: the callers word the
// error for their own numbers (ports, HTTP status codes).
func parseRangeList(v string, low, high uint64) (out []PortRange, bad string) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, ""
	}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		first, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
		last := first
		var err2 error
		if isRange {
			last, err2 = strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
		}
		if err1 != nil || err2 != nil || first < low || last > high || last < first {
			return nil, part
		}
		out = append(out, PortRange{uint16(first), uint16(last)})
	}
	return out, ""
}

// fieldError builds the error of one field. key and value may be
// substrings of the request body (doc.s): they are cloned, so an error kept
// for a log line does not hold the body.
func fieldError(obj, key, value, problem string) error {
	return &FieldError{Object: obj, Field: strings.Clone(clip(key)), Value: strings.Clone(clip(value)), Problem: problem}
}

// objName names the object being decoded, for errors. It is built only
// when there is an error.
type objName struct {
	farm, backend string
	isBackend     bool
}

func (o objName) String() string {
	if o.isBackend {
		return backendObject(o.farm, o.backend)
	}
	return farmObject(o.farm)
}

// maxFields bounds the fields of one object kind (decodeMembers keeps a
// bit per field in a uint64).
const maxFields = 64

// fieldIndex returns the index of the field named key, or -1.
func fieldIndex[T any](fields []scalarField[T], key string) int {
	for i := range fields {
		if fields[i].name == key {
			return i
		}
	}
	return -1
}

// decodeMembers sets t's fields from the members of object obj, in
// document order, except those named in skip (decoded elsewhere). A key
// given twice is refused: encoding/json (and nftlb) would keep the last
// value, silently.
func decodeMembers[T any](d *doc, obj int, name objName, t *T, fields []scalarField[T], skip []string) error {
	var seen, seenSkip uint64 // bit i: fields[i] (skip[i]) was given
	for k, end := d.children(obj); k < end; k = d.toks[k+1].next {
		key, v := d.key(k), k+1
		if j := slices.Index(skip, key); j >= 0 {
			if seenSkip&(1<<j) != 0 {
				return fieldError(name.String(), key, "", duplicateKey)
			}
			seenSkip |= 1 << j
			continue
		}
		i := fieldIndex(fields, key)
		if i < 0 || fields[i].decode == nil {
			return &FieldError{Object: name.String(), Field: strings.Clone(clip(key)), Problem: "unknown field; known fields are " + fieldNames(fields), UnknownField: true}
		}
		if seen&(1<<i) != 0 {
			return fieldError(name.String(), key, "", duplicateKey)
		}
		seen |= 1 << i
		if ok, problem := fields[i].json.allows(d.toks[v].kind); !ok {
			return fieldError(name.String(), key, truncate(d.raw(v)), problem)
		}
		text, _ := d.scalar(v)
		if err := fields[i].decode(t, text); err != nil {
			return fieldError(name.String(), key, text, err.Error())
		}
	}
	return nil
}

// duplicateKey is the problem of a key given twice in one object.
const duplicateKey = "is given twice in one object; give each field once"

// dupKey returns a key that object obj holds twice, if any.
func (d *doc) dupKey(obj int) (string, bool) {
	first, end := d.children(obj)
	n := 0
	for k := first; k < end; k = d.toks[k+1].next {
		n++
	}
	if n <= 16 {
		for k := first; k < end; k = d.toks[k+1].next {
			for o := d.toks[k+1].next; o < end; o = d.toks[o+1].next {
				if d.key(o) == d.key(k) {
					return d.key(k), true
				}
			}
		}
		return "", false
	}
	seen := make(map[string]struct{}, n)
	for k := first; k < end; k = d.toks[k+1].next {
		key := d.key(k)
		if _, dup := seen[key]; dup {
			return key, true
		}
		seen[key] = struct{}{}
	}
	return "", false
}

// CheckUniqueKeys refuses a JSON document in which an object holds a key
// twice, naming the key. Callers that read a body into a map first (and
// would keep the last value) call it before. A document that is not JSON
// passes: the caller's own decode reports that.
func CheckUniqueKeys(body []byte) error {
	d, ok := scanDoc(body)
	defer d.release()
	if !ok {
		return nil
	}
	for i := range d.toks {
		if d.toks[i].kind != '{' {
			continue
		}
		if k, dup := d.dupKey(i); dup {
			return fieldError("", k, "", duplicateKey)
		}
	}
	return nil
}

func fieldNames[T any](fields []scalarField[T]) string {
	names := make([]string, 0, len(fields)+2)
	for _, f := range fields {
		names = append(names, f.name)
	}
	switch any(fields).(type) {
	case []scalarField[Farm]:
		names = append(names, "addresses", "backends", "sessions", "policies", "check")
	case []scalarField[Backend]:
		names = append(names, "check")
	case []scalarField[Check]:
		names = append(names, "passive")
	}
	return strings.Join(names, ", ")
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// FarmLookup returns the current farm of that name, if any.
type FarmLookup func(name string) (*Farm, bool)

// DecodeFarms decodes nftlb's {"farms":[...]} body (or a single farm object)
// into complete farms: each named farm is patched onto its current version,
// or onto the defaults if new, then validated on its own. A farm renamed by
// "newname" is patched onto the farm of its old name (RenamedFrom).
func DecodeFarms(body []byte, current FarmLookup) ([]Farm, error) {
	return DecodeFarmsWith(body, current, nil)
}

// DecodeFarmsWith is DecodeFarms with a lookup for addresses a farm names
// without giving their values ({"addresses":[{"name":"a1"}]}).
func DecodeFarmsWith(body []byte, current FarmLookup, addrs AddressLookup) ([]Farm, error) {
	return decodeFarms(body, current, addrs, true)
}

// DecodeFarmsUnchecked decodes farms as DecodeFarms does, each onto the
// defaults, but does not validate them: a value that no longer passes
// validation (a rule that became stricter since it was saved) is kept as
// it is. It is for farms that were accepted before: the saved state, and
// what the daemon answers to a client. A value that cannot be read at all
// (an unknown field, a bad number) is still an error.
func DecodeFarmsUnchecked(body []byte) ([]Farm, error) {
	return decodeFarms(body, func(string) (*Farm, bool) { return nil, false }, nil, false)
}

func decodeFarms(body []byte, current FarmLookup, addrs AddressLookup, check bool) ([]Farm, error) {
	d, ok := scanDoc(body)
	defer d.release()
	if !ok || d.toks[0].kind != '{' {
		// Only an invalid body pays for the Unmarshal, for its error
		// message.
		var probe map[string]json.RawMessage
		err := json.Unmarshal(body, &probe)
		if err == nil {
			err = errors.New("not an object")
		}
		return nil, &StructureError{Msg: fmt.Sprintf("request body is not a JSON object: %v", err)}
	}
	items, end, err := d.farmItems()
	if err != nil {
		return nil, err
	}
	n := 0
	for it := items; it < end; it = d.toks[it].next {
		n++
	}
	out := make([]Farm, 0, n)
	seen := make(map[string]bool, n)
	for i, it := 0, items; it < end; i, it = i+1, d.toks[it].next {
		f, err := decodeFarm(&d, it, i, current, addrs, check)
		if err != nil {
			return nil, err
		}
		if seen[f.Name] {
			return nil, &FieldError{Field: "farms", Value: f.Name, Problem: "the same farm appears twice in one request"}
		}
		seen[f.Name] = true
		out = append(out, f)
	}
	return out, nil
}

// farmItems returns the tape indices of the farm objects of the body: from
// first to just before end, siblings linked by next. The body is either
// {"farms": [...]} or one farm object.
func (d *doc) farmItems() (first, end int, err error) {
	farms, other := -1, -1
	for k, e := d.children(0); k < e; k = d.toks[k+1].next {
		if d.key(k) == "farms" {
			if farms >= 0 {
				return 0, 0, &FieldError{Field: "farms", Problem: duplicateKey}
			}
			farms = k + 1
		} else if other < 0 {
			other = k
		}
	}
	if farms < 0 {
		return 0, d.toks[0].next, nil // the body is one farm
	}
	if other >= 0 {
		return 0, 0, &FieldError{Field: strings.Clone(clip(d.key(other))), Problem: "unknown top-level field; the body is {\"farms\": [...]}", UnknownField: true}
	}
	if d.toks[farms].kind != '[' {
		return 0, 0, &StructureError{Msg: "field \"farms\" must be an array of farm objects"}
	}
	first, end = d.children(farms)
	return first, end, nil
}

// farmSkip are the farm members decoded apart from the scalar fields.
var farmSkip = []string{"name", "addresses", "backends", "sessions", "policies", "check"}

func decodeFarm(d *doc, item, index int, current FarmLookup, addrs AddressLookup, check bool) (Farm, error) {
	if d.toks[item].kind != '{' {
		return Farm{}, &StructureError{Msg: fmt.Sprintf("farms[%d] must be a JSON object", index)}
	}
	nameText, ok := d.str(d.lastMember(item, "name"))
	if !ok || !ValidName(nameText) {
		if !ok || nameText == "" {
			return Farm{}, &MissingNameError{What: fmt.Sprintf("farms[%d]", index)}
		}
		return Farm{}, fieldError(fmt.Sprintf("farms[%d]", index), "name", nameText, "is required and must be "+nameRule)
	}
	name := strings.Clone(nameText) // kept by the farm; see doc
	var f Farm
	if cur, ok := current(name); ok {
		f = cur.Clone()
	} else {
		f = NewFarm(name)
	}
	obj := objName{farm: f.Name}
	if err := decodeMembers(d, item, obj, &f, farmFields, farmSkip); err != nil {
		return Farm{}, err
	}
	if f.renamedFrom != "" {
		if _, taken := current(f.Name); taken {
			return Farm{}, &FieldError{Object: farmObject(f.renamedFrom), Field: "newname", Value: f.Name, Problem: "a farm of that name exists already"}
		}
	}
	if as := d.lastMember(item, "addresses"); as >= 0 {
		if err := decodeFarmAddresses(&f, d, as, addrs); err != nil {
			return Farm{}, err
		}
	}
	if d.lastMember(item, "sched-param") < 0 {
		if f.Scheduler == SchedHash || f.Scheduler == SchedSymhash {
			if f.SchedParam == 0 {
				f.SchedParam = KeySrcIP // nftlb's default keys for the hash schedulers
			}
		} else {
			f.SchedParam = 0
		}
	}
	if bs := d.lastMember(item, "backends"); bs >= 0 {
		if d.toks[bs].kind != '[' {
			return Farm{}, &FieldError{Object: obj.String(), Field: "backends", Problem: "must be an array of backend objects"}
		}
		first, end := d.children(bs)
		if err := decodeBackends(&f, d, first, end); err != nil {
			return Farm{}, err
		}
	}
	if ps := d.lastMember(item, "policies"); ps >= 0 {
		if err := decodePolicies(&f, d, ps); err != nil {
			return Farm{}, err
		}
	}
	if ss := d.lastMember(item, "sessions"); ss >= 0 {
		if err := decodeSessions(&f, d, ss); err != nil {
			return Farm{}, err
		}
	}
	if c := d.lastMember(item, "check"); c >= 0 {
		chk, err := decodeCheck(d, c, obj, f.Check)
		if err != nil {
			return Farm{}, err
		}
		f.Check = chk
	}
	if !check {
		return f, nil
	}
	if err := f.Validate(); err != nil {
		return Farm{}, err
	}
	return f, nil
}

// decodePolicies adds the policies of value ps: null, or an array of
// objects (or nulls) whose "name" member names a policy, as json.Unmarshal
// into []map[string]json.RawMessage read it before.
func decodePolicies(f *Farm, d *doc, ps int) error {
	switch d.toks[ps].kind {
	case 'n':
		return nil
	case '[':
	default:
		return &FieldError{Object: farmObject(f.Name), Field: "policies", Problem: "must be an array of {\"name\": ...} objects"}
	}
	for e, end := d.children(ps); e < end; e = d.toks[e].next {
		if k := d.toks[e].kind; k != '{' && k != 'n' {
			return &FieldError{Object: farmObject(f.Name), Field: "policies", Problem: "must be an array of {\"name\": ...} objects"}
		}
		if k, dup := d.dupKey(e); d.toks[e].kind == '{' && dup {
			return fieldError(farmObject(f.Name), "policies."+k, "", duplicateKey)
		}
	}
	for e, end := d.children(ps); e < end; e = d.toks[e].next {
		name := ""
		if d.toks[e].kind == '{' {
			name, _ = d.scalar(d.lastMember(e, "name"))
		}
		if _, dup := f.policy(name); !dup {
			f.Policies = append(f.Policies, PolicyRef{Name: strings.Clone(name)})
		}
	}
	return nil
}

func (f *Farm) policy(name string) (*PolicyRef, bool) {
	for i := range f.Policies {
		if f.Policies[i].Name == name {
			return &f.Policies[i], true
		}
	}
	return nil, false
}

// backendSkip are the backend members decoded apart from the scalar
// fields, and those GET /farms/{name} adds that are read-only (ignored on
// input, so a farm as shown can be put back).
var backendSkip = []string{"name", "check", "health", "effective-weight", "last-check", "passive-check"}

// decodeBackends upserts the backend objects of the tape from first to
// just before end (siblings) into f, by name. On an error f is half
// patched: drop it.
func decodeBackends(f *Farm, d *doc, first, end int) error {
	// Every element is checked to be an object before any is decoded.
	n := 0
	for e := first; e < end; e = d.toks[e].next {
		if d.toks[e].kind != '{' {
			return &FieldError{Object: farmObject(f.Name), Field: "backends", Problem: "must be an array of backend objects"}
		}
		n++
	}
	if len(f.Backends) == 0 && n > 0 {
		f.Backends = make([]Backend, 0, n)
	}
	// Index the existing backends by name so a patch of n backends onto a
	// farm with m costs O(n+m), not O(n*m).
	index := make(map[string]int, len(f.Backends)+n)
	for i := range f.Backends {
		index[f.Backends[i].Name] = i
	}
	// given marks the backends this request names: one named twice would
	// be patched twice, the second silently winning.
	given := make([]bool, len(f.Backends)+n)
	for i, e := 0, first; e < end; i, e = i+1, d.toks[e].next {
		name, ok := d.str(d.lastMember(e, "name"))
		if !ok || !ValidName(name) {
			return fieldError(farmObject(f.Name), fmt.Sprintf("backends[%d].name", i), name, "is required and must be "+nameRule)
		}
		// The backend is patched in place (a copy on the stack would
		// escape through the decode functions: one allocation each). On
		// an error the caller drops f.
		idx, exists := index[name]
		if !exists {
			name = strings.Clone(name) // kept by the backend; see doc
			idx = len(f.Backends)
			index[name] = idx
			f.Backends = append(f.Backends, NewBackend(name))
		}
		if given[idx] {
			return fieldError(farmObject(f.Name), fmt.Sprintf("backends[%d].name", i), name, "names a backend given earlier in the same request; give each backend once")
		}
		given[idx] = true
		obj := objName{farm: f.Name, backend: name, isBackend: true}
		if err := decodeMembers(d, e, obj, &f.Backends[idx], backendFields, backendSkip); err != nil {
			return err
		}
		if c := d.lastMember(e, "check"); c >= 0 {
			chk, err := decodeCheck(d, c, obj, f.Backends[idx].Check)
			if err != nil {
				return err
			}
			f.Backends[idx].Check = chk
		}
	}
	return nil
}

// DecodeBackend patches one backend from a JSON object (the body of a
// backend-level request), returning the updated farm, validated.
func DecodeBackend(f *Farm, body []byte) (Farm, error) {
	nf := f.Clone()
	d, ok := scanDoc(body)
	defer d.release()
	if !ok {
		return Farm{}, &FieldError{Object: farmObject(f.Name), Field: "backends", Problem: "must be an array of backend objects"}
	}
	if err := decodeBackends(&nf, &d, 0, d.toks[0].next); err != nil {
		return Farm{}, err
	}
	if err := nf.Validate(); err != nil {
		return Farm{}, err
	}
	return nf, nil
}

// encoded caches a farm's wire form: farms are immutable, so a dump of 16,000
// farms is a concatenation of cached bytes rather than 16,000 encodings.
type encoded struct {
	once sync.Once
	json []byte

	// The ipvsadm-style listing (listing.go), [0] numeric, [1] with
	// service names.
	listOnce [2]sync.Once
	list     [2][]byte
}

// AppendJSON appends the farm's full nftlb-style JSON object (every field,
// defaults filled in) to dst.
func (f *Farm) AppendJSON(dst []byte) []byte {
	if f.enc == nil {
		return f.appendJSON(dst)
	}
	f.enc.once.Do(func() { f.enc.json = f.appendJSON(nil) })
	return append(dst, f.enc.json...)
}

// JSONLen is the length of what AppendJSON appends.
func (f *Farm) JSONLen() int {
	if f.enc == nil {
		return len(f.appendJSON(nil))
	}
	f.enc.once.Do(func() { f.enc.json = f.appendJSON(nil) })
	return len(f.enc.json)
}

// SameJSON reports whether a and b have the same JSON encoding (every
// field). Sealed farms compare their cached encodings in place: copying
// them out (AppendJSON) cost two allocations the size of the farms.
func SameJSON(a, b *Farm) bool {
	return string(a.cachedJSON()) == string(b.cachedJSON())
}

// cachedJSON is the farm's encoding, not to be changed: the cache of a
// sealed farm, else a new one.
func (f *Farm) cachedJSON() []byte {
	if f.enc == nil {
		return f.appendJSON(nil)
	}
	f.enc.once.Do(func() { f.enc.json = f.appendJSON(nil) })
	return f.enc.json
}

// Seal marks a farm as immutable and enables its encoding cache. The engine
// seals every farm it publishes.
func (f *Farm) Seal() {
	if f.enc == nil {
		f.enc = &encoded{}
	}
}

// Encoding appends every value straight to the output. It built a string
// per value (FormatUint, Addr.String, Sprintf) and grew the buffer as it
// went: about 320 allocations for a farm of 100 backends, now one.

// farmKeys and backendKeys are the fields' names as JSON keys, colon
// included.
var farmKeys, backendKeys = jsonKeys(farmFields), jsonKeys(backendFields)

func jsonKeys[T any](fields []scalarField[T]) []string {
	keys := make([]string, len(fields))
	for i := range fields {
		keys[i] = string(appendJSONString(nil, fields[i].name)) + ":"
	}
	return keys
}

// Sizes to reserve for a farm's JSON: its fields and its policies, and
// each backend (about 600 and 150 bytes with IPv4 addresses).
const (
	farmJSONSize    = 640
	backendJSONSize = 160
)

func (f *Farm) appendJSON(dst []byte) []byte { return f.appendJSONExtra(dst, nil) }

// BackendExtra appends members to backend i's JSON object, each starting
// with a comma: what a reader adds that is not configuration (health).
type BackendExtra func(dst []byte, i int) []byte

// AppendJSONExtra appends the farm's JSON as AppendJSON does, with extra
// members in each backend's object. It is not cached.
func (f *Farm) AppendJSONExtra(dst []byte, extra BackendExtra) []byte {
	return f.appendJSONExtra(dst, extra)
}

func (f *Farm) appendJSONExtra(dst []byte, extra BackendExtra) []byte {
	dst = slices.Grow(dst, farmJSONSize+backendJSONSize*len(f.Backends))
	dst = append(dst, '{')
	for i := range farmFields {
		if farmFields[i].append == nil || farmFields[i].omit != nil && farmFields[i].omit(f) {
			continue // write-only (newname), or unset and left out
		}
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, farmKeys[i]...)
		dst = farmFields[i].append(dst, f)
	}
	dst = append(dst, `,"addresses":`...)
	dst = f.appendAddressesJSON(dst)
	if f.Check != nil {
		dst = append(dst, `,"check":`...)
		dst = appendCheckJSON(dst, f.Check)
	}
	dst = append(dst, `,"backends":`...)
	dst = f.appendBackendsJSON(dst, extra)
	if len(f.Sessions) > 0 {
		dst = append(dst, `,"sessions":`...)
		dst = f.appendStaticSessionsJSON(dst)
	}
	dst = append(dst, `,"policies":[`...)
	for i, p := range f.Policies {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"name":`...)
		dst = appendJSONString(dst, p.Name)
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

func (f *Farm) appendBackendsJSON(dst []byte, extra BackendExtra) []byte {
	dst = append(dst, '[')
	level := f.PriorityLevel()
	for i := range f.Backends {
		if i > 0 {
			dst = append(dst, ',')
		}
		b := &f.Backends[i]
		dst = append(dst, '{')
		for j := range backendFields {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, backendKeys[j]...)
			if backendFields[j].name == "state" && b.Standby(level) {
				// Up, but above the farm's priority level: nftlb
				// prints "available".
				dst = append(dst, `"available"`...)
				continue
			}
			dst = backendFields[j].append(dst, b)
		}
		if b.Check != nil {
			dst = append(dst, `,"check":`...)
			dst = appendCheckJSON(dst, b.Check)
		}
		if extra != nil {
			dst = extra(dst, i)
		}
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// appendQuotedUint appends n in base as a JSON string, after prefix.
func appendQuotedUint(dst []byte, prefix string, n uint64, base int) []byte {
	dst = append(dst, '"')
	dst = append(dst, prefix...)
	dst = strconv.AppendUint(dst, n, base)
	return append(dst, '"')
}

// appendAddr appends a as text (its String), nothing for the zero Addr.
func appendAddr(dst []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return dst
	}
	return a.AppendTo(dst)
}

// closeJSONString ends the JSON string whose opening quote is dst[start]
// and whose text was appended as is. Text that needs escaping (an
// address's zone may hold anything) is written again by appendJSONString.
func closeJSONString(dst []byte, start int) []byte {
	for _, c := range dst[start+1:] {
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return appendJSONString(dst[:start], string(dst[start+1:]))
		}
	}
	return append(dst, '"')
}

// appendPorts appends virtual-ports as formatPorts writes them.
func appendPorts(dst []byte, rs []PortRange) []byte {
	for i, r := range rs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(r.First), 10)
		if r.First != r.Last {
			dst = strconv.AppendUint(append(dst, '-'), uint64(r.Last), 10)
		}
	}
	return dst
}

// appendQuoted appends v as a JSON string: its keywords joined by sep (' '
// as name writes them, '-' for persistence).
func (s flagSpec[T]) appendQuoted(dst []byte, v T, sep byte) []byte {
	dst = append(dst, '"')
	if v == 0 {
		dst = append(dst, s.none...)
	}
	first := true
	for i, n := range s.names {
		if v&(1<<i) != 0 {
			if !first {
				dst = append(dst, sep)
			}
			dst = append(dst, n...)
			first = false
		}
	}
	return append(dst, '"')
}

// appendQuoted appends the address as a JSON string as String writes it
// ("" when unset).
func (a EtherAddr) appendQuoted(dst []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	if !a.IsZero() {
		for i, b := range a {
			if i > 0 {
				dst = append(dst, ':')
			}
			dst = append(dst, hex[b>>4], hex[b&15])
		}
	}
	return append(dst, '"')
}

// AppendBackendsJSON appends nftlb's {"backends":[...]} for the farm's
// backends (every field, defaults filled in).
func (f *Farm) AppendBackendsJSON(dst []byte) []byte {
	dst = append(dst, `{"backends":`...)
	dst = f.appendBackendsJSON(dst, nil)
	return append(dst, "}\n"...)
}

// MarshalJSON implements json.Marshaler with the nftlb wire form.
func (f *Farm) MarshalJSON() ([]byte, error) { return f.AppendJSON(nil), nil }

// appendJSONString appends s as a JSON string. Plain names take the fast path.
func appendJSONString(dst []byte, s string) []byte {
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

// AppendFarmsJSON writes {"farms":[...]} for the given farms.
func AppendFarmsJSON(dst []byte, farms []*Farm) []byte {
	dst = append(dst, `{"farms":[`...)
	for i, f := range farms {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = f.AppendJSON(dst)
	}
	return append(dst, "]}\n"...)
}
