package model

import (
	"encoding/json"
	"sync"
	"unicode/utf8"
)

// A request body is read in one pass. scanDoc checks it is JSON (exactly
// the language json.Valid accepts, nesting limit included) and, in the same
// pass, records every value's span on a tape; decoding then walks the tape
// and reads only the bytes of the scalars it needs.
//
// It replaced json.Valid followed by splitters that re-scanned the body at
// every level of nesting (envelope, farms array, farm object, backends
// array, each backend): about 0.25 ms of decoding for a farm of 100
// backends, most of it spent finding the same value ends again and again.
// A library tokenizer would do the same work (encoding/json/jsontext needs
// GOEXPERIMENT; go-json-experiment is a new dependency for one small
// grammar), so the scanner is written here and fuzzed against json.Valid.

// maxDepth is encoding/json's nesting limit: a body json.Valid refuses must
// be refused here too.
const maxDepth = 10000

// tok is one value of a scanned document, or one object key.
type tok struct {
	start, end int // the value's bytes: doc[start:end], quotes and brackets included
	// next is the tape index just past this value: past its members or
	// elements for an object or array, so siblings are one step apart.
	next int
	kind byte // '{', '[', '"', 't', 'f', 'n', or a number's first byte ('-', '0'-'9')
	esc  bool // a string with a backslash escape
	high bool // a string with bytes of 0x80 and above (maybe invalid UTF-8)
}

// doc is a scanned JSON document. s is the body as a string: scalar values
// are substrings of it, not one copy each. Whatever is kept beyond the
// decode (names, prefixes) must be cloned, so a farm does not hold on to
// the whole body.
type doc struct {
	s    string
	toks []tok
	tape *[]tok // where toks goes back to (release)
}

// tapes keeps tapes between decodes: a tape is about 32 bytes a value.
var tapes = sync.Pool{New: func() any { return new([]tok) }}

// scanDoc scans body. ok is false if body is not valid JSON. Release the
// doc when done with it, whether ok or not.
func scanDoc(body []byte) (d doc, ok bool) {
	tape := tapes.Get().(*[]tok)
	sc := scanner{s: string(body), toks: (*tape)[:0]}
	ok = sc.document()
	return doc{s: sc.s, toks: sc.toks, tape: tape}, ok
}

// release hands the tape back for the next decode; d must not be used after.
func (d *doc) release() {
	*d.tape = d.toks[:0]
	tapes.Put(d.tape)
	d.toks, d.tape = nil, nil
}

// scanner validates a document and appends its values to toks.
type scanner struct {
	s     string
	toks  []tok
	depth int
}

// document scans one value with optional white space around it.
func (sc *scanner) document() bool {
	i, ok := sc.value(skipSpace(sc.s, 0))
	return ok && skipSpace(sc.s, i) == len(sc.s)
}

// value scans the value starting at s[i] and returns the index after it.
func (sc *scanner) value(i int) (int, bool) {
	if i >= len(sc.s) {
		return 0, false
	}
	switch c := sc.s[i]; {
	case c == '{':
		return sc.container(i, '}')
	case c == '[':
		return sc.container(i, ']')
	case c == '"':
		return sc.str(i)
	case c == '-' || c >= '0' && c <= '9':
		return sc.number(i)
	case c == 't':
		return sc.literal(i, "true")
	case c == 'f':
		return sc.literal(i, "false")
	case c == 'n':
		return sc.literal(i, "null")
	}
	return 0, false
}

// container scans the object or array starting at s[i]; closer is its
// closing bracket.
func (sc *scanner) container(i int, closer byte) (int, bool) {
	if sc.depth++; sc.depth > maxDepth {
		return 0, false
	}
	at := len(sc.toks)
	sc.toks = append(sc.toks, tok{start: i, kind: sc.s[i]})
	s := sc.s
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == closer {
		i++
	} else {
		for {
			var ok bool
			if closer == '}' {
				if i >= len(s) || s[i] != '"' {
					return 0, false
				}
				if i, ok = sc.str(i); !ok {
					return 0, false
				}
				if i = skipSpace(s, i); i >= len(s) || s[i] != ':' {
					return 0, false
				}
				i = skipSpace(s, i+1)
			}
			if i, ok = sc.value(i); !ok {
				return 0, false
			}
			if i = skipSpace(s, i); i >= len(s) {
				return 0, false
			}
			if s[i] == ',' {
				i = skipSpace(s, i+1)
				continue
			}
			if s[i] != closer {
				return 0, false
			}
			i++
			break
		}
	}
	sc.depth--
	sc.toks[at].end, sc.toks[at].next = i, len(sc.toks)
	return i, true
}

