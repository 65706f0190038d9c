package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/netip"
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
	name   string
	decode func(t *T, v string) error // v: the value as text
	encode func(t *T) string
}

// scalarText returns a JSON scalar (string, number, bool) as text.
func scalarText(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	switch raw[0] {
	case '"':
		// raw was already checked as valid JSON by the enclosing decode, so
		// a string without escapes is its bytes between the quotes.
		if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 {
			return string(inner), true
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case '{', '[', 'n':
		return "", false
	}
	return string(raw), true
}

func parseUint(field, v string, max uint64) (uint64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 0, 64)
	if err != nil || n > max {
		return 0, fmt.Errorf("must be a whole number 0-%d", max)
	}
	return n, nil
}

func uintField[T any](name string, max uint64, ptr func(*T) *uint32) scalarField[T] {
	return scalarField[T]{
		name: name,
		decode: func(t *T, v string) error {
			n, err := parseUint(name, v, max)
			if err != nil {
				return err
			}
			*ptr(t) = uint32(n)
			return nil
		},
		encode: func(t *T) string { return strconv.FormatUint(uint64(*ptr(t)), 10) },
	}
}

func markField[T any](ptr func(*T) *uint32) scalarField[T] {
	return scalarField[T]{
		name: "mark",
		decode: func(t *T, v string) error {
			n, err := parseUint("mark", v, 0xffffffff)
			if err != nil {
				return fmt.Errorf("must be a 32-bit number, e.g. 0x10")
			}
			*ptr(t) = uint32(n)
			return nil
		},
		encode: func(t *T) string { return "0x" + strconv.FormatUint(uint64(*ptr(t)), 16) },
	}
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
		encode: func(t *T) string { return spec.name(*ptr(t)) },
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
		encode: func(t *T) string {
			if a := *ptr(t); a.IsValid() {
				return a.String()
			}
			return ""
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
		encode: func(t *T) string { return ptr(t).String() },
	}
}

func ifaceField(name string, ptr func(*Farm) *string) scalarField[Farm] {
	return scalarField[Farm]{
		name: name,
		decode: func(f *Farm, v string) error {
			if v != "" && !ValidIfName(v) {
				return fmt.Errorf("must be an interface name: 1 to 15 characters, no '/', ':' or white space")
			}
			*ptr(f) = v
			return nil
		},
		encode: func(f *Farm) string { return *ptr(f) },
	}
}

