package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tables on the wire, in two vocabularies of one Table:
//
//	xlb (/tables, /state): {"name", "type", "family", "valtype", "limit",
//	  "locked", "timeout", "verdict", "log-prefix", "priority",
//	  "entries": [{"key", "value", "timeout" | "expires"}]}, and "count"
//	  on output.
//	nftlb (/policies): {"name", "type": "blacklist"|"whitelist", "family",
//	  "log-prefix", "timeout", "priority", "elements": [{"data", "time"}]},
//	  and "used" (how many farms use it) on output.
//
// Scalars are JSON strings on output, as nftlb writes them; strings,
// numbers and booleans are accepted on input. An entry's value is an
// object of its fields ({"mark": "16", "farm": "web"}) on output; input
// also takes the text form ("mark=16,farm=web" or ipfw's "16,web").

// Vocabulary selects the wire names of a table.
type Vocabulary uint8

const (
	// VocabTables is xlb's (ipfw's) vocabulary.
	VocabTables Vocabulary = iota
	// VocabPolicies is nftlb's policies vocabulary.
	VocabPolicies
)

// TableDecl is one table of a request body: the table as the body leaves
// it (patched onto its current version, or onto the defaults if new) and
// the entries the body lists, not yet checked against the table.
type TableDecl struct {
	Table Table
	// Exists says the table existed before (the body patched it).
	Exists bool
	// HasEntries says the body lists the entries ("entries" or
	// "elements", even empty).
	HasEntries bool
	Entries    []EntryInput
}

// TableLookup returns the current table of that name, if any.
type TableLookup func(name string) (*Table, bool)

