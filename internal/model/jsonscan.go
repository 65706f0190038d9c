package model

import (
	"encoding/json"
	"unicode/utf8"
)

// A request body is checked as JSON once, by json.Valid (DecodeFarms). Splitting the farms array, each farm object and
// its backends array and objects again with json.Unmarshal re-validated and
// re-scanned the same bytes at every level (four passes, and a map built by
// reflection per backend): about 0.4 ms for a farm of 100 backends, a fifth
// of an API call. The scanners below split already-valid JSON in one pass,
// and backends are decoded from their members in order (objectPairs), not
// from a map per backend object.
// They still refuse what is not an array or object of the expected shape
// (ok false), so a caller with unchecked input must check it with
// json.Valid first.

// splitArray returns the elements of the JSON array raw.
func splitArray(raw []byte) (elems []json.RawMessage, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return []json.RawMessage{}, skipSpace(raw, i+1) == len(raw)
	}
	for {
		end, ok := skipValue(raw, i)
		if !ok {
			return nil, false
		}
		elems = append(elems, raw[i:end])
		i = skipSpace(raw, end)
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return elems, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

// objectMembers returns the members of the JSON object raw, by key (a key
// given twice keeps its last value, as json.Unmarshal does).
func objectMembers(raw []byte) (map[string]json.RawMessage, bool) {
	pairs, ok := objectPairs(raw, nil)
	if !ok {
		return nil, false
	}
	out := make(map[string]json.RawMessage, len(pairs))
	for _, p := range pairs {
		out[p.key] = p.val
	}
	return out, true
}

// member is one member of a JSON object.
type member struct {
	key string
	val json.RawMessage
}

// objectPairs appends the members of the JSON object raw to out, in
// document order (a key given twice appears twice). Backends are decoded
// from these directly: a map per backend object cost a farm of 100 backends
// about a fifth of its decoding.
func objectPairs(raw []byte, out []member) ([]member, bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return nil, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return out, skipSpace(raw, i+1) == len(raw)
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return nil, false
		}
		kend, ok := skipString(raw, i)
		if !ok {
			return nil, false
		}
		key, ok := stringValue(raw[i:kend])
		if !ok {
			return nil, false
		}
		i = skipSpace(raw, kend)
		if i >= len(raw) || raw[i] != ':' {
			return nil, false
		}
		i = skipSpace(raw, i+1)
		vend, ok := skipValue(raw, i)
		if !ok {
			return nil, false
		}
		out = append(out, member{key, raw[i:vend]})
		i = skipSpace(raw, vend)
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case '}':
			return out, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

// lastValue returns the value of key in pairs (the last one if given
// twice), or nil.
func lastValue(pairs []member, key string) json.RawMessage {
	for i := len(pairs) - 1; i >= 0; i-- {
		if pairs[i].key == key {
			return pairs[i].val
		}
	}
	return nil
}

// stringValue decodes the JSON string s (with its quotes).
func stringValue(s []byte) (string, bool) {
	inner := s[1 : len(s)-1]
	plain := utf8.Valid(inner)
	for _, c := range inner {
		if c == '\\' || c < 0x20 {
			plain = false
			break
		}
	}
	if plain {
		return string(inner), true
	}
	var v string
	if json.Unmarshal(s, &v) != nil {
		return "", false
	}
	return v, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the JSON string starting at b[i].
func skipString(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// skipValue returns the index after the JSON value starting at b[i]:
// strings and nested arrays and objects as a whole, anything else up to the
// next delimiter.
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, ok := skipString(b, j)
				if !ok {
					return 0, false
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return 0, false
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j, j > i
}