var farmFields = []scalarField[Farm]{
	{name: "name", encode: func(f *Farm) string { return f.Name }}, // decoded by DecodeFarms
	enumField("family", familySpec, func(f *Farm) *Family { return &f.Family }),
	{
		// One address, or (family dual) an IPv4 and an IPv6 address
		// separated by a comma.
		name: "virtual-addr",
		decode: func(f *Farm, v string) error {
			first, second, two := strings.Cut(v, ",")
			first, second = strings.TrimSpace(first), strings.TrimSpace(second)
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
		encode: func(f *Farm) string {
			switch {
			case !f.VirtualAddr.IsValid():
				return ""
			case f.VirtualAddr2.IsValid():
				return f.VirtualAddr.String() + "," + f.VirtualAddr2.String()
			}
			return f.VirtualAddr.String()
		},
	},
	{
		name: "virtual-ports",
		decode: func(f *Farm, v string) error {
			ps, err := ParsePorts(v)
			if err != nil {
				return err
			}
			f.VirtualPorts = ps
			return nil
		},
		encode: func(f *Farm) string { return formatPorts(f.VirtualPorts) },
	},
	addrField("source-addr", func(f *Farm) *netip.Addr { return &f.SourceAddr }),
	enumField("mode", modeSpec, func(f *Farm) *Mode { return &f.Mode }),
	enumField("protocol", protocolSpec, func(f *Farm) *Protocol { return &f.Protocol }),
	enumField("scheduler", schedulerSpec, func(f *Farm) *Scheduler { return &f.Scheduler }),
	{
		name: "sched-param",
		decode: func(f *Farm, v string) error {
			k, ok := hashKeySpec.parse(v)
			if !ok {
				return fmt.Errorf("allowed values are %s", hashKeySpec.allowed())
			}
			f.SchedParam = k
			return nil
		},
		encode: func(f *Farm) string { return f.SchedParam.String() },
	},
	{
		name: "persistence",
		decode: func(f *Farm, v string) error {
			k, ok := parsePersistence(v)
			if !ok {
				return fmt.Errorf("allowed values are none, srcip, dstip, srcport, dstport, srcmac and combinations joined by '-' (e.g. srcip-srcport)")
			}
			f.Persistence = k
			return nil
		},
		encode: func(f *Farm) string { return persistenceName(f.Persistence) },
	},
	uintField("persist-ttl", 1<<31-1, func(f *Farm) *uint32 { return &f.PersistTTL }),
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
		encode: func(f *Farm) string { return f.Log.String() },
	},
	{
		name:   "log-prefix",
		decode: func(f *Farm, v string) error { f.LogPrefix = v; return nil },
		encode: func(f *Farm) string { return f.LogPrefix },
	},
	markField(func(f *Farm) *uint32 { return &f.Mark }),
	uintField("priority", MaxPriority, func(f *Farm) *uint32 { return &f.Priority }),
	enumField("state", stateSpec, func(f *Farm) *State { return &f.State }),
	uintField("new-rtlimit", 1<<31-1, func(f *Farm) *uint32 { return &f.NewRTLimit }),
	uintField("new-rtlimit-burst", 1<<31-1, func(f *Farm) *uint32 { return &f.NewRTBurst }),
	uintField("rst-rtlimit", 1<<31-1, func(f *Farm) *uint32 { return &f.RstRTLimit }),
	uintField("rst-rtlimit-burst", 1<<31-1, func(f *Farm) *uint32 { return &f.RstRTBurst }),
	uintField("est-connlimit", 1<<31-1, func(f *Farm) *uint32 { return &f.EstConnLimit }),
	{
		name: "tcp-strict",
		decode: func(f *Farm, v string) error {
			switch v {
			case "on", "true":
				f.TCPStrict = true
			case "off", "false":
				f.TCPStrict = false
			default:
				return fmt.Errorf("allowed values are on, off")
			}
			return nil
		},
		encode: func(f *Farm) string {
			if f.TCPStrict {
				return "on"
			}
			return "off"
		},
	},
	ifaceField("iface", func(f *Farm) *string { return &f.Iface }),
	ifaceField("oface", func(f *Farm) *string { return &f.Oface }),
	etherField(func(f *Farm) *EtherAddr { return &f.EtherAddr }),
}

var backendFields = []scalarField[Backend]{
	{name: "name", encode: func(b *Backend) string { return b.Name }},
	addrField("ip-addr", func(b *Backend) *netip.Addr { return &b.Addr }),
	{
		name: "port",
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
		encode: func(b *Backend) string {
			if b.Port == 0 {
				return ""
			}
			return strconv.Itoa(int(b.Port))
		},
	},
	uintField("weight", MaxWeight, func(b *Backend) *uint32 { return &b.Weight }),
	uintField("priority", MaxPriority, func(b *Backend) *uint32 { return &b.Priority }),
	markField(func(b *Backend) *uint32 { return &b.Mark }),
	uintField("est-connlimit", 1<<31-1, func(b *Backend) *uint32 { return &b.EstConnLimit }),
	enumField("state", stateSpec, func(b *Backend) *State { return &b.State }),
	etherField(func(b *Backend) *EtherAddr { return &b.EtherAddr }),
}

// ParsePorts parses nftlb's virtual-ports: "80,443,1000-2000"; "" means every port.
func ParsePorts(v string) ([]PortRange, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	var out []PortRange
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		first, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
		last := first
		var err2 error
		if isRange {
			last, err2 = strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
		}
		if err1 != nil || err2 != nil || first == 0 || last < first {
			return nil, fmt.Errorf("must be ports 1-65535 or ranges low-high separated by commas, e.g. 80,443,1000-2000 (bad part %q)", part)
		}
		out = append(out, PortRange{uint16(first), uint16(last)})
	}
	return out, nil
}

// wireError wraps a decode problem of one field.
func wireError(obj, field, value string, err error) error {
	return &FieldError{Object: obj, Field: field, Value: value, Problem: err.Error()}
}