// DecodeTables decodes {"tables":[...]} ({"policies":[...]} in nftlb's
// vocabulary) or one table object.
func DecodeTables(body []byte, current TableLookup, vocab Vocabulary) ([]TableDecl, error) {
	d, ok := scanDoc(body)
	defer d.release()
	if !ok || d.toks[0].kind != '{' {
		var probe map[string]json.RawMessage
		err := json.Unmarshal(body, &probe)
		if err == nil {
			err = errors.New("not an object")
		}
		return nil, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	return decodeTablesAt(&d, 0, current, vocab)
}

func listKey(vocab Vocabulary) string {
	if vocab == VocabPolicies {
		return "policies"
	}
	return "tables"
}

// decodeTablesAt decodes the object at tape index obj: an envelope whose
// only member is the list, or one table.
func decodeTablesAt(d *doc, obj int, current TableLookup, vocab Vocabulary) ([]TableDecl, error) {
	list := d.lastMember(obj, listKey(vocab))
	if list < 0 {
		td, err := decodeTable(d, obj, current, vocab)
		if err != nil {
			return nil, err
		}
		return []TableDecl{td}, nil
	}
	for k, end := d.children(obj); k < end; k = d.toks[k+1].next {
		if d.key(k) != listKey(vocab) {
			return nil, fieldError("", d.key(k), "", fmt.Sprintf("unknown top-level field; the body is {%q: [...]}", listKey(vocab)))
		}
	}
	if d.toks[list].kind != '[' {
		return nil, &FieldError{Field: listKey(vocab), Problem: "must be an array of objects"}
	}
	var out []TableDecl
	seen := map[string]bool{}
	for it, end := d.children(list); it < end; it = d.toks[it].next {
		td, err := decodeTable(d, it, current, vocab)
		if err != nil {
			return nil, err
		}
		if seen[td.Table.Name] {
			return nil, &FieldError{Field: listKey(vocab), Value: td.Table.Name, Problem: "the same table appears twice in one request"}
		}
		seen[td.Table.Name] = true
		out = append(out, td)
	}
	return out, nil
}

var (
	tableFieldNames  = []string{"name", "type", "family", "valtype", "limit", "locked", "timeout", "verdict", "log-prefix", "priority", "entries", "count"}
	policyFieldNames = []string{"name", "type", "family", "route", "log-prefix", "timeout", "priority", "elements", "used", "counters"}
	// fixedFields may not change once a table exists.
	fixedFields = []string{"type", "family", "valtype"}
)

// DecodeTable decodes one table object for the table named in a URL: the
// body's "name" may be left out, and must be that name if it is not.
func DecodeTable(body []byte, name string, current TableLookup, vocab Vocabulary) (TableDecl, error) {
	d, ok := scanDoc(body)
	defer d.release()
	if !ok || d.toks[0].kind != '{' {
		var probe map[string]json.RawMessage
		err := json.Unmarshal(body, &probe)
		if err == nil {
			err = errors.New("not an object")
		}
		return TableDecl{}, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	if d.lastMember(0, listKey(vocab)) >= 0 {
		return TableDecl{}, &FieldError{Field: listKey(vocab), Problem: "the body of this route is one object, not a list"}
	}
	if got, ok := d.scalar(d.lastMember(0, "name")); ok && got != name {
		return TableDecl{}, &FieldError{Field: "name", Value: strings.Clone(got), Problem: fmt.Sprintf("differs from the name in the path (%q)", name)}
	}
	return decodeTableNamed(&d, 0, name, current, vocab)
}

func decodeTable(d *doc, obj int, current TableLookup, vocab Vocabulary) (TableDecl, error) {
	return decodeTableNamed(d, obj, "", current, vocab)
}

// decodeTableNamed decodes the table object at obj; name, when not "",
// is its name whatever the object says.
func decodeTableNamed(d *doc, obj int, name string, current TableLookup, vocab Vocabulary) (TableDecl, error) {
	var td TableDecl
	if d.toks[obj].kind != '{' {
		return td, &FieldError{Field: listKey(vocab), Value: truncate(d.raw(obj)), Problem: "each element must be an object"}
	}
	if name == "" {
		var ok bool
		if name, ok = d.scalar(d.lastMember(obj, "name")); !ok || name == "" {
			return td, &FieldError{Field: "name", Problem: "every table needs a name"}
		}
	}
	name = strings.Clone(name)
	if cur, ok := current(name); ok {
		td.Table, td.Exists = cur.Clone(), true
	} else {
		td.Table = NewTable(name, TableAddr)
	}
	t := &td.Table
	obj2 := tableObject(name)
	known := tableFieldNames
	if vocab == VocabPolicies {
		known = policyFieldNames
	}
	for k, end := d.children(obj); k < end; k = d.toks[k+1].next {
		key, v := d.key(k), k+1
		if indexOf(known, key) < 0 {
			return td, fieldError(obj2, key, "", "unknown field; known fields are "+strings.Join(known, ", "))
		}
		switch key {
		case "name", "count", "used", "counters":
			continue // read-only on output; accepted so a listing can be sent back
		case "route":
			// nftlb's policies have a route; xlb's filter the clients
			// coming in (nftlb's "in"), the only one it takes.
			if text, ok := d.scalar(v); !ok || text != "in" {
				return td, fieldError(obj2, key, truncate(d.raw(v)), "allowed value is in: xlb's policies filter incoming clients")
			}
			continue
		case "entries", "elements":
			es, err := decodeEntries(d, v, name, vocab)
			if err != nil {
				return td, err
			}
			td.HasEntries, td.Entries = true, es
			continue
		}
		text, ok := d.scalar(v)
		if !ok {
			return td, fieldError(obj2, key, truncate(d.raw(v)), "must be a string, number or boolean")
		}
		if err := setTableField(t, key, text, vocab, td.Exists); err != nil {
			return td, fieldError(obj2, key, text, err.Error())
		}
	}
	if vocab == VocabPolicies && !td.Exists && t.Verdict == ListNone {
		t.Verdict = ListDeny // nftlb's default policy type is blacklist
	}
	if err := t.Validate(); err != nil {
		return td, err
	}
	return td, nil
}

func setTableField(t *Table, key, text string, vocab Vocabulary, exists bool) error {
	num := func(max uint64) (uint32, error) {
		n, err := parseUint(key, text, max)
		return uint32(n), err
	}
	var err error
	old := *t
	switch key {
	case "type":
		if vocab == VocabPolicies {
			v, ok := policyTypeSpec.parse(text)
			if !ok || text == "" {
				return fmt.Errorf("allowed values are blacklist, whitelist")
			}
			t.Verdict = v
			return nil
		}
		t.Type, t.Flow, err = ParseTableType(text)
	case "family":
		if vocab == VocabPolicies && strings.TrimSpace(text) == "" {
			// nftlb takes "" as its default (kube-nftlb sends it for
			// every policy): the policy's family stays xlb's default.
			return nil
		}
		f, ok := familySpec.parse(text)
		if !ok {
			return fmt.Errorf("allowed values are %s", familySpec.allowed())
		}
		t.Family = f
	case "valtype":
		t.Values, err = ParseValueFields(text)
	case "limit":
		t.Limit, err = num(MaxTableEntries)
	case "locked":
		t.Locked, err = strconv.ParseBool(text)
		if err != nil {
			err = fmt.Errorf("must be true or false")
		}
	case "timeout":
		t.Timeout, err = num(MaxTableTimeout)
	case "verdict":
		v, ok := ParseVerdict(text)
		if !ok {
			return fmt.Errorf("allowed values are none, deny, allow (or blacklist, whitelist)")
		}
		t.Verdict = v
	case "log-prefix":
		t.LogPrefix = strings.Clone(text)
	case "priority":
		t.Priority, err = num(MaxPriority)
	}
	if err != nil {
		return err
	}
	changed := old.Type != t.Type || old.Flow != t.Flow || old.Family != t.Family || old.Values != t.Values
	if exists && changed && (key == "family" || vocab == VocabTables && indexOf(fixedFields, key) >= 0) {
		return fmt.Errorf("cannot be changed once the table exists (it is %q); destroy and create the table", old.fieldText(key))
	}
	return nil
}

func (t *Table) fieldText(key string) string {
	switch key {
	case "type":
		return t.TypeString()
	case "family":
		return t.Family.String()
	case "valtype":
		return t.Values.String()
	}
	return ""
}

func decodeEntries(d *doc, arr int, table string, vocab Vocabulary) ([]EntryInput, error) {
	field := "entries"
	keyName, timeName := "key", "timeout"
	if vocab == VocabPolicies {
		field, keyName, timeName = "elements", "data", "time"
	}
	if d.toks[arr].kind == 'n' {
		return nil, nil
	}
	if d.toks[arr].kind != '[' {
		return nil, &FieldError{Object: tableObject(table), Field: field, Problem: "must be an array of objects"}
	}
	out := make([]EntryInput, 0, d.count(arr))
	for it, end := d.children(arr); it < end; it = d.toks[it].next {
		if d.toks[it].kind != '{' {
			return nil, &FieldError{Object: tableObject(table), Field: field, Value: truncate(d.raw(it)), Problem: "each entry must be an object"}
		}
		var in EntryInput
		for k, kend := d.children(it); k < kend; k = d.toks[k+1].next {
			key, v := d.key(k), k+1
			if key == "value" && vocab == VocabTables && d.toks[v].kind == '{' {
				text, err := valueObjectText(d, v)
				if err != nil {
					return nil, &FieldError{Object: entryObject(table, in.Key), Field: "value", Value: truncate(d.raw(v)), Problem: err.Error()}
				}
				in.Value, in.ValueSet = text, true
				continue
			}
			text, ok := d.scalar(v)
			if !ok {
				return nil, &FieldError{Object: entryObject(table, in.Key), Field: strings.Clone(key), Value: truncate(d.raw(v)), Problem: "must be a string or number"}
			}
			switch {
			case key == keyName:
				in.Key = strings.Clone(text)
			case key == "value" && vocab == VocabTables:
				in.Value, in.ValueSet = strings.Clone(text), true
			case key == timeName:
				if text == "" {
					continue
				}
				n, err := parseUint(key, text, MaxTableTimeout)
				if err != nil {
					return nil, &FieldError{Object: entryObject(table, in.Key), Field: strings.Clone(key), Value: strings.Clone(text), Problem: fmt.Sprintf("must be a whole number of seconds 0-%d", MaxTableTimeout)}
				}
				t := uint32(n)
				in.Timeout = &t
			case key == "expires" && vocab == VocabTables:
				if text == "" {
					continue
				}
				ts, err := time.Parse(time.RFC3339, text)
				if err != nil {
					return nil, &FieldError{Object: entryObject(table, in.Key), Field: "expires", Value: strings.Clone(text), Problem: "must be a time in RFC 3339 form, e.g. 2030-01-02T15:04:05Z"}
				}
				in.Expires = ts.Unix()
			case key == "counters":
				// read-only, as listed
			default:
				known := "key, value, timeout, expires"
				if vocab == VocabPolicies {
					known = "data, time"
				}
				return nil, &FieldError{Object: entryObject(table, in.Key), Field: strings.Clone(key), Problem: "unknown field; known fields are " + known}
			}
		}
		if in.Key == "" {
			return nil, &FieldError{Object: tableObject(table), Field: keyName, Problem: "every entry needs a " + keyName}
		}
		out = append(out, in)
	}
	return out, nil
}

// valueObjectText turns {"mark": "16", "farm": "web"} into "mark=16,farm=web".
func valueObjectText(d *doc, obj int) (string, error) {
	var b strings.Builder
	for k, end := d.children(obj); k < end; k = d.toks[k+1].next {
		text, ok := d.scalar(k + 1)
		if !ok || strings.ContainsAny(text, ",=") {
			return "", fmt.Errorf("value field %q must be a string or number", d.key(k))
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(d.key(k))
		b.WriteByte('=')
		b.WriteString(text)
	}
	return b.String(), nil
}

// AppendJSON appends the table in the given vocabulary. With entries the
// entries are listed too (all of them: callers page large tables
// themselves); used is the number of farms that use the table, now the time
// expiries count from.
func (t *Table) AppendJSON(dst []byte, vocab Vocabulary, entries bool, used int, now int64) []byte {
	str := func(key, v string) {
		dst = append(dst, '"')
		dst = append(dst, key...)
		dst = append(dst, `":`...)
		dst = appendJSONString(dst, v)
		dst = append(dst, ',')
	}
	num := func(key string, v uint64) {
		dst = append(dst, '"')
		dst = append(dst, key...)
		dst = append(dst, `":"`...)
		dst = strconv.AppendUint(dst, v, 10)
		dst = append(dst, `",`...)
	}
	dst = append(dst, '{')
	str("name", t.Name)
	if vocab == VocabPolicies {
		str("type", t.Verdict.PolicyType())
		str("family", t.Family.String())
		str("route", "in")
		num("timeout", uint64(t.Timeout))
		num("priority", uint64(t.Priority))
		str("log-prefix", t.LogPrefix)
		num("used", uint64(used))
	} else {
		str("type", t.TypeString())
		str("family", t.Family.String())
		str("valtype", t.Values.String())
		num("limit", uint64(t.Limit))
		str("locked", strconv.FormatBool(t.Locked))
		num("timeout", uint64(t.Timeout))
		str("verdict", t.Verdict.String())
		str("log-prefix", t.LogPrefix)
		num("priority", uint64(t.Priority))
		num("count", uint64(t.Len()))
	}
	if !entries {
		dst[len(dst)-1] = '}'
		return dst
	}
	if vocab == VocabPolicies {
		dst = append(dst, `"elements":[`...)
	} else {
		dst = append(dst, `"entries":[`...)
	}
	first := true
	t.entries.ascend("", func(e TableEntry) bool {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = t.AppendEntryJSON(dst, e, vocab, now)
		return true
	})
	return append(dst, "]}"...)
}

// AppendEntryJSON appends one entry as a JSON object.
func (t *Table) AppendEntryJSON(dst []byte, e TableEntry, vocab Vocabulary, now int64) []byte {
	if vocab == VocabPolicies {
		dst = append(dst, `{"data":"`...)
		dst = t.AppendKey(dst, e.Key)
		dst = append(dst, '"')
		if e.Expires != 0 {
			dst = append(dst, `,"time":"`...)
			dst = strconv.AppendInt(dst, max(e.Expires-now, 0), 10)
			dst = append(dst, '"')
		}
		return append(dst, '}')
	}
	dst = append(dst, `{"key":"`...)
	dst = t.AppendKey(dst, e.Key)
	dst = append(dst, '"')
	if t.Values != 0 {
		dst = append(dst, `,"value":{`...)
		v := e.Value
		if v == nil {
			v = &TableValue{}
		}
		first := true
		for i, name := range valueFieldNames {
			bit := ValueFields(1 << i)
			if t.Values&bit == 0 {
				continue
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			dst = append(dst, '"')
			dst = append(dst, name...)
			dst = append(dst, `":`...)
			start := len(dst)
			dst = v.appendField(append(dst, '"'), bit)
			dst = closeJSONString(dst, start)
		}
		dst = append(dst, '}')
	}
	if e.Expires != 0 {
		dst = append(dst, `,"expires":"`...)
		dst = append(dst, ExpiresText(e.Expires)...)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// AppendTablesJSON appends "tables":[...] (no braces around), for bodies
// that hold farms too; see AppendStateTables.
func AppendTablesJSON(dst []byte, tables []*Table, vocab Vocabulary, entries bool, used func(*Table) int, now int64) []byte {
	dst = append(dst, '"')
	dst = append(dst, listKey(vocab)...)
	dst = append(dst, `":[`...)
	for i, t := range tables {
		if i > 0 {
			dst = append(dst, ',')
		}
		n := 0
		if used != nil {
			n = used(t)
		}
		dst = t.AppendJSON(dst, vocab, entries, n, now)
	}
	return append(dst, ']')
}

// SplitState splits a whole-state body {"farms":[...],"tables":[...]}
// into a farms body for DecodeFarms and the tables it lists. A body
// without "tables" is returned as it is, with no tables.
func SplitState(body []byte) (farms []byte, tables []TableDecl, err error) {
	if !bytes.Contains(body, []byte(`"tables"`)) {
		return body, nil, nil
	}
	d, ok := scanDoc(body)
	defer d.release()
	if !ok || d.toks[0].kind != '{' {
		return body, nil, nil // DecodeFarms reports the error
	}
	tv := d.lastMember(0, "tables")
	if tv < 0 {
		return body, nil, nil // "tables" was a value, not a key
	}
	var fb []byte
	fb = append(fb, '{')
	for k, end := d.children(0); k < end; k = d.toks[k+1].next {
		if d.key(k) == "tables" {
			continue
		}
		if len(fb) > 1 {
			fb = append(fb, ',')
		}
		fb = append(fb, d.raw(k)...)
		fb = append(fb, ':')
		fb = append(fb, d.raw(k+1)...)
	}
	fb = append(fb, '}')
	if len(fb) == 2 {
		fb = []byte(`{"farms":[]}`)
	}
	if d.toks[tv].kind != '[' {
		return nil, nil, &FieldError{Field: "tables", Problem: "must be an array of table objects"}
	}
	none := func(string) (*Table, bool) { return nil, false }
	seen := map[string]bool{}
	for it, end := d.children(tv); it < end; it = d.toks[it].next {
		td, err := decodeTable(&d, it, none, VocabTables)
		if err != nil {
			return nil, nil, err
		}
		if seen[td.Table.Name] {
			return nil, nil, &FieldError{Field: "tables", Value: td.Table.Name, Problem: "the same table appears twice in one request"}
		}
		seen[td.Table.Name] = true
		tables = append(tables, td)
	}
	return fb, tables, nil
}

// DecodeEntries decodes a batch of entries: {"entries": [...]}
// ({"elements": [...]} in nftlb's vocabulary), or a bare array.
func DecodeEntries(body []byte, table string, vocab Vocabulary) ([]EntryInput, error) {
	d, ok := scanDoc(body)
	defer d.release()
	if !ok {
		var probe any
		return nil, fmt.Errorf("request body is not JSON: %v", json.Unmarshal(body, &probe))
	}
	field := "entries"
	if vocab == VocabPolicies {
		field = "elements"
	}
	arr := 0
	if d.toks[0].kind == '{' {
		for k, end := d.children(0); k < end; k = d.toks[k+1].next {
			if d.key(k) != field {
				return nil, fieldError(tableObject(table), d.key(k), "", fmt.Sprintf("unknown top-level field; the body is {%q: [...]}", field))
			}
		}
		if arr = d.lastMember(0, field); arr < 0 {
			return nil, &FieldError{Object: tableObject(table), Field: field, Problem: "is missing: the body is {\"" + field + "\": [...]}"}
		}
	}
	return decodeEntries(&d, arr, table, vocab)
}
