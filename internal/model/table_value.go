package model

import (
	"fmt"
	"strconv"
	"strings"
)

// TableValue is an entry's value: the fields the table's Values name (the
// others stay zero). ipfw calls these multi-field values.
type TableValue struct {
	Mark    uint32
	Farm    string
	Backend string
	Limit   uint32 // new connections per second from this key
	DSCP    uint8  // 0-63
	Tag     uint32
}

// TableEntry is one entry of a table.
type TableEntry struct {
	Key TableKey
	// Value is nil in tables without values.
	Value *TableValue
	// Expires is when the entry is removed (Unix time, seconds); 0: never.
	Expires int64
}

// ParseValue parses an entry's value as text: named fields
// ("mark=0x10,farm=web") or ipfw's positional form, the fields in the
// table's valtype order ("0x10,web"). "" is the zero value.
func (t *Table) ParseValue(s string) (*TableValue, error) {
	s = strings.TrimSpace(s)
	if t.Values == 0 {
		if s != "" {
			return nil, fmt.Errorf("the table has no values (it was created without valtype)")
		}
		return nil, nil
	}
	v := &TableValue{}
	if s == "" {
		return v, nil
	}
	parts := strings.Split(s, ",")
	named := strings.Contains(parts[0], "=")
	var order []int // positional: bit indices of the table's fields
	if !named {
		for i := range valueFieldNames {
			if t.Values&(1<<i) != 0 {
				order = append(order, i)
			}
		}
		if len(parts) > len(order) {
			return nil, fmt.Errorf("%d values given but the table's valtype is %s", len(parts), t.Values)
		}
	}
	var seen ValueFields
	for i, p := range parts {
		var field int
		text := strings.TrimSpace(p)
		if named {
			k, val, ok := strings.Cut(text, "=")
			if !ok {
				return nil, fmt.Errorf("value %q: write name=value for every field, or only values in valtype order (%s)", text, t.Values)
			}
			field = indexOf(valueFieldNames, strings.TrimSpace(k))
			if field < 0 {
				return nil, fmt.Errorf("unknown value field %q; allowed: %s", k, strings.Join(valueFieldNames, ", "))
			}
			text = strings.TrimSpace(val)
		} else {
			field = order[i]
		}
		bit := ValueFields(1 << field)
		if t.Values&bit == 0 {
			return nil, fmt.Errorf("value field %q is not in the table's valtype (%s)", valueFieldNames[field], t.Values)
		}
		if seen&bit != 0 {
			return nil, fmt.Errorf("value field %q given twice", valueFieldNames[field])
		}
		seen |= bit
		if err := v.set(bit, text); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// set parses one field of the value.
func (v *TableValue) set(bit ValueFields, text string) error {
	num := func(max uint64) (uint64, error) {
		n, err := strconv.ParseUint(text, 0, 64)
		if err != nil || n > max {
			return 0, fmt.Errorf("must be a whole number 0-%d", max)
		}
		return n, nil
	}
	var err error
	var n uint64
	switch bit {
	case ValMark:
		n, err = num(0xffffffff)
		v.Mark = uint32(n)
	case ValLimit:
		n, err = num(0xffffffff)
		v.Limit = uint32(n)
	case ValTag:
		n, err = num(0xffffffff)
		v.Tag = uint32(n)
	case ValDSCP:
		n, err = num(63)
		v.DSCP = uint8(n)
	case ValFarm, ValBackend:
		if text != "" && !ValidName(text) {
			err = fmt.Errorf("must be a name of " + nameRule)
		}
		if bit == ValFarm {
			v.Farm = strings.Clone(text)
		} else {
			v.Backend = strings.Clone(text)
		}
	}
	if err != nil {
		return fmt.Errorf("value field %q %q: %w", valueFieldNames[bitIndex(uint8(bit))], text, err)
	}
	return nil
}

func bitIndex(b uint8) int {
	for i := 0; i < 8; i++ {
		if b == 1<<i {
			return i
		}
	}
	return -1
}

// FormatValue returns a value as named fields in valtype order
// ("mark=16,farm=web"); "" for a table without values.
func (t *Table) FormatValue(v *TableValue) string { return string(t.AppendValue(nil, v)) }

// AppendValue appends FormatValue's text to dst.
func (t *Table) AppendValue(dst []byte, v *TableValue) []byte {
	if t.Values == 0 {
		return dst
	}
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
		dst = append(dst, name...)
		dst = append(dst, '=')
		dst = v.appendField(dst, bit)
	}
	return dst
}

func (v *TableValue) appendField(dst []byte, bit ValueFields) []byte {
	switch bit {
	case ValMark:
		return strconv.AppendUint(dst, uint64(v.Mark), 10)
	case ValFarm:
		return append(dst, v.Farm...)
	case ValBackend:
		return append(dst, v.Backend...)
	case ValLimit:
		return strconv.AppendUint(dst, uint64(v.Limit), 10)
	case ValDSCP:
		return strconv.AppendUint(dst, uint64(v.DSCP), 10)
	case ValTag:
		return strconv.AppendUint(dst, uint64(v.Tag), 10)
	}
	return dst
}

// equalValues compares two values, nil being the zero value.
func equalValues(a, b *TableValue) bool {
	if a == b {
		return true
	}
	var z TableValue
	if a == nil {
		a = &z
	}
	if b == nil {
		b = &z
	}
	return *a == *b
}

// SameEntry reports whether two entries are equal in key, value and expiry.
func SameEntry(a, b TableEntry) bool {
	return a.Key == b.Key && a.Expires == b.Expires && equalValues(a.Value, b.Value)
}