// decodeScalars sets t's fields from raw. obj names the object in errors; it
// is a function so the name is built only when there is an error.
func decodeScalars[T any](obj func() string, t *T, fields []scalarField[T], raw iter.Seq2[string, json.RawMessage], skip func(string) bool) error {
	for key, val := range raw {
		if skip(key) {
			continue
		}
		var fld *scalarField[T]
		for i := range fields {
			if fields[i].name == key {
				fld = &fields[i]
				break
			}
		}
		if fld == nil || fld.decode == nil {
			return &FieldError{Object: obj(), Field: key, Problem: "unknown field; known fields are " + fieldNames(fields)}
		}
		text, ok := scalarText(val)
		if !ok {
			return &FieldError{Object: obj(), Field: key, Value: truncate(string(val)), Problem: "must be a string, number or boolean"}
		}
		if err := fld.decode(t, text); err != nil {
			return wireError(obj(), key, text, err)
		}
	}
	return nil
}

// memberSeq yields an object's members in order.
func memberSeq(pairs []member) iter.Seq2[string, json.RawMessage] {
	return func(yield func(string, json.RawMessage) bool) {
		for _, p := range pairs {
			if !yield(p.key, p.val) {
				return
			}
		}
	}
}

func fieldNames[T any](fields []scalarField[T]) string {
	names := make([]string, 0, len(fields)+2)
	for _, f := range fields {
		names = append(names, f.name)
	}
	if _, isFarm := any(fields).([]scalarField[Farm]); isFarm {
		names = append(names, "backends", "policies")
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
// or onto the defaults if new, then validated on its own.
func DecodeFarms(body []byte, current FarmLookup) ([]Farm, error) {
	// json.Valid checks the body once; the envelope is then split by
	// objectMembers (an Unmarshal into a map scanned the body twice more).
	// Only an invalid body pays for the Unmarshal, for its error message.
	envelope, ok := map[string]json.RawMessage(nil), json.Valid(body)
	if ok {
		envelope, ok = objectMembers(body)
	}
	if !ok {
		var probe map[string]json.RawMessage
		err := json.Unmarshal(body, &probe)
		if err == nil {
			err = errors.New("not an object")
		}
		return nil, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	var items []json.RawMessage
	if farms, ok := envelope["farms"]; ok {
		if len(envelope) != 1 {
			for k := range envelope {
				if k != "farms" {
					return nil, &FieldError{Field: k, Problem: "unknown top-level field; the body is {\"farms\": [...]}"}
				}
			}
		}
		var ok bool
		if items, ok = splitArray(farms); !ok {
			return nil, &FieldError{Field: "farms", Problem: "must be an array of farm objects"}
		}
	} else {
		items = []json.RawMessage{body}
	}
	out := make([]Farm, 0, len(items))
	seen := make(map[string]bool, len(items))
	for i, item := range items {
		f, err := decodeFarm(item, i, current)
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

func decodeFarm(item json.RawMessage, index int, current FarmLookup) (Farm, error) {
	raw, ok := objectMembers(item) // item is valid JSON (DecodeFarms)
	if !ok {
		return Farm{}, &FieldError{Field: fmt.Sprintf("farms[%d]", index), Problem: "must be a JSON object"}
	}
	nameText, ok := scalarText(raw["name"])
	if !ok || !ValidName(nameText) {
		return Farm{}, &FieldError{Object: fmt.Sprintf("farms[%d]", index), Field: "name", Value: nameText, Problem: "is required and must be " + nameRule}
	}
	var f Farm
	if cur, ok := current(nameText); ok {
		f = cur.Clone()
	} else {
		f = NewFarm(nameText)
	}
	obj := farmObject(f.Name)
	if err := decodeScalars(func() string { return obj }, &f, farmFields, maps.All(raw), func(k string) bool {
		return k == "name" || k == "backends" || k == "policies"
	}); err != nil {
		return Farm{}, err
	}
	if _, set := raw["sched-param"]; !set && (f.Scheduler == SchedHash || f.Scheduler == SchedSymhash) && f.SchedParam == 0 {
		f.SchedParam = KeySrcIP // nftlb's default keys for the hash schedulers
	}
	if _, set := raw["sched-param"]; !set && f.Scheduler != SchedHash && f.Scheduler != SchedSymhash {
		f.SchedParam = 0
	}
	if bs, ok := raw["backends"]; ok {
		if err := decodeBackends(&f, bs); err != nil {
			return Farm{}, err
		}
	}
	if ps, ok := raw["policies"]; ok {
		var items []map[string]json.RawMessage
		if err := json.Unmarshal(ps, &items); err != nil {
			return Farm{}, &FieldError{Object: obj, Field: "policies", Problem: "must be an array of {\"name\": ...} objects"}
		}
		for _, it := range items {
			name, _ := scalarText(it["name"])
			if _, dup := f.policy(name); !dup {
				f.Policies = append(f.Policies, PolicyRef{Name: name})
			}
		}
	}
	if err := f.Validate(); err != nil {
		return Farm{}, err
	}
	return f, nil
}

func (f *Farm) policy(name string) (*PolicyRef, bool) {
	for i := range f.Policies {
		if f.Policies[i].Name == name {
			return &f.Policies[i], true
		}
	}
	return nil, false
}

func decodeBackends(f *Farm, raw json.RawMessage) error {
	obj := farmObject(f.Name)
	// raw is valid JSON: part of a body DecodeFarms checked, or checked by
	// DecodeBackend.
	elems, ok := splitArray(raw)
	if !ok {
		return &FieldError{Object: obj, Field: "backends", Problem: "must be an array of backend objects"}
	}
	items := make([][]member, len(elems))
	pairs := make([]member, 0, 8*len(elems)) // one allocation for all members
	for i, e := range elems {
		start := len(pairs)
		if pairs, ok = objectPairs(e, pairs); !ok {
			return &FieldError{Object: obj, Field: "backends", Problem: "must be an array of backend objects"}
		}
		items[i] = pairs[start:len(pairs):len(pairs)]
	}
	// Index the existing backends by name so a patch of n backends onto a
	// farm with m costs O(n+m), not O(n*m).
	index := make(map[string]int, len(f.Backends)+len(items))
	for i := range f.Backends {
		index[f.Backends[i].Name] = i
	}
	for i, item := range items {
		name, ok := scalarText(lastValue(item, "name"))
		if !ok || !ValidName(name) {
			return &FieldError{Object: obj, Field: fmt.Sprintf("backends[%d].name", i), Value: name, Problem: "is required and must be " + nameRule}
		}
		idx, exists := index[name]
		var nb Backend
		if exists {
			nb = f.Backends[idx]
		} else {
			nb = NewBackend(name)
		}
		if err := decodeScalars(func() string { return backendObject(f.Name, name) }, &nb, backendFields, memberSeq(item), func(k string) bool { return k == "name" }); err != nil {
			return err
		}
		if exists {
			f.Backends[idx] = nb
		} else {
			index[name] = len(f.Backends)
			f.Backends = append(f.Backends, nb)
		}
	}
	return nil
}

// DecodeBackend patches one backend from a JSON object (the body of a
// backend-level request), returning the updated farm, validated.
func DecodeBackend(f *Farm, body []byte) (Farm, error) {
	nf := f.Clone()
	if !json.Valid(body) {
		return Farm{}, &FieldError{Object: farmObject(f.Name), Field: "backends", Problem: "must be an array of backend objects"}
	}
	if err := decodeBackends(&nf, append(append([]byte{'['}, body...), ']')); err != nil {
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

// Seal marks a farm as immutable and enables its encoding cache. The engine
// seals every farm it publishes.
func (f *Farm) Seal() {
	if f.enc == nil {
		f.enc = &encoded{}
	}
}

func (f *Farm) appendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	for i := range farmFields {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, farmFields[i].name)
		dst = append(dst, ':')
		dst = appendJSONString(dst, farmFields[i].encode(f))
	}
	dst = append(dst, `,"backends":`...)
	dst = f.appendBackendsJSON(dst)
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

func (f *Farm) appendBackendsJSON(dst []byte) []byte {
	dst = append(dst, '[')
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
			dst = appendJSONString(dst, backendFields[j].name)
			dst = append(dst, ':')
			dst = appendJSONString(dst, backendFields[j].encode(b))
		}
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// AppendBackendsJSON appends nftlb's {"backends":[...]} for the farm's
// backends (every field, defaults filled in).
func (f *Farm) AppendBackendsJSON(dst []byte) []byte {
	dst = append(dst, `{"backends":`...)
	dst = f.appendBackendsJSON(dst)
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