// plainByte marks the bytes a string holds without a closer look: not a
// quote, backslash, control character or byte of a multi-byte character.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str scans the string starting at s[i] (its opening quote).
func (sc *scanner) str(i int) (int, bool) {
	s := sc.s
	t := tok{start: i, kind: '"'}
	for j := i + 1; j < len(s); j++ {
		c := s[j]
		if plainByte[c] {
			continue
		}
		switch {
		case c == '"':
			t.end, t.next = j+1, len(sc.toks)+1
			sc.toks = append(sc.toks, t)
			return j + 1, true
		case c == '\\':
			t.esc = true
			n, ok := escapeLen(s, j)
			if !ok {
				return 0, false
			}
			j += n - 1
		case c < 0x20:
			return 0, false // JSON strings hold no raw control characters
		default:
			t.high = true // json.Valid accepts invalid UTF-8 too
		}
	}
	return 0, false
}

// escapeLen returns the length of the escape sequence at s[j] (a backslash).
func escapeLen(s string, j int) (int, bool) {
	if j+1 >= len(s) {
		return 0, false
	}
	switch s[j+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, true
	case 'u':
		if j+6 > len(s) {
			return 0, false
		}
		for _, h := range []byte(s[j+2 : j+6]) {
			if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
				return 0, false
			}
		}
		return 6, true
	}
	return 0, false
}

// number scans the number starting at s[i]: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (sc *scanner) number(i int) (int, bool) {
	s := sc.s
	j := i
	if s[j] == '-' {
		j++
	}
	switch {
	case j < len(s) && s[j] == '0':
		j++
	case j < len(s) && s[j] >= '1' && s[j] <= '9':
		j = skipDigits(s, j+1)
	default:
		return 0, false
	}
	if j < len(s) && s[j] == '.' {
		k := skipDigits(s, j+1)
		if k == j+1 {
			return 0, false
		}
		j = k
	}
	if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
		j++
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := skipDigits(s, j)
		if k == j {
			return 0, false
		}
		j = k
	}
	sc.toks = append(sc.toks, tok{start: i, end: j, next: len(sc.toks) + 1, kind: s[i]})
	return j, true
}

func skipDigits(s string, j int) int {
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	return j
}

// literal scans true, false or null at s[i].
func (sc *scanner) literal(i int, lit string) (int, bool) {
	end := i + len(lit)
	if end > len(sc.s) || sc.s[i:end] != lit {
		return 0, false
	}
	sc.toks = append(sc.toks, tok{start: i, end: end, next: len(sc.toks) + 1, kind: lit[0]})
	return end, true
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// Walking the tape. An object's members are key, value, key, value...
// from its index+1 to its next; an array's elements likewise without keys.

// raw returns the bytes of value v as text.
func (d *doc) raw(v int) string { return d.s[d.toks[v].start:d.toks[v].end] }

// children returns the index of the first key (object) or element (array)
// of container v, and the index just past its last member or element.
func (d *doc) children(v int) (first, end int) { return v + 1, d.toks[v].next }

// count returns the number of elements of array v.
func (d *doc) count(v int) int {
	n := 0
	for e, end := d.children(v); e < end; e = d.toks[e].next {
		n++
	}
	return n
}

// key returns object key k as text, decoded as encoding/json decodes map
// keys (escapes resolved, invalid UTF-8 replaced). A plain key is a
// substring of the document: comparing it to a field name copies nothing.
func (d *doc) key(k int) string {
	t := &d.toks[k]
	inner := d.s[t.start+1 : t.end-1]
	if !t.esc && (!t.high || utf8.ValidString(inner)) {
		return inner
	}
	var v string
	if json.Unmarshal([]byte(d.raw(k)), &v) != nil {
		return "" // unreachable: the document was scanned as valid
	}
	return v
}

// lastMember returns the value of the last member named name of object
// obj (a key given twice keeps its last value, as in a map), or -1.
func (d *doc) lastMember(obj int, name string) int {
	v := -1
	for k, end := d.children(obj); k < end; k = d.toks[k+1].next {
		if d.key(k) == name {
			v = k + 1
		}
	}
	return v
}

// str returns value v as text if it is a JSON string (names must be).
func (d *doc) str(v int) (string, bool) {
	if v < 0 || d.toks[v].kind != '"' {
		return "", false
	}
	return d.scalar(v)
}

// scalar returns value v as text if it is a JSON string, number or
// boolean. A string without escapes is its bytes between the quotes, as
// sent (invalid UTF-8 included); one with escapes is decoded by
// encoding/json.
func (d *doc) scalar(v int) (string, bool) {
	if v < 0 {
		return "", false
	}
	t := &d.toks[v]
	switch t.kind {
	case '{', '[', 'n':
		return "", false
	case '"':
		if !t.esc {
			return d.s[t.start+1 : t.end-1], true
		}
		var s string
		if json.Unmarshal([]byte(d.raw(v)), &s) != nil {
			return "", false
		}
		return s, true
	}
	return d.raw(v), true
}
